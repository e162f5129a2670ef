"""The HTTP server with a web configuration (agent/serve/server.py,
agent/serve/web_config.py) over real loopback sockets: HTTPS with basic auth, client
certificates, the real curl, the header deadline over an unfinished TLS handshake, and what
bcrypt costs a scraper. Certificates are made in tmp_path (tests/support/tls.py)."""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import gpuscope.agent.serve.web_config as web_config
from gpuscope.agent.serve.server import MetricsServer
from gpuscope.agent.serve.web_config import load_web_config
from tests.support import wait_for
from tests.support.tls import (
    CLIENT_SAN,
    Pki,
    bcrypt_hash,
    count_bcrypt_checks,
    make_pki,
    write_web_config,
)

BODY = b"# HELP demo_total A demo.\n# TYPE demo_total counter\ndemo_total 1\n"
USER, PASSWORD = "prometheus", "correct horse"
CURL = shutil.which("curl")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., MetricsServer]]:
    """`serve(web_config_dict, **limits)`: a started server on 127.0.0.1, stopped after."""
    servers: list[MetricsServer] = []

    def start(config: dict[str, Any], **limits: Any) -> MetricsServer:
        web = load_web_config(write_web_config(tmp_path / f"web{len(servers)}.yml", config))
        server = MetricsServer(
            ("127.0.0.1", 0), CollectorRegistry(), lambda: BODY, lambda: True, web=web, **limits
        )
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def tls_config(pki: Pki, **extra: Any) -> dict[str, Any]:
    section = {"cert_file": str(pki.server), "key_file": str(pki.server_key), **extra}
    return {"tls_server_config": section}


def with_users(config: dict[str, Any], cost: int = 4) -> dict[str, Any]:
    return {**config, "basic_auth_users": {USER: bcrypt_hash(PASSWORD, cost)}}


def client_context(pki: Pki, cert: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(
            str(pki.folder / f"{cert}.pem"), str(pki.folder / f"{cert}-key.pem")
        )
    return context


def get(
    server: MetricsServer,
    context: ssl.SSLContext | None,
    path: str = "/metrics",
    auth: tuple[str, str] | None = None,
) -> http.client.HTTPResponse:
    headers = {}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    if context is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection(
            "127.0.0.1", server.port, timeout=10
        )
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10, context=context)
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def curl(server: MetricsServer, pki: Pki, *args: str) -> subprocess.CompletedProcess[str]:
    assert CURL is not None
    return subprocess.run(
        [
            CURL,
            "--silent",
            "--show-error",
            "--max-time",
            "10",
            "--cacert",
            str(pki.ca),
            "--write-out",
            "\n%{http_code}",
            *args,
            f"https://127.0.0.1:{server.port}/metrics",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


# --- HTTPS and basic auth --------------------------------------------------------------------


def test_https_with_basic_auth_serves_the_right_credentials_only(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    server = serve(with_users(tls_config(pki)))
    context = client_context(pki)
    assert server.scheme == "https"
    good = get(server, context, auth=(USER, PASSWORD))
    assert good.status == 200
    for auth in (None, (USER, "wrong"), ("stranger", PASSWORD)):
        refused = get(server, context, auth=auth)
        assert refused.status == 401, auth
        assert refused.getheader("WWW-Authenticate") == "Basic"
    assert server.stats().unauthorized == 3


def test_the_probes_answer_without_credentials(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    server = serve(with_users(tls_config(pki)))
    context = client_context(pki)
    assert get(server, context, "/healthz").status == 200
    assert get(server, context, "/readyz").status == 200
    assert get(server, context, "/").status == 401  # everything else is protected


def test_basic_auth_over_plain_http(serve: Callable[..., MetricsServer]) -> None:
    server = serve(with_users({}))
    assert server.scheme == "http"
    assert get(server, None).status == 401
    assert get(server, None, auth=(USER, PASSWORD)).status == 200


def test_configured_headers_are_on_every_answer(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    headers = {"X-Content-Type-Options": "nosniff", "Strict-Transport-Security": "max-age=60"}
    config = with_users({**tls_config(pki), "http_server_config": {"headers": headers}})
    server = serve(config)
    context = client_context(pki)
    for response in (
        get(server, context, auth=(USER, PASSWORD)),
        get(server, context),  # the 401 too
        get(server, context, "/healthz"),
    ):
        assert response.getheader("X-Content-Type-Options") == "nosniff"
        assert response.getheader("Strict-Transport-Security") == "max-age=60"


def test_a_scraper_pays_bcrypt_once_not_on_every_scrape(
    serve: Callable[..., MetricsServer], pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_bcrypt_checks(monkeypatch)
    server = serve(with_users(tls_config(pki), cost=10))  # htpasswd's usual cost: ~100 ms
    context = client_context(pki)
    for _ in range(20):
        assert get(server, context, auth=(USER, PASSWORD)).status == 200
    assert calls == [PASSWORD.encode()]
    # A wrong password is never remembered: each try pays bcrypt again.
    for _ in range(2):
        assert get(server, context, auth=(USER, "guess")).status == 401
    assert len(calls) == 3


def test_keep_alive_and_pipelined_requests_through_tls_and_auth(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    server = serve(with_users(tls_config(pki)))
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\r\n\r\n".encode()
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    with client_context(pki).wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(request * 3)
        answer = b""
        while answer.count(b"demo_total 1") < 3:
            chunk = tls.recv(65536)
            assert chunk, f"closed after {answer.count(b'HTTP/1.1 200')} answers"
            answer += chunk
    assert answer.count(b"HTTP/1.1 200 OK") == 3


def test_rate_limit_answers_429_but_not_to_the_probes(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    server = serve({**tls_config(pki), "rate_limit": {"interval": "1h", "burst": 2}})
    context = client_context(pki)
    assert [get(server, context).status for _ in range(3)] == [200, 200, 429]
    assert get(server, context, "/healthz").status == 200
    assert server.stats().rate_limited == 1


# --- curl ---------------------------------------------------------------------------------


@pytest.mark.skipif(CURL is None, reason="curl is not installed")
def test_curl_is_refused_without_credentials_and_served_with_them(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    server = serve(with_users(tls_config(pki)))
    without = curl(server, pki, "--fail")
    assert without.returncode == 22, without  # curl's "HTTP error" exit
    assert without.stdout.endswith("401")
    with_credentials = curl(server, pki, "--user", f"{USER}:{PASSWORD}")
    assert with_credentials.returncode == 0, with_credentials
    assert with_credentials.stdout.endswith("200")
    assert "demo_total 1" in with_credentials.stdout


@pytest.mark.skipif(CURL is None, reason="curl is not installed")
def test_curl_needs_a_client_certificate_when_one_is_required(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    config = tls_config(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca)
    )
    server = serve(config)
    without = curl(server, pki)
    assert without.returncode != 0, without
    assert not without.stdout.endswith("200")
    with_cert = curl(server, pki, "--cert", str(pki.client), "--key", str(pki.client_key))
    assert with_cert.returncode == 0, with_cert
    assert with_cert.stdout.endswith("200")


# --- client certificates -----------------------------------------------------------------------


def refused_by_tls(server: MetricsServer, context: ssl.SSLContext) -> bool:
    """True when the server ends the TLS session instead of answering. With TLS 1.3 the
    client learns that its certificate was refused on its first read, not in the handshake."""
    try:
        response = get(server, context)
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected):
        return True
    return response.status == 0


def test_require_and_verify_refuses_a_client_without_a_good_certificate(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    config = tls_config(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca)
    )
    server = serve(config)
    assert refused_by_tls(server, client_context(pki))  # no certificate
    assert refused_by_tls(server, client_context(pki, "stranger"))  # not signed by the CA
    assert get(server, client_context(pki, "client")).status == 200
    wait_for(lambda: server.stats().tls_errors == 2, 10, "two failed handshakes counted")
    wait_for(lambda: server.stats().open_connections == 0, 10, "the refused sockets closed")


def test_verify_if_given_admits_no_certificate_but_not_a_bad_one(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    config = tls_config(pki, client_auth_type="VerifyClientCertIfGiven", client_ca_file=str(pki.ca))
    server = serve(config)
    assert get(server, client_context(pki)).status == 200
    assert get(server, client_context(pki, "client")).status == 200
    assert refused_by_tls(server, client_context(pki, "stranger"))


def test_client_allowed_sans(serve: Callable[..., MetricsServer], pki: Pki) -> None:
    base = {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca)}
    allowed = serve(tls_config(pki, **base, client_allowed_sans=[CLIENT_SAN]))
    assert get(allowed, client_context(pki, "client")).status == 200
    other = serve(tls_config(pki, **base, client_allowed_sans=["someone.else"]))
    assert refused_by_tls(other, client_context(pki, "client"))
    wait_for(lambda: other.stats().tls_errors == 1, 10, "the SAN refusal counted")


def test_min_version_tls13_refuses_a_tls12_client(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    server = serve(tls_config(pki, min_version="TLS13"))
    old = client_context(pki)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(ssl.SSLError):
        get(server, old)
    assert get(server, client_context(pki)).status == 200


OPENSSL = shutil.which("openssl")
# exporter-toolkit's curve names (web/tls_config.go) as `openssl s_client -groups` takes
# them, and as it reports the group agreed on ("Server Temp Key: ECDH, <name>, ...").
GROUPS = {
    "CurveP256": ("P-256", "prime256v1"),
    "CurveP384": ("P-384", "secp384r1"),
    "CurveP521": ("P-521", "secp521r1"),
    "X25519": ("X25519", "X25519"),
}


def negotiated_group(server: MetricsServer, version: str, groups: list[str]) -> str | None:
    """The key-exchange group of a real handshake by `openssl s_client` offering `groups`
    (its first is the key share it sends), None when the server refuses them all."""
    assert OPENSSL is not None
    done = subprocess.run(
        [OPENSSL, "s_client", "-connect", f"127.0.0.1:{server.port}", version,
         "-groups", ":".join(groups), "-servername", "localhost"],
        input="",
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )  # fmt: skip
    found = re.search(r"(?:Server|Peer) Temp Key: (?:ECDH, )?(\w+)", done.stdout)
    if done.returncode != 0 or found is None:
        # The server ends the handshake (an alert, or a close): no certificate was sent.
        assert "no peer certificate available" in done.stdout, (done.stdout, done.stderr)
        return None
    return found.group(1)


@pytest.mark.skipif(OPENSSL is None, reason="openssl is not installed")
@pytest.mark.parametrize("curve", ["CurveP256", "CurveP384", "CurveP521", None])
@pytest.mark.parametrize("version", ["-tls1_3", "-tls1_2"])
def test_a_curve_preference_is_the_group_every_handshake_agrees_on(
    serve: Callable[..., MetricsServer], pki: Pki, curve: str | None, version: str
) -> None:
    """A served `curve_preferences` entry is the group agreed on with a client offering
    all four (X25519 first, as clients do), in TLS 1.3 (by a retry when the client's key
    share is another group) and in TLS 1.2; a client offering only the other three is
    refused. Without curve_preferences the default groups agree on X25519 first, as the
    refusal of `[X25519]` tells the user."""
    extra = {} if curve is None else {"curve_preferences": [curve]}
    server = serve(tls_config(pki, **extra))
    everything = [GROUPS[c][0] for c in ("X25519", "CurveP256", "CurveP384", "CurveP521")]
    expected = GROUPS[curve or "X25519"][1]
    assert negotiated_group(server, version, everything) == expected
    if curve is not None and version == "-tls1_3":
        # TLS 1.2 checks the ECDSA P-256 certificate's own curve against the client's list,
        # so only TLS 1.3 can offer just the other groups.
        others = [GROUPS[c][0] for c in GROUPS if c != curve]
        assert negotiated_group(server, version, others) is None
        assert negotiated_group(server, version, [GROUPS[curve][0]]) == expected


# --- deadlines and limits over TLS ---------------------------------------------------------------


def test_a_handshake_that_never_completes_is_cut_by_the_header_deadline(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    server = serve(tls_config(pki), header_timeout=0.5)
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    partial = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    partial.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's start
    try:
        wait_for(lambda: server.stats().open_connections == 2, 10, "both admitted")
        for sock in (silent, partial):
            assert sock.recv(1) == b""  # closed by the server, not by this timeout
        assert server.stats().header_timeouts == 2
        wait_for(lambda: server.stats().open_connections == 0, 10, "both forgotten")
        assert get(server, client_context(pki)).status == 200
    finally:
        silent.close()
        partial.close()


def test_unfinished_handshakes_count_against_the_connection_cap(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    server = serve(tls_config(pki), max_connections=3)
    stalled = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(3)]
    try:
        wait_for(lambda: server.stats().open_connections == 3, 10, "the cap filled")
        assert get(server, client_context(pki)).status == 200  # room made for a real client
        assert server.stats().evicted >= 1
    finally:
        for sock in stalled:
            sock.close()


def test_clients_that_leave_mid_handshake_are_forgotten(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    server = serve(tls_config(pki))
    hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
    for how in ("close", "half-close", "reset"):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(hello)
        wait_for(lambda: server.stats().open_connections == 1, 10, "the client admitted")
        if how == "half-close":
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(1) == b""
        elif how == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        wait_for(lambda: server.stats().open_connections == 0, 10, f"a {how} forgotten")
    assert server.stats().tls_errors == 3
    assert get(server, client_context(pki)).status == 200


def test_plain_http_to_the_tls_port_is_closed_and_counted(
    serve: Callable[..., MetricsServer], pki: Pki
) -> None:
    server = serve(tls_config(pki))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as plain:
        plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while chunk := plain.recv(4096):
            received += chunk
    assert b"demo_total" not in received
    wait_for(lambda: server.stats().tls_errors == 1, 10, "the failed handshake counted")
    assert get(server, client_context(pki)).status == 200


# --- a renewed certificate, a changed file ------------------------------------------------------


def served_certificate(server: MetricsServer, context: ssl.SSLContext) -> bytes:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    with context.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_a_renewed_certificate_is_served_without_a_restart_and_a_broken_one_is_not(
    serve: Callable[..., MetricsServer],
    pki: Pki,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    renewed = make_pki(tmp_path / "renewed")
    live = tmp_path / "live"  # what a mounted Secret would hold
    live.mkdir()
    shutil.copy(pki.server, live / "tls.crt")
    shutil.copy(pki.server_key, live / "tls.key")
    pair = {"cert_file": str(live / "tls.crt"), "key_file": str(live / "tls.key")}
    server = serve({"tls_server_config": pair}, web_reload_interval=0.1)
    context = client_context(pki)
    context.load_verify_locations(cafile=str(renewed.ca))
    assert served_certificate(server, context) == der(pki.server)

    # A key that does not match the certificate: the previous pair stays in service.
    shutil.copy(renewed.server, live / "tls.crt")
    wait_for(lambda: "cannot be used" in caplog.text, 10, "the broken pair reported")
    assert served_certificate(server, context) == der(pki.server)
    assert caplog.text.count("cannot be used") == 1

    shutil.copy(renewed.server_key, live / "tls.key")  # the renewal completes
    wait_for(
        lambda: served_certificate(server, context) == der(renewed.server),
        10,
        "the renewed certificate served",
    )
    assert get(server, context).status == 200


def test_a_user_added_to_the_file_can_log_in_without_a_restart(
    serve: Callable[..., MetricsServer], pki: Pki, tmp_path: Path
) -> None:
    server = serve(with_users(tls_config(pki)), web_reload_interval=0.1)
    context = client_context(pki)
    assert get(server, context, auth=("grafana", "pw")).status == 401
    config = with_users(tls_config(pki))
    config["basic_auth_users"]["grafana"] = bcrypt_hash("pw")
    write_web_config(tmp_path / "web0.yml", config)  # the file serve() wrote
    wait_for(
        lambda: get(server, context, auth=("grafana", "pw")).status == 200,
        10,
        "the new user let in",
    )
    assert get(server, context, auth=(USER, PASSWORD)).status == 200


def test_a_reload_keeps_logins_under_unchanged_hashes_and_rechecks_a_changed_one(
    serve: Callable[..., MetricsServer], pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reload once forgot every login, sending every scraper back to bcrypt (and, under a
    wrong-password flood, to a 503) at each certificate renewal."""
    calls = count_bcrypt_checks(monkeypatch)
    config = with_users(tls_config(pki))
    server = serve(config, web_reload_interval=0.1)
    context = client_context(pki)
    assert get(server, context, auth=(USER, PASSWORD)).status == 200
    assert calls == [PASSWORD.encode()]

    headers = {"headers": {"X-Frame-Options": "deny"}}
    write_web_config(tmp_path / "web0.yml", {**config, "http_server_config": headers})
    wait_for(
        lambda: get(server, context, "/healthz").getheader("X-Frame-Options") == "deny",
        10,
        "the new header served",
    )
    assert get(server, context, auth=(USER, PASSWORD)).status == 200
    assert calls == [PASSWORD.encode()]  # no bcrypt: the hash is the one it passed under

    changed = {**config, "basic_auth_users": {USER: bcrypt_hash("new password")}}
    write_web_config(tmp_path / "web0.yml", changed)
    wait_for(
        lambda: get(server, context, auth=(USER, "new password")).status == 200,
        10,
        "the new password accepted",
    )
    assert get(server, context, auth=(USER, PASSWORD)).status == 401  # checked, and refused


def test_one_address_cannot_queue_more_than_a_few_credential_checks(
    serve: Callable[..., MetricsServer], pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight wrong passwords at once from one address, while bcrypt is busy: four wait for
    it, the other three are answered 503 with Retry-After at once."""
    gate = threading.Event()
    real = web_config._checkpw

    def slow(password: bytes, hashed: bytes) -> bool:
        gate.wait(10)  # the first check holds bcrypt until every request has arrived
        return real(password, hashed)

    monkeypatch.setattr(web_config, "_checkpw", slow)
    server = serve(with_users(tls_config(pki)))
    context = client_context(pki)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(get, server, context, auth=(USER, "guess")) for _ in range(8)]
        wait_for(lambda: server.stats().auth_busy >= 3, 10, "three requests refused")
        gate.set()
        answers = [future.result() for future in futures]
    statuses = sorted(answer.status for answer in answers)
    # One in progress (if the worker took it before the rest arrived) and four waiting.
    assert statuses in ([401] * 5 + [503] * 3, [401] * 4 + [503] * 4), statuses
    busy = [answer for answer in answers if answer.status == 503]
    assert all(answer.getheader("Retry-After") == "1" for answer in busy)
    assert server.stats().unauthorized == statuses.count(401)


def test_turning_tls_off_needs_a_restart(
    serve: Callable[..., MetricsServer],
    pki: Pki,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = serve(tls_config(pki), web_reload_interval=0.1)
    write_web_config(tmp_path / "web0.yml", {})
    wait_for(lambda: "turning TLS off needs a restart" in caplog.text, 10, "the refusal")
    assert get(server, client_context(pki)).status == 200


@pytest.mark.parametrize("swapped", ["web config", "certificate"])
def test_a_fifo_swapped_in_is_reported_and_never_wedges_the_reloader(
    serve: Callable[..., MetricsServer],
    pki: Pki,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    swapped: str,
) -> None:
    """A FIFO at the --web-config-file path or a certificate's once blocked the reloader in
    open() for ever: no log line, no renewal after it, and a shutdown that waited for it.
    Now it is one line, the previous configuration keeps serving, a good file put back is
    picked up, and stop is prompt."""
    renewed = make_pki(tmp_path / "renewed")
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(pki.server, live / "tls.crt")
    shutil.copy(pki.server_key, live / "tls.key")
    pair = {"cert_file": str(live / "tls.crt"), "key_file": str(live / "tls.key")}
    server = serve({"tls_server_config": pair}, web_reload_interval=0.1)
    context = client_context(pki)
    context.load_verify_locations(cafile=str(renewed.ca))
    fifo = tmp_path / "web0.yml" if swapped == "web config" else live / "tls.crt"

    fifo.unlink()
    os.mkfifo(fifo)
    wait_for(lambda: "not a regular file" in caplog.text, 10, "the FIFO reported")
    reported = [r for r in caplog.records if "not a regular file" in r.getMessage()]
    assert len(reported) == 1 and "\n" not in reported[0].getMessage(), reported
    assert str(fifo) in reported[0].getMessage()
    assert served_certificate(server, context) == der(pki.server)

    fifo.unlink()
    shutil.copy(renewed.server_key, live / "tls.key")
    shutil.copy(renewed.server, live / "tls.crt")
    write_web_config(tmp_path / "web0.yml", {"tls_server_config": pair})
    wait_for(
        lambda: served_certificate(server, context) == der(renewed.server),
        10,
        "the good file after the FIFO served",
    )
    began = time.monotonic()
    server.stop()
    assert time.monotonic() - began < 2.0  # nothing blocked: not the 5 s join of a wedged thread

"""`--web-config-file` (agent/serve/web_config.py): every key of exporter-toolkit's format that
gpuscope reads, and every way a file is refused, with the one line a user sees. The server
side (TLS, 401s, headers) is in tests/integration/test_server_tls.py."""

from __future__ import annotations

import os
import ssl
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from gpuscope.agent.app.config import parse
from gpuscope.agent.runtime.options import ConfigError
from gpuscope.agent.serve.web_config import (
    BasicAuth,
    WebConfig,
    load_web_config,
    parse_basic_authorization,
)
from tests.support.tls import (
    Pki,
    bcrypt_hash,
    count_bcrypt_checks,
    make_pki,
    write_web_config,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def load(tmp_path: Path, config: dict[str, Any]) -> WebConfig:
    return load_web_config(write_web_config(tmp_path / "web.yml", config))


def refused(tmp_path: Path, config: dict[str, Any] | str) -> str:
    path = tmp_path / "web.yml"
    if isinstance(config, str):
        path.write_text(config)
    else:
        write_web_config(path, config)
    with pytest.raises(ConfigError) as caught:
        load_web_config(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def tls(pki: Pki) -> dict[str, Any]:
    return {"tls_server_config": {"cert_file": str(pki.server), "key_file": str(pki.server_key)}}


def with_tls(pki: Pki, **extra: Any) -> dict[str, Any]:
    config = tls(pki)
    config["tls_server_config"].update(extra)
    return config


# --- what a good file turns on --------------------------------------------------------------


def test_an_empty_file_is_plain_http_without_auth(tmp_path: Path) -> None:
    (tmp_path / "web.yml").write_text("")
    web = load_web_config(tmp_path / "web.yml")
    assert (web.tls, web.users, web.headers, web.rate_limit) == (None, {}, (), None)
    assert web.summary() == "plain HTTP, no basic auth"


def test_tls_keys_without_a_certificate_leave_tls_off_as_exporter_toolkit(
    tmp_path: Path,
) -> None:
    web = load(tmp_path, {"tls_server_config": {"min_version": "TLS13"}})
    assert web.tls is None


def test_cert_and_key_files_make_a_tls_server_context(tmp_path: Path, pki: Pki) -> None:
    web = load(tmp_path, tls(pki))
    assert isinstance(web.tls, ssl.SSLContext)
    assert web.tls.verify_mode is ssl.CERT_NONE
    assert web.tls.minimum_version is ssl.TLSVersion.TLSv1_2
    assert web.tls.maximum_version is ssl.TLSVersion.TLSv1_3
    assert web.summary() == "TLS (NoClientCert), no basic auth"


def test_relative_paths_are_relative_to_the_files_folder(tmp_path: Path, pki: Pki) -> None:
    config = {"tls_server_config": {"cert_file": "server.pem", "key_file": "server-key.pem"}}
    web = load_web_config(write_web_config(pki.folder / "web.yml", config))
    assert web.tls is not None


def test_inline_cert_and_key(tmp_path: Path, pki: Pki) -> None:
    config = {
        "tls_server_config": {
            "cert": pki.server.read_text(),
            "key": pki.server_key.read_text(),
            "client_ca": pki.ca.read_text(),
            "client_auth_type": "RequireAndVerifyClientCert",
        }
    }
    web = load(tmp_path, config)
    assert web.tls is not None and web.tls.verify_mode is ssl.CERT_REQUIRED


@pytest.mark.parametrize(
    ("client_auth_type", "mode"),
    [
        ("NoClientCert", ssl.CERT_NONE),
        ("RequestClientCert", ssl.CERT_NONE),
        ("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
        ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED),
    ],
)
def test_client_auth_types(
    tmp_path: Path, pki: Pki, client_auth_type: str, mode: ssl.VerifyMode
) -> None:
    extra: dict[str, Any] = {"client_auth_type": client_auth_type}
    if mode is not ssl.CERT_NONE:
        extra["client_ca_file"] = str(pki.ca)
    web = load(tmp_path, with_tls(pki, **extra))
    assert web.tls is not None and web.tls.verify_mode is mode


def test_tls_versions(tmp_path: Path, pki: Pki) -> None:
    web = load(tmp_path, with_tls(pki, min_version="TLS13", max_version="TLS13"))
    assert web.tls is not None
    assert web.tls.minimum_version is ssl.TLSVersion.TLSv1_3


def test_cipher_suites_take_gos_names(tmp_path: Path, pki: Pki) -> None:
    suites = ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"]
    web = load(tmp_path, with_tls(pki, cipher_suites=suites, prefer_server_cipher_suites=False))
    assert web.tls is not None
    tls12 = [c["name"] for c in web.tls.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 == ["ECDHE-ECDSA-AES128-GCM-SHA256"]
    assert not web.tls.options & ssl.OP_CIPHER_SERVER_PREFERENCE


def test_one_curve_preference(tmp_path: Path, pki: Pki) -> None:
    assert load(tmp_path, with_tls(pki, curve_preferences=["CurveP256"])).tls is not None


def handshake(server: ssl.SSLContext, client_curve: str | None) -> bool:
    """A TLS handshake in memory between `server` and a client offering only
    `client_curve` (None: the client's default groups); True if it completes."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    if client_curve is not None:
        client.set_ecdh_curve(client_curve)
    bios = [ssl.MemoryBIO() for _ in range(4)]
    s = server.wrap_bio(bios[0], bios[1], server_side=True)
    c = client.wrap_bio(bios[2], bios[3], server_hostname="localhost")
    done = {"s": False, "c": False}
    for _ in range(20):
        for name, end in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError:
                    return False
        if bios[3].pending:
            bios[0].write(bios[3].read())
        if bios[1].pending:
            bios[2].write(bios[1].read())
        if all(done.values()):
            return True
    return False


# Every curve name exporter-toolkit's curve_preferences takes (web/tls_config.go), and
# OpenSSL's name for it.
EXPORTER_TOOLKIT_CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}


@pytest.mark.parametrize("curve", [c for c in EXPORTER_TOOLKIT_CURVES if c != "X25519"])
def test_a_nist_curve_preference_is_the_only_group_the_server_agrees_to(
    tmp_path: Path, pki: Pki, curve: str
) -> None:
    web = load(tmp_path, with_tls(pki, curve_preferences=[curve]))
    assert web.tls is not None
    assert handshake(web.tls, EXPORTER_TOOLKIT_CURVES[curve])
    others = [n for c, n in EXPORTER_TOOLKIT_CURVES.items() if c not in (curve, "X25519")]
    for other in others:
        assert not handshake(web.tls, other), (curve, other)


def test_x25519_alone_is_refused_with_a_line_that_says_what_to_do(tmp_path: Path, pki: Pki) -> None:
    """Python 3.11's ssl cannot make X25519 the only group; the agent says so at start
    (exit 2) rather than crash on an uncaught SSLError, and the default it points to does
    agree on X25519."""
    message = refused(tmp_path, with_tls(pki, curve_preferences=["X25519"]))
    assert "curve_preferences: X25519 cannot be set alone" in message
    assert "remove curve_preferences" in message
    default = load(tmp_path, tls(pki)).tls
    assert default is not None and handshake(default, None)


def test_an_ssl_error_from_any_step_of_the_tls_setup_is_one_line(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step this OpenSSL build refuses (here ALPN, refused as a build without it would)
    is a ConfigError naming the section: exit 2 at start, the old file kept on reload,
    never an uncaught SSLError as X25519 once was."""

    def refuse(self: ssl.SSLContext, protocols: list[str]) -> None:
        raise ssl.SSLError(1, "[SSL: UNSUPPORTED_PROTOCOL] unsupported protocol")

    monkeypatch.setattr(ssl.SSLContext, "set_alpn_protocols", refuse)
    message = refused(tmp_path, tls(pki))
    assert message.startswith(f"{tmp_path / 'web.yml'}: tls_server_config: "), message
    assert "unsupported protocol" in message


def test_x25519mlkem768_is_an_unknown_curve_as_in_exporter_toolkit(
    tmp_path: Path, pki: Pki
) -> None:
    """exporter-toolkit's curve list (web/tls_config.go) has no hybrid post-quantum group;
    its name is refused as Go refuses it, not taken for the default groups."""
    message = refused(tmp_path, with_tls(pki, curve_preferences=["X25519MLKEM768"]))
    assert "unknown curve 'X25519MLKEM768'" in message
    assert "(expected CurveP256, CurveP384, CurveP521, X25519)" in message


def test_a_fifo_or_a_folder_at_a_path_is_refused_at_once(tmp_path: Path, pki: Pki) -> None:
    """A FIFO would block open() for ever (the start, or the reloader and every
    certificate renewal after it); a folder is no file either."""
    os.mkfifo(tmp_path / "web.yml")
    with pytest.raises(ConfigError, match=r"cannot read .*web\.yml: not a regular file"):
        load_web_config(tmp_path / "web.yml")
    os.mkfifo(tmp_path / "cert.pem")
    (tmp_path / "ca.pem").mkdir()
    conf = tmp_path / "sub"
    conf.mkdir()
    for key in ("cert_file", "key_file"):
        message = refused(conf, with_tls(pki, **{key: str(tmp_path / "cert.pem")}))
        assert f"{key}: cannot read {tmp_path / 'cert.pem'}: not a regular file" in message
    config = with_tls(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(tmp_path / "ca.pem")
    )
    assert "client_ca_file: no CA certificate loaded" in refused(conf, config)
    assert "not a regular file" in refused(conf, config)


def test_client_allowed_sans_match_dns_and_ip(tmp_path: Path, pki: Pki) -> None:
    config = with_tls(
        pki,
        client_auth_type="RequireAndVerifyClientCert",
        client_ca_file=str(pki.ca),
        client_allowed_sans=["scraper.example", "::1"],
    )
    web = load(tmp_path, config)
    assert web.san_allowed({"subjectAltName": (("DNS", "scraper.example"),)})
    assert web.san_allowed({"subjectAltName": (("IP Address", "0:0:0:0:0:0:0:1"),)})
    assert not web.san_allowed({"subjectAltName": (("DNS", "other.example"),)})
    assert not web.san_allowed(None)


def test_headers_users_http2_and_rate_limit(tmp_path: Path) -> None:
    hashed = bcrypt_hash("s3cret")
    config = {
        "http_server_config": {
            "http2": False,
            "headers": {
                "X-Content-Type-Options": "nosniff",
                "X-Frame-Options": "deny",
                "Strict-Transport-Security": "max-age=31536000",
                "Content-Security-Policy": "",
            },
        },
        "basic_auth_users": {"prometheus": hashed},
        "rate_limit": {"interval": "250ms", "burst": 5},
    }
    web = load(tmp_path, config)
    assert web.headers == (
        ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "deny"),
        ("Strict-Transport-Security", "max-age=31536000"),
    )
    assert web.http2 is False
    assert web.users == {"prometheus": hashed.encode()}
    assert web.rate_limit is not None
    assert (web.rate_limit.interval, web.rate_limit.burst) == (0.25, 5)
    assert web.summary() == "plain HTTP, basic auth (1 user), rate limit 5/0.25 s"


@pytest.mark.parametrize(("text", "seconds"), [("1m30s", 90.0), ("1.5h", 5400.0), ("0", 0.0)])
def test_rate_limit_intervals_are_go_durations(tmp_path: Path, text: str, seconds: float) -> None:
    web = load(tmp_path, {"rate_limit": {"interval": text, "burst": 1}})
    assert (web.rate_limit.interval if web.rate_limit else 0.0) == seconds


def test_htpasswd_2y_hashes_are_accepted(tmp_path: Path) -> None:
    hashed = "$2y$" + bcrypt_hash("pw")[4:]
    assert load(tmp_path, {"basic_auth_users": {"u": hashed}}).users == {"u": hashed.encode()}


def test_the_flag_and_its_variable_load_the_file(tmp_path: Path) -> None:
    path = write_web_config(tmp_path / "web.yml", {"basic_auth_users": {"u": bcrypt_hash("x")}})
    from_flag = parse(["--web-config-file", str(path)], env={}).agent.web_config_file
    from_env = parse([], env={"GPUSCOPE_WEB_CONFIG_FILE": str(path)}).agent.web_config_file
    assert from_flag is not None and from_env is not None
    assert from_flag.users == from_env.users
    assert parse([], env={}).agent.web_config_file is None


def test_a_bad_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--web-config-file: cannot read .*missing\.yml"):
        parse(["--web-config-file", str(tmp_path / "missing.yml")], env={})


# --- every way a file is refused -------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file or directory"):
        load_web_config(tmp_path / "nope.yml")


def test_unparsable_yaml(tmp_path: Path) -> None:
    assert "not valid YAML" in refused(tmp_path, "tls_server_config: [unclosed\n")


def test_a_key_given_twice(tmp_path: Path) -> None:
    text = "basic_auth_users:\n  a: x\n  a: y\n"
    assert "key 'a' is given twice" in refused(tmp_path, text)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"tls_config": {}}, "unknown key 'tls_config' (known: tls_server_config"),
        (
            {"tls_server_config": {"certfile": "x"}},
            "unknown key 'certfile' in tls_server_config",
        ),
        ({"http_server_config": {"http3": True}}, "unknown key 'http3' in http_server_config"),
        ({"rate_limit": {"every": "1s"}}, "unknown key 'every' in rate_limit"),
        ({"auth_excluded_paths": ["/metrics"]}, "unknown key 'auth_excluded_paths'"),
        ("- a list\n", "the file: expected a mapping"),
        ({"basic_auth_users": ["u"]}, "basic_auth_users: expected a mapping"),
    ],
)
def test_unknown_keys_and_wrong_shapes(
    tmp_path: Path, config: dict[str, Any] | str, message: str
) -> None:
    assert message in refused(tmp_path, config)


def test_cert_without_key_and_key_without_cert(tmp_path: Path, pki: Pki) -> None:
    no_key = {"tls_server_config": {"cert_file": str(pki.server)}}
    assert "missing one of key or key_file" in refused(tmp_path, no_key)
    no_cert = {"tls_server_config": {"key_file": str(pki.server_key)}}
    assert "missing one of cert or cert_file" in refused(tmp_path, no_cert)


def test_unreadable_cert_and_key_files(tmp_path: Path, pki: Pki) -> None:
    config = {"tls_server_config": {"cert_file": "gone.pem", "key_file": str(pki.server_key)}}
    message = refused(tmp_path, config)
    assert "tls_server_config.cert_file: cannot read" in message
    assert "gone.pem: No such file or directory" in message
    config = {"tls_server_config": {"cert_file": str(pki.server), "key_file": "gone.pem"}}
    assert "tls_server_config.key_file: cannot read" in refused(tmp_path, config)


def test_a_cert_that_is_not_pem_and_a_key_that_does_not_match(tmp_path: Path, pki: Pki) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    junk = {"tls_server_config": {"cert_file": "junk.pem", "key_file": str(pki.server_key)}}
    assert "are not a PEM certificate and its key" in refused(tmp_path, junk)
    mismatch = {"tls_server_config": {"cert_file": str(pki.server), "key_file": str(pki.ca_key)}}
    assert "key values mismatch" in refused(tmp_path, mismatch)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"client_auth_type": "Maybe"}, "client_auth_type: unknown 'Maybe'"),
        ({"client_auth_type": "RequireAnyClientCert"}, "RequireAnyClientCert is not supported"),
        ({"client_auth_type": "RequireClientCert"}, "RequireClientCert is not supported"),
        (
            {"client_auth_type": "RequireAndVerifyClientCert"},
            "RequireAndVerifyClientCert needs client_ca_file or client_ca",
        ),
        ({"client_ca_file": "/x"}, "client CA given without a client_auth_type that verifies"),
        (
            {"client_auth_type": "VerifyClientCertIfGiven", "client_ca_file": "/no/ca.pem"},
            "client_ca_file: no CA certificate loaded",
        ),
        (
            {"client_allowed_sans": ["a"]},
            "client_allowed_sans needs client_auth_type RequireAndVerifyClientCert",
        ),
        ({"min_version": "TLS14"}, "min_version: unknown TLS version 'TLS14'"),
        ({"max_version": "SSL3"}, "max_version: unknown TLS version 'SSL3'"),
        (
            {"min_version": "TLS13", "max_version": "TLS12"},
            "min_version is above max_version",
        ),
        ({"cipher_suites": ["TLS_RSA_WITH_RC4_128_SHA"]}, "unknown cipher 'TLS_RSA_WITH_RC4"),
        ({"cipher_suites": "TLS_AES_128_GCM_SHA256"}, "cipher_suites: expected a list"),
        ({"curve_preferences": ["CurveP999"]}, "unknown curve 'CurveP999'"),
        ({"curve_preferences": ["X25519", "CurveP256"]}, "can use only one curve"),
        ({"curve_preferences": ["X25519"]}, "X25519 cannot be set alone"),
        ({"prefer_server_cipher_suites": "yes"}, "expected true or false"),
        ({"client_auth_type": 1}, "client_auth_type: expected a string"),
    ],
)
def test_bad_tls_settings(tmp_path: Path, pki: Pki, extra: dict[str, Any], message: str) -> None:
    assert message in refused(tmp_path, with_tls(pki, **extra))


def test_a_client_ca_file_without_certificates(tmp_path: Path, pki: Pki) -> None:
    (tmp_path / "empty-ca.pem").write_text("# no certificates here\n")
    config = with_tls(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file="empty-ca.pem"
    )
    assert "client_ca_file: no CA certificate loaded" in refused(tmp_path, config)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"X-Powered-By": "me"}, "HTTP header 'X-Powered-By' can not be configured"),
        ({"X-Frame-Options": "allow"}, "expected one of deny, sameorigin, got 'allow'"),
        ({"X-Content-Type-Options": "sniff"}, "expected one of nosniff"),
        ({"Content-Security-Policy": "a\r\nSet-Cookie: x"}, "cannot hold a line break"),
        ({"X-XSS-Protection": 1}, "X-XSS-Protection: expected a string"),
    ],
)
def test_bad_headers(tmp_path: Path, headers: dict[str, Any], message: str) -> None:
    assert message in refused(tmp_path, {"http_server_config": {"headers": headers}})


def test_http2_must_be_a_boolean(tmp_path: Path) -> None:
    config = {"http_server_config": {"http2": "on"}}
    assert "http_server_config.http2: expected true or false" in refused(tmp_path, config)


@pytest.mark.parametrize(
    ("hashed", "message"),
    [
        ("plaintext", "basic_auth_users.u: not a bcrypt hash"),
        ("$2b$10$tooshort", "not a bcrypt hash"),
        ("$1$" + "a" * 57, "not a bcrypt hash"),
        ("$2b$03$" + "a" * 53, "bcrypt cost 03 is outside 4-31"),
        ("$2b$32$" + "a" * 53, "bcrypt cost 32 is outside 4-31"),
        (12345, "expected user: bcrypt-hash strings"),
    ],
)
def test_bad_bcrypt_hashes(tmp_path: Path, hashed: Any, message: str) -> None:
    assert message in refused(tmp_path, {"basic_auth_users": {"u": hashed}})


@pytest.mark.parametrize(
    ("rate_limit", "message"),
    [
        ({"interval": "fast", "burst": 1}, "'fast' is not a duration"),
        ({"interval": "1s", "burst": -1}, "rate_limit.burst: expected a whole number >= 0"),
        ({"interval": ["1s"], "burst": 1}, "rate_limit.interval: expected a duration"),
    ],
)
def test_bad_rate_limits(tmp_path: Path, rate_limit: dict[str, Any], message: str) -> None:
    assert message in refused(tmp_path, {"rate_limit": rate_limit})


# --- basic auth -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Basic dXNlcjpwYXNz", ("user", b"pass")),
        ("basic dXNlcjpwYTpzcw==", ("user", b"pa:ss")),  # a colon in the password
        ("Bearer dXNlcjpwYXNz", None),
        ("Basic not-base64!", None),
        ("Basic dXNlcg==", None),  # no colon
        ("", None),
    ],
)
def test_parse_basic_authorization(header: str, expected: tuple[str, bytes] | None) -> None:
    assert parse_basic_authorization(header) == expected


@pytest.fixture
def bcrypt_calls(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    return count_bcrypt_checks(monkeypatch)


def test_a_good_check_is_remembered_while_the_hash_holds_and_a_bad_one_never(
    bcrypt_calls: list[bytes],
) -> None:
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()})
    assert not auth.cached("prom", b"right")
    assert auth.verify("prom", b"right")
    assert all(auth.cached("prom", b"right") for _ in range(100))  # no bcrypt for these
    assert not auth.cached("prom", b"wrong")
    assert not auth.verify("prom", b"wrong")
    assert not auth.cached("prom", b"wrong")
    assert not auth.verify("nobody", b"right")  # an unknown user pays bcrypt too
    assert not auth.cached("nobody", b"right")
    assert bcrypt_calls == [b"right", b"wrong", b"right"]
    assert len(auth) == 1


def test_a_remembered_login_has_no_expiry() -> None:
    """An expiring memory sent the regular scraper back to the bcrypt queue every minute,
    where a wrong-password flood made it wait or refused it (#21)."""
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()})
    assert auth.verify("prom", b"right")
    a_day_later = time.monotonic() + 86_400
    with (
        mock.patch("time.monotonic", return_value=a_day_later),
        mock.patch("time.time", return_value=time.time() + 86_400),
    ):
        assert auth.cached("prom", b"right")


def test_a_reload_keeps_the_logins_of_users_whose_hash_is_unchanged(
    bcrypt_calls: list[bytes],
) -> None:
    kept, changed = bcrypt_hash("pw1").encode(), bcrypt_hash("pw2").encode()
    before = BasicAuth({"prom": kept, "grafana": changed, "gone": kept})
    for user, password in (("prom", b"pw1"), ("grafana", b"pw2"), ("gone", b"pw1")):
        assert before.verify(user, password)
    bcrypt_calls.clear()
    after = BasicAuth(
        {"prom": kept, "grafana": bcrypt_hash("pw2").encode(), "new": kept}, previous=before
    )
    assert after.cached("prom", b"pw1")  # a certificate renewal costs the scraper nothing
    assert not after.cached("grafana", b"pw2")  # a new hash (even of the same password)
    assert not after.cached("gone", b"pw1")
    assert not after.cached("new", b"pw1")
    assert bcrypt_calls == []
    assert not after.verify("grafana", b"pw1") and after.verify("grafana", b"pw2")


def test_logins_are_remembered_under_a_per_process_key() -> None:
    """The memory holds HMACs under a secret drawn at start: two agents with the same users
    share nothing, and nothing in memory can be tested offline against a password list."""
    users = {"prom": bcrypt_hash("right").encode()}
    one, two = BasicAuth(users), BasicAuth(users)
    assert one.verify("prom", b"right")
    assert not two.cached("prom", b"right")
    assert one._key("prom", b"right") != two._key("prom", b"right")
    assert b"right" not in b"".join(one._good)


def test_the_memory_of_good_checks_is_bounded_least_recently_used_out() -> None:
    users = {f"u{i}": bcrypt_hash("pw").encode() for i in range(5)}
    auth = BasicAuth(users, max_entries=3)
    for i in range(3):
        assert auth.verify(f"u{i}", b"pw")
    assert auth.cached("u0", b"pw")  # used again: u1 is now the oldest
    for i in range(3, 5):
        assert auth.verify(f"u{i}", b"pw")
    assert [auth.cached(f"u{i}", b"pw") for i in range(5)] == [True, False, False, True, True]
    assert len(auth) == 3


def test_a_password_beyond_72_bytes_is_checked_as_bcrypt_reads_it() -> None:
    long = b"p" * 80
    auth = BasicAuth({"u": bcrypt_hash("p" * 72).encode()})
    assert auth.verify("u", long)

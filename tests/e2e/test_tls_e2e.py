"""A real Prometheus scrapes the real agent over HTTPS: one agent with basic auth, one that
requires a client certificate (RequireAndVerifyClientCert), each from one
`--web-config-file` in exporter-toolkit's format. `up` is 1 for the scrape configurations
that carry the right credentials and 0 for those that do not, so the 1s are earned. And a
bad file stops the real binary at start with one line and exit 2."""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.e2e.test_prometheus_e2e import SCRAPE_INTERVAL_S, Prometheus
from tests.support.common import GPUSCOPE, REPO, free_port
from tests.support.prometheus_process import PrometheusFailed, launch_prometheus
from tests.support.tls import Pki, bcrypt_hash, make_pki, write_web_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

USER, PASSWORD = "prometheus", "scrape-me"


@dataclass
class TlsAgent:
    proc: subprocess.Popen[str]
    port: int
    log: Path

    def logs(self) -> str:
        return self.log.read_text()


def spawn_tls_agent(
    tmp: Path, name: str, web: dict[str, Any], pki: Pki, fake: FakeNvml
) -> TlsAgent:
    """The real gpuscope on the fake NVML with `web` as its web configuration, returned once
    /readyz answers over HTTPS (a probe needs no basic auth, but does need a certificate
    where one is required)."""
    config = write_web_config(tmp / f"{name}-web.yml", web)
    port = free_port()
    log = tmp / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
    env.update(fake.env(), PYTHONUNBUFFERED="1")
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                *GPUSCOPE,
                "--listen", f"127.0.0.1:{port}",
                "--collectors", "gpu",
                "--labels-mode", "none",
                "--web-config-file", str(config),
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
    agent = TlsAgent(proc, port, log)
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.client), str(pki.client_key))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"gpuscope exited {proc.returncode}:\n{agent.logs()}")
        try:
            url = f"https://127.0.0.1:{port}/readyz"
            with urllib.request.urlopen(url, timeout=5, context=context) as resp:
                if resp.status == 200:
                    return agent
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"gpuscope not ready over HTTPS after 20 s:\n{agent.logs()}")


@pytest.fixture
def agents(tmp_path: Path, fake_lib: Path) -> Iterator[tuple[Pki, TlsAgent, TlsAgent]]:
    pki = make_pki(tmp_path / "pki")
    fake = FakeNvml("dgx-h100", tmp_path / "fake.state")
    tls = {"cert_file": str(pki.server), "key_file": str(pki.server_key)}
    started: list[TlsAgent] = []
    try:
        basic = spawn_tls_agent(
            tmp_path,
            "basic",
            {"tls_server_config": tls, "basic_auth_users": {USER: bcrypt_hash(PASSWORD, 10)}},
            pki,
            fake,
        )
        started.append(basic)
        mtls = {
            **tls,
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": str(pki.ca),
        }
        cert = spawn_tls_agent(tmp_path, "cert", {"tls_server_config": mtls}, pki, fake)
        started.append(cert)
        yield pki, basic, cert
    finally:
        for agent in started:
            agent.proc.terminate()
            agent.proc.wait(10)


def test_prometheus_scrapes_over_https_with_basic_auth_and_with_a_client_certificate(
    tmp_path: Path, agents: tuple[Pki, TlsAgent, TlsAgent]
) -> None:
    pki, basic, cert = agents
    ca = {"ca_file": str(pki.ca)}
    client = {**ca, "cert_file": str(pki.client), "key_file": str(pki.client_key)}

    def job(name: str, port: int, tls: dict[str, str], **extra: Any) -> dict[str, Any]:
        return {
            "job_name": name,
            "scheme": "https",
            "tls_config": tls,
            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            **extra,
        }

    jobs = [
        job("basic-auth", basic.port, ca, basic_auth={"username": USER, "password": PASSWORD}),
        job("basic-auth-wrong", basic.port, ca, basic_auth={"username": USER, "password": "no"}),
        job("basic-auth-none", basic.port, ca),
        job("client-cert", cert.port, client),
        job("client-cert-none", cert.port, ca),
    ]
    prom = start_prometheus_with(tmp_path / "prom", jobs)
    try:
        expected = {
            "basic-auth": 1.0,
            "basic-auth-wrong": 0.0,
            "basic-auth-none": 0.0,
            "client-cert": 1.0,
            "client-cert-none": 0.0,
        }
        deadline = time.monotonic() + 20
        up: dict[str, float] = {}
        while time.monotonic() < deadline:
            up = {r["metric"]["job"]: float(r["value"][1]) for r in prom.query("up")}
            if up == expected:
                break
            time.sleep(0.5)
        assert up == expected, prom.logs()
        for name in ("basic-auth", "client-cert"):
            gpus = prom.query(f'count(gpuscope_gpu_up{{job="{name}"}} == 1)')
            assert [float(r["value"][1]) for r in gpus] == [8.0], name
        assert basic.proc.poll() is None and cert.proc.poll() is None
        assert "serving on https://127.0.0.1" in basic.logs()
        assert "TLS (NoClientCert), basic auth (1 user)" in basic.logs()
        assert "TLS (RequireAndVerifyClientCert), no basic auth" in cert.logs()
    finally:
        prom.proc.terminate()
        prom.proc.wait(10)


def start_prometheus_with(folder: Path, jobs: list[dict[str, Any]]) -> Prometheus:
    """Debian's prometheus on loopback with these scrape jobs, once ready (start_prometheus
    in test_prometheus_e2e.py writes its own job; these need scheme, TLS and credentials)."""
    interval = f"{SCRAPE_INTERVAL_S}s"
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": jobs,
    }
    try:
        url, proc, log = launch_prometheus(folder, config)
    except PrometheusFailed as exc:
        pytest.fail(str(exc))
    return Prometheus(url, proc, log)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("basic_auth_users:\n  prometheus: not-a-hash\n", "not a bcrypt hash"),
        ("tls_server_config:\n  cert_file: /nonexistent.pem\n  key_file: /k.pem\n", "cannot read"),
        ("tls_srever_config: {}\n", "unknown key 'tls_srever_config'"),
    ],
)
def test_a_bad_web_config_file_stops_the_agent_with_one_line_and_exit_2(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "web.yml"
    if content is not None:
        path.write_text(content)
    done = subprocess.run(
        [*GPUSCOPE, "--web-config-file", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("gpuscope: --web-config-file: ")
    assert str(path) in lines[0]
    assert message in lines[0]


def tls_section(pki: Pki, **extra: Any) -> dict[str, Any]:
    return {
        "tls_server_config": {
            "cert_file": str(pki.server),
            "key_file": str(pki.server_key),
            **extra,
        }
    }


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("X25519", "curve_preferences: X25519 cannot be set alone"),
        ("X25519MLKEM768", "curve_preferences: unknown curve 'X25519MLKEM768'"),
        ("CurveP256,CurveP384", "curve_preferences: gpuscope can use only one curve"),
        ("fifo", "cannot read {path}: not a regular file"),
        ("folder", "cannot read {path}: not a regular file"),
        ("fifo cert_file", "cert_file: cannot read {pki}/fifo.pem: not a regular file"),
        ("fifo client_ca_file", "client_ca_file: no CA certificate loaded: cannot read"),
    ],
)
def test_what_cannot_be_served_as_asked_stops_the_agent_with_one_line_and_exit_2(
    tmp_path: Path, bad: str, message: str
) -> None:
    """node_exporter's `curve_preferences: [X25519]` copied over (once an uncaught SSLError
    and a CrashLoopBackOff), the other curve lists this server cannot honour, and a FIFO or
    a folder at the file's path or a path it names (a FIFO once blocked the start in open()
    for ever): exit 2 and one line, at once, never a traceback or a hang."""
    path = tmp_path / "web.yml"
    pki = make_pki(tmp_path / "pki")
    if bad == "fifo":
        os.mkfifo(path)
    elif bad == "folder":
        path.mkdir()
    elif bad.startswith("fifo "):
        os.mkfifo(pki.folder / "fifo.pem")
        key = bad.split()[1]
        extra = (
            {"client_auth_type": "RequireAndVerifyClientCert"} if key == "client_ca_file" else {}
        )
        write_web_config(path, tls_section(pki, **extra, **{key: str(pki.folder / "fifo.pem")}))
    else:
        write_web_config(path, tls_section(pki, curve_preferences=bad.split(",")))
    done = subprocess.run(
        [*GPUSCOPE, "--web-config-file", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("gpuscope: --web-config-file: "), lines
    assert str(path) in lines[0]
    assert message.format(path=path, pki=pki.folder) in lines[0], lines


def test_a_fifo_swapped_in_at_reload_is_one_line_and_the_agent_keeps_serving_and_stops_promptly(
    tmp_path: Path, fake_lib: Path
) -> None:
    """The real binary: a FIFO put at the --web-config-file path once wedged its reloader
    (no log line, no certificate renewal after it) and made SIGTERM take 8 s. Now the next
    check (every 10 s) logs one line, HTTPS keeps serving the previous configuration, and
    SIGTERM ends the agent within a few seconds."""
    pki = make_pki(tmp_path / "pki")
    fake = FakeNvml("dgx-h100", tmp_path / "fake.state")
    agent = spawn_tls_agent(tmp_path, "fifo", tls_section(pki), pki, fake)
    try:
        config = tmp_path / "fifo-web.yml"
        config.unlink()
        os.mkfifo(config)
        deadline = time.monotonic() + 30
        while "not a regular file" not in agent.logs() and time.monotonic() < deadline:
            assert agent.proc.poll() is None, agent.logs()
            time.sleep(0.2)
        reported = [line for line in agent.logs().splitlines() if "not a regular file" in line]
        assert len(reported) == 1, agent.logs()
        assert "keeping the previous" in reported[0] and str(config) in reported[0]
        context = ssl.create_default_context(cafile=str(pki.ca))
        url = f"https://127.0.0.1:{agent.port}/readyz"
        with urllib.request.urlopen(url, timeout=5, context=context) as resp:
            assert resp.status == 200
        agent.proc.terminate()
        assert agent.proc.wait(5) == 0, agent.logs()  # not a join on a wedged thread
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait(10)


# --- a wrong-password flood ------------------------------------------------------------------


def timed_get(
    agent: TlsAgent, context: ssl.SSLContext, path: str, source: str, user: str, password: str
) -> tuple[int, float]:
    """(status, seconds) of one request on a new connection from `source`, handshake
    included, as a Prometheus that does not keep connections alive pays it."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    start = time.monotonic()
    conn = http.client.HTTPSConnection(
        "127.0.0.1", agent.port, timeout=10, context=context, source_address=(source, 0)
    )
    try:
        conn.request("GET", path, headers={"Authorization": f"Basic {token}"})
        response = conn.getresponse()
        response.read()
    finally:
        conn.close()
    return response.status, time.monotonic() - start


def test_a_wrong_password_flood_never_keeps_a_right_one_waiting(
    tmp_path: Path, fake_lib: Path
) -> None:
    """48 clients on 48 addresses send wrong passwords back to back (bcrypt cost 10, TLS).
    Once, the regular scraper got 503 as soon as its minute-long memory of a good login
    ran out, every correct login not seen in the last minute got 503, and a reload forgot
    every login. Now, throughout the flood: the scraper is answered 200 within a second,
    each new scraper's first login too (its address has no failures, so it goes before the
    flood's), the probes answer, and a reload that keeps the hashes keeps the logins."""
    pki = make_pki(tmp_path / "pki")
    fake = FakeNvml("dgx-h100", tmp_path / "fake.state")
    users = {USER: bcrypt_hash(PASSWORD, 10)} | {
        f"new{i}": bcrypt_hash(f"pw{i}", 10) for i in range(5)
    }
    web = {**tls_section(pki), "basic_auth_users": users}
    agent = spawn_tls_agent(tmp_path, "flood", web, pki, fake)
    context = ssl.create_default_context(cafile=str(pki.ca))
    latencies: dict[str, list[float]] = {"scraper": [], "new login": [], "healthz": []}

    def expect_200(kind: str, path: str, source: str, user: str, password: str) -> None:
        status, seconds = timed_get(agent, context, path, source, user, password)
        assert status == 200, (kind, status, seconds)
        latencies[kind].append(seconds)

    flood = None
    try:
        expect_200("scraper", "/metrics", "127.0.0.1", USER, PASSWORD)  # its one bcrypt
        flood = subprocess.Popen(
            [
                sys.executable, "-m", "tests.support.auth_flood",
                "--port", str(agent.port), "--ca", str(pki.ca),
                "--clients", "48", "--seconds", "60",
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert flood.stdout is not None
        assert flood.stdout.readline().strip() == "flooding"
        time.sleep(1.0)  # bcrypt has found a few flood addresses wrong, not all 48
        for i in range(5):
            expect_200("new login", "/metrics", f"127.0.0.{11 + i}", f"new{i}", f"pw{i}")
            for _ in range(3):
                expect_200("scraper", "/metrics", "127.0.0.1", USER, PASSWORD)
                expect_200("healthz", "/healthz", "127.0.0.2", "", "")
                time.sleep(0.2)
        # A reload (here a new response header) keeps what was verified under kept hashes.
        write_web_config(
            tmp_path / "flood-web.yml",
            {**web, "http_server_config": {"headers": {"X-Frame-Options": "deny"}}},
        )
        deadline = time.monotonic() + 30
        while "reloaded" not in agent.logs():
            assert time.monotonic() < deadline, agent.logs()
            expect_200("scraper", "/metrics", "127.0.0.1", USER, PASSWORD)
            expect_200("healthz", "/healthz", "127.0.0.2", "", "")
            time.sleep(0.2)
        for i in range(5):
            expect_200("scraper", "/metrics", "127.0.0.1", USER, PASSWORD)
            expect_200("new login", "/metrics", f"127.0.0.{11 + i}", f"new{i}", f"pw{i}")
        assert flood.poll() is None, "the flood ended before the checks did"
    finally:
        flooded: dict[str, int] = {}
        if flood is not None:
            flood.terminate()  # it prints its counts first, then winds its clients down
            try:
                out, _ = flood.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a client slow to close: the counts are out
                flood.kill()
                out, _ = flood.communicate()
            flooded = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        agent.proc.terminate()
        agent.proc.wait(10)
    report = {kind: (len(values), round(max(values), 3)) for kind, values in latencies.items()}
    print(f"answered 200 (count, slowest s) during a 48-client flood: {report}; flood: {flooded}")
    assert all(max(values) < 1.0 for values in latencies.values()), report
    assert flooded.get("401", 0) >= 50, flooded  # the flood kept bcrypt busy throughout
    assert agent.proc.returncode == 0, agent.logs()

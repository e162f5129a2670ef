#!/usr/bin/env python3
"""What TLS and basic auth cost a scrape: median and p90 latency of a ~200 KB /metrics
answer from a `MetricsServer` in its own process, for plain HTTP, HTTPS, HTTPS with basic
auth (bcrypt cost 10, as `htpasswd -nBC 10` makes it) and HTTPS with a client certificate,
each on a kept-alive connection and with a new connection per scrape (what Prometheus does
after an idle timeout, and what every scrape costs a client that does not keep alive). It
also prints the first authenticated scrape, which pays bcrypt, against the later ones,
which the server remembers, and what 1,000 idle connections add to the server's resident
memory: plain, TLS after a scrape, and TLS with no handshake begun (the connection cap is
1,024). Certificates are made in a temporary folder.

    .venv/bin/python bench/bench_tls.py [--scrapes 200]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BODY = b"".join(
    b'gpuscope_gpu_memory_used_bytes{gpu="%d",uuid="GPU-%032d",namespace="team-a"} 1.5e+10\n'
    % (i % 8, i)
    for i in range(2200)
)
USER, PASSWORD = "prometheus", "bench-password"


def serve(config: str) -> None:
    """Run a MetricsServer with this web configuration until stdin closes; print its port."""
    from prometheus_client import CollectorRegistry

    from gpuscope.agent.serve.server import MetricsServer
    from gpuscope.agent.serve.web_config import load_web_config

    web = load_web_config(Path(config)) if config else None
    server = MetricsServer(
        ("127.0.0.1", 0),
        CollectorRegistry(),
        lambda: BODY,
        lambda: True,
        web=web,
        header_timeout=300,  # the idle-connection figure holds them open
        idle_timeout=300,
    )
    server.start()
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()


def scrape_times(
    port: int,
    context: ssl.SSLContext | None,
    headers: dict[str, str],
    count: int,
    *,
    keep_alive: bool,
) -> list[float]:
    def connect() -> http.client.HTTPConnection:
        if context is None:
            return http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        return http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)

    times = []
    conn = connect()
    for _ in range(count):
        if not keep_alive:
            conn.close()
            conn = connect()
        start = time.perf_counter()
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        body = response.read()
        times.append(time.perf_counter() - start)
        assert response.status == 200 and len(body) == len(BODY), response.status
    conn.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=200)
    args = parser.parse_args()

    from tests.support.tls import bcrypt_hash, make_pki, write_web_config

    tmp = Path(tempfile.mkdtemp(prefix="bench-tls-"))
    pki = make_pki(tmp / "pki")
    tls = {"cert_file": str(pki.server), "key_file": str(pki.server_key)}
    mtls = {**tls, "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca)}
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    auth = {"Authorization": f"Basic {token}"}
    plain_context = None
    server_only = ssl.create_default_context(cafile=str(pki.ca))
    with_cert = ssl.create_default_context(cafile=str(pki.ca))
    with_cert.load_cert_chain(str(pki.client), str(pki.client_key))
    cases: list[tuple[str, dict[str, object] | None, ssl.SSLContext | None, dict[str, str]]] = [
        ("plain HTTP", None, plain_context, {}),
        ("HTTPS", {"tls_server_config": tls}, server_only, {}),
        (
            "HTTPS + basic auth",
            {"tls_server_config": tls, "basic_auth_users": {USER: bcrypt_hash(PASSWORD, 10)}},
            server_only,
            auth,
        ),
        ("HTTPS + client certificate", {"tls_server_config": mtls}, with_cert, {}),
    ]
    print(f"{args.scrapes} scrapes of a {len(BODY) // 1000} KB answer each; milliseconds")
    print(f"{'':28} {'kept alive':>18} {'new connection':>18}")
    print(f"{'':28} {'median':>8} {'p90':>9} {'median':>8} {'p90':>9}")
    for name, config, context, headers in cases:
        path = ""
        if config is not None:
            path = str(write_web_config(tmp / f"{len(name)}.yml", config))
        proc, port = start_server(path)
        assert proc.stdin is not None
        try:
            first = scrape_times(port, context, headers, 1, keep_alive=True)[0]
            kept = scrape_times(port, context, headers, args.scrapes, keep_alive=True)
            fresh = scrape_times(port, context, headers, args.scrapes, keep_alive=False)
        finally:
            proc.stdin.close()
            proc.wait(10)
        print(f"{name:28} {_ms(statistics.median, kept)} {_ms(_p90, kept)} "
              f"{_ms(statistics.median, fresh)} {_ms(_p90, fresh)}")  # fmt: skip
        if headers:
            print(f"{'  first scrape (bcrypt)':28} {first * 1000:8.1f}")

    tls_path = str(write_web_config(tmp / "idle.yml", {"tls_server_config": tls}))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))
    count = 1000
    print(f"\n{count:,} idle connections add to the server's resident memory:")
    for name, path, context, handshake in (
        ("plain HTTP, after a request", "", None, True),
        ("TLS, after a request", tls_path, server_only, True),
        ("TLS, no handshake begun", tls_path, server_only, False),
    ):
        print(f"  {name:28} {idle_memory(path, context, handshake, count):6.1f} MiB")


def start_server(path: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0])


def idle_memory(path: str, context: ssl.SSLContext | None, handshake: bool, count: int) -> float:
    """MiB of resident memory `count` idle connections add to a fresh server."""
    proc, port = start_server(path)
    assert proc.stdin is not None
    held: list[socket.socket] = []
    try:
        time.sleep(0.5)
        before = rss_kib(proc.pid)
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            if handshake and context is not None:
                sock = context.wrap_socket(sock, server_hostname="localhost")
            if handshake:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.recv(65536)
            held.append(sock)
        time.sleep(1.0)
        return (rss_kib(proc.pid) - before) / 1024
    finally:
        for sock in held:
            sock.close()
        proc.stdin.close()
        proc.wait(10)


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def _ms(stat: Callable[[list[float]], float], values: list[float]) -> str:
    return f"{stat(values) * 1000:8.2f} "


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2] if len(sys.argv) > 2 else "")
    else:
        main()

#!/usr/bin/env python3
"""The HTTP server under abuse: scrape latency of one normal client, in one run.

A `MetricsServer` runs in its own process with a render that holds the CPU (and the GIL)
for a few milliseconds and answers a ~200 KB exposition, as an 8-GPU node's collection
does. From other processes, a normal client scrapes it (a new connection per scrape, 50 ms
apart) and prints the median and p90 latency, with the server's threads and open file
descriptors, in four scenarios:
  * alone;
  * with 50 concurrent scrapers (50 threads in another process, scraping back to back);
  * with 30 slowloris clients (each sends one byte of an endless request head a second,
    and reconnects when the server closes it);
  * with 1,000 idle connections (opened before, silent).
`--baseline REV` measures agent/serve/server.py of that git revision the same way, in the same
run (e.g. the threaded server before #12). `--agent` adds the real `gpuscope` process on
the fake dgx-h100 node (GPU collector only), where a scrape is a real collection.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import os
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BODY = b"".join(
    b'gpuscope_gpu_memory_used_bytes{gpu="%d",uuid="GPU-%032d",namespace="team-a"} 1.5e+10\n'
    % (i % 8, i)
    for i in range(2200)
)
SCENARIOS = ("alone", "50 concurrent scrapers", "30 slowloris clients", "1,000 idle connections")


# The processes this benchmark starts: the server and the concurrent scrapers.


def serve(source: Path | None, render_ms: float) -> None:
    """Run a MetricsServer on 127.0.0.1:0 until stdin closes; print its port first."""
    from prometheus_client import CollectorRegistry

    from gpuscope.agent.serve import server as current

    module = current
    if source is not None:
        spec = importlib.util.spec_from_file_location("baseline_server", source)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while it runs
        spec.loader.exec_module(module)

    def render() -> bytes:
        end = time.perf_counter() + render_ms / 1e3
        while time.perf_counter() < end:  # a collection is Python work: it holds the GIL
            pass
        return BODY

    server = module.MetricsServer(
        ("127.0.0.1", 0),
        CollectorRegistry(),
        render,
        lambda: True,
    )
    server.start()
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()


def scrapers(port: int, count: int) -> None:
    """`count` threads scraping back to back until stdin closes."""
    stop = threading.Event()
    served = [0] * count

    def loop(i: int) -> None:
        while not stop.is_set():
            try:
                scrape("127.0.0.1", port)
                served[i] += 1
            except OSError:
                time.sleep(0.01)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    sys.stdin.read()
    stop.set()
    print(sum(served), flush=True)


def scrape(host: str, port: int) -> float:
    """One scrape on a new connection, as a scraper without keep-alive makes it: seconds."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise OSError(f"status {response.status}")
    finally:
        conn.close()
    return time.perf_counter() - start


def child(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


# Abuse from this process.


class Slowloris:
    """`count` connections each sending one byte of a request head that never ends, once a
    second; a connection the server closes is opened again, so the pressure holds."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.socks = [self._open() for _ in range(count)]
        self.reopened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: node\r\nX-Slow: ")
        return sock

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for i, sock in enumerate(self.socks):
                try:
                    sock.send(b"a")
                except OSError:
                    sock.close()
                    self.reopened += 1
                    self.socks[i] = self._open()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self.socks:
            sock.close()


@dataclass
class Abuse:
    """What the abuse itself got, for the report's last column."""

    note: str = ""


@contextmanager
def abuse(scenario: str, port: int, pid: int) -> Iterator[Abuse]:
    result = Abuse()
    if scenario == "alone":
        yield result
    elif scenario.startswith("50 concurrent"):
        proc = child("scrapers", "--port", str(port), "--count", "50")
        began = time.monotonic()
        time.sleep(1.0)  # let them reach a steady state
        try:
            yield result
        finally:
            out, _ = proc.communicate()
            rate = int(out) / (time.monotonic() - began)
            result.note = f"the 50 got {rate:.0f} scrapes/s"
    elif scenario.startswith("30 slowloris"):
        slow = Slowloris(port, 30)
        time.sleep(1.0)
        try:
            yield result
        finally:
            slow.close()
            result.note = f"{slow.reopened} closed by the server"
    else:
        fds = proc_threads_fds(pid)[1]
        idle = open_idle(port, 1000)
        deadline = time.monotonic() + 20
        while proc_threads_fds(pid)[1] < fds + 1000 and time.monotonic() < deadline:
            time.sleep(0.2)  # until the server has accepted them all (or 20 s)
        result.note = f"{proc_threads_fds(pid)[1] - fds} held by the server"
        try:
            yield result
        finally:
            for sock in idle:
                sock.close()


def open_idle(port: int, count: int, timeout: float = 30.0) -> list[socket.socket]:
    """`count` connections opened at once, as a flood does (non-blocking connects), waited
    for up to `timeout`: a server with a short listen backlog drops SYNs, and connecting
    one by one would take minutes (the kernel retries a dropped SYN after 1, 3, 7... s)."""
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        socks.append(sock)
    selector = selectors.DefaultSelector()
    for sock in socks:
        selector.register(sock, selectors.EVENT_WRITE)
    pending = count
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.5):
            selector.unregister(key.fileobj)
            pending -= 1
    selector.close()
    if pending:
        print(f"  ({pending} of {count} idle connections not established)", file=sys.stderr)
    return socks


# Measuring.


@dataclass
class Row:
    target: str
    scenario: str
    times: list[float]
    threads: int
    fds: int
    cpu: float  # the server process's CPU while the normal client scraped, in cores
    note: str


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def proc_threads_fds(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    threads = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")
    )
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def measure(target: str, pid: int, port: int, scrapes: int) -> list[Row]:
    rows = []
    for _ in range(3):
        scrape("127.0.0.1", port)  # warm up
    for scenario in SCENARIOS:
        began = time.monotonic()
        with abuse(scenario, port, pid) as got:
            cpu0, t0 = proc_cpu_seconds(pid), time.monotonic()
            times = []
            for _ in range(scrapes):
                times.append(scrape("127.0.0.1", port))
                time.sleep(0.05)
            threads, fds = proc_threads_fds(pid)
            cpu = (proc_cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
        rows.append(Row(target, scenario, times, threads, fds, cpu, got.note))
        print(f"  ({target}, {scenario}: {time.monotonic() - began:.1f} s)", file=sys.stderr)
        time.sleep(1.0)  # let the server let go of the abuse before the next scenario
    return rows


@contextmanager
def server_process(source: Path | None, render_ms: float) -> Iterator[tuple[int, int]]:
    args = ["serve", "--render-ms", str(render_ms)]
    if source is not None:
        args += ["--source", str(source)]
    proc = child(*args)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    try:
        yield proc.pid, port
    finally:
        proc.communicate()


@contextmanager
def agent_process(tmp: Path) -> Iterator[tuple[int, int]]:
    """The real `gpuscope` on the fake dgx-h100 node, GPU collector only."""
    from tests.doubles.fakenvml.control import FakeNvml, ensure_built
    from tests.support import free_port

    ensure_built()
    fake = FakeNvml("dgx-h100", tmp / "state")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuscope", "--listen", f"127.0.0.1:{port}", "--collectors", "gpu",
         "--labels-mode", "none", "--log-level", "warning"],
        cwd=REPO,
        env=os.environ | fake.env(),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            scrape("127.0.0.1", port)
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("the agent did not start") from None
            time.sleep(0.1)
    try:
        yield proc.pid, port
    finally:
        proc.terminate()
        proc.wait(30)


def baseline_source(rev: str, tmp: Path) -> Path:
    text = subprocess.run(
        ["git", "show", f"{rev}:agent/serve/server.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = tmp / "baseline_server.py"
    path.write_text(text)
    return path


def summary(times: list[float]) -> tuple[float, float]:
    return statistics.median(times) * 1e3, statistics.quantiles(times, n=10)[-1] * 1e3


def report(rows: list[Row], args: argparse.Namespace) -> None:
    print(
        f"gpuscope HTTP server under abuse: {len(BODY) / 1e3:.0f} KB answer, "
        f"{args.render_ms:g} ms render (CPU-bound), {args.scrapes} scrapes per scenario, "
        f"{os.cpu_count()} CPUs"
    )
    print(
        f"  {'server':<28} {'scenario':<24} {'median':>9} {'p90':>9} {'max':>9}"
        f" {'threads':>8} {'fds':>6} {'CPU':>5}  abuse"
    )
    for row in rows:
        median, p90 = summary(row.times)
        print(
            f"  {row.target:<28} {row.scenario:<24} {median:7.2f}ms {p90:7.2f}ms "
            f"{max(row.times) * 1e3:7.1f}ms {row.threads:8d} {row.fds:6d} {row.cpu:5.0%}"
            f"  {row.note}"
        )


def raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command")
    p_serve = sub.add_parser("serve")
    p_serve.add_argument("--source", type=Path)
    p_serve.add_argument("--render-ms", type=float, default=4.0)
    p_scr = sub.add_parser("scrapers")
    p_scr.add_argument("--port", type=int, required=True)
    p_scr.add_argument("--count", type=int, default=50)
    parser.add_argument("--scrapes", type=int, default=40)
    parser.add_argument("--render-ms", type=float, default=4.0)
    parser.add_argument(
        "--baseline", metavar="REV", help="also measure agent/serve/server.py at REV"
    )
    parser.add_argument("--no-current", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--agent", action="store_true", help="also measure the real agent")
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.source, args.render_ms)
        return
    if args.command == "scrapers":
        scrapers(args.port, args.count)
        return
    raise_fd_limit(4096)  # 1,000 idle connections, both ends; children inherit it
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        targets: list[tuple[str, Callable[[], AbstractContextManager[tuple[int, int]]]]] = []
        if not args.no_current:
            targets.append(("this tree", lambda: server_process(None, args.render_ms)))
        if args.baseline:
            source = baseline_source(args.baseline, tmp)
            targets.append(
                (
                    f"agent/serve/server.py@{args.baseline}",
                    lambda: server_process(source, args.render_ms),
                )
            )
        if args.agent:
            targets.append(("gpuscope, fake dgx-h100", lambda: agent_process(tmp)))
        for name, start in targets:
            with start() as (pid, port):
                rows += measure(name, pid, port, args.scrapes)
    report(rows, args)


if __name__ == "__main__":
    main()

"""The HTTP server under abuse, over real sockets: a thousand silent connections and thirty
slowloris clients (a byte a second) do not stop a normal scrape, add no thread, and are
closed by the header deadline (short here: 2 s), their file descriptors with them.

Before #12 the threaded server held one thread and one descriptor per idle connection
(1,012 threads for 1,000) until the client gave up. Figures: bench/server_abuse.py."""

from __future__ import annotations

import http.client
import os
import resource
import selectors
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from gpuscope.agent.serve.server import MetricsServer
from tests.support import wait_for

pytestmark = pytest.mark.slow

HEADER_TIMEOUT = 2.0
IDLE = 1000
SLOWLORIS = 30
# About the size of an 8-GPU node's exposition (docs/performance.md: 119 KB for the GPU
# source alone, more with pods).
BODY = b"".join(
    b'gpuscope_gpu_memory_used_bytes{gpu="%d",uuid="GPU-%032d",namespace="team-a"} 1.5e+10\n'
    % (i % 8, i)
    for i in range(2200)
)


def render() -> bytes:
    time.sleep(0.004)  # a collection takes a few milliseconds
    return BODY


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * (IDLE + SLOWLORIS) + 200  # both ends of every connection live in this process
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"needs {need} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    srv = MetricsServer(
        ("127.0.0.1", 0),
        CollectorRegistry(),
        render,
        lambda: True,
        header_timeout=HEADER_TIMEOUT,
        max_connections=IDLE + SLOWLORIS + 50,  # the deadline closes them here, not the cap
    )
    srv.start()
    yield srv
    srv.stop()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def scrape(srv: MetricsServer) -> None:
    """A scrape as Prometheus makes it, with a generous bound: the full body, status 200."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "identity"})
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, BODY)
    finally:
        conn.close()


def connect_many(srv: MetricsServer, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        sock.setblocking(False)
        socks.append(sock)
    return socks


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def wait_all_closed(socks: list[socket.socket], timeout: float) -> None:
    """Every socket sees the server's close within `timeout` (EOF or reset)."""
    selector = selectors.DefaultSelector()
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)
    left = len(socks)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.5):
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            if closed_by_server(ready):
                selector.unregister(ready)
                left -= 1
    selector.close()
    assert left == 0, f"{left} of {len(socks)} connections still open after {timeout}s"


def test_a_thousand_idle_connections(server: MetricsServer) -> None:
    scrape(server)
    threads, fds = threading.active_count(), open_fds()
    idle = connect_many(server, IDLE)
    wait_for(lambda: server.stats().open_connections == IDLE, 10, "the server to accept them")
    for _ in range(5):
        scrape(server)
    assert threading.active_count() <= threads  # no thread per connection (others may end)
    wait_all_closed(idle, HEADER_TIMEOUT + 8)
    assert server.stats().header_timeouts == IDLE
    for sock in idle:
        sock.close()
    wait_for(lambda: server.stats().open_connections == 0, 10, "the server to forget them")
    assert open_fds() <= fds  # the server closed its end of every one
    scrape(server)


def test_thirty_slowloris_clients(server: MetricsServer) -> None:
    scrape(server)
    threads = threading.active_count()
    slow = connect_many(server, SLOWLORIS)
    request = b"GET /metrics HTTP/1.1\r\nHost: node\r\nUser-Agent: " + b"a" * 100
    closed: set[int] = set()
    for i in range(int(HEADER_TIMEOUT) + 8):
        for j, sock in enumerate(slow):
            if j in closed:
                continue
            try:
                sock.send(request[i : i + 1])  # a byte a second, never the end of the head
            except (BrokenPipeError, ConnectionResetError):
                closed.add(j)
                continue
            if closed_by_server(sock):
                closed.add(j)
        scrape(server)  # answered while they trickle
        assert threading.active_count() <= threads  # threads of earlier tests may end meanwhile
        if len(closed) == SLOWLORIS:
            break
        time.sleep(1)
    assert len(closed) == SLOWLORIS, f"{SLOWLORIS - len(closed)} slowloris clients still open"
    assert server.stats().header_timeouts == SLOWLORIS
    for sock in slow:
        sock.close()


def test_idle_and_slowloris_at_once_with_a_kept_alive_scraper(server: MetricsServer) -> None:
    """The abuse together, while a scraper reuses one connection as Prometheus does."""
    scrape(server)  # the render thread starts with the first render
    threads = threading.active_count()
    idle = connect_many(server, IDLE)
    slow = connect_many(server, SLOWLORIS)
    prometheus = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for i in range(3):
        for sock in slow:
            sock.send(b"GET /metrics HTTP/1.1\r\n"[i : i + 1])
        prometheus.request("GET", "/metrics")
        response = prometheus.getresponse()
        assert (response.status, response.read()) == (200, BODY)
        assert threading.active_count() <= threads  # threads of earlier tests may end meanwhile
        time.sleep(0.5)
    wait_all_closed(idle + slow, HEADER_TIMEOUT + 8)
    prometheus.close()
    for sock in idle + slow:
        sock.close()

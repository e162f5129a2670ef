"""The HTTP server (agent/serve/server.py) over real loopback sockets: listen addresses, methods,
sizes, HEAD, keep-alive, gzip, the probes while a render blocks, deadlines and the
connection cap. The abuse figures (a thousand idle connections, slowloris) are in
tests/integration/test_server_abuse.py."""

from __future__ import annotations

import errno
import gzip
import http.client
import logging
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from gpuscope.agent.runtime.options import ConfigError
from gpuscope.agent.serve.server import MetricsServer, parse_listen_address
from tests.support import wait_for

# Larger than the kernel's send buffer can grow to (tcp_wmem: 4 MiB by default) plus a small
# receive window: the server holds part of the answer until the client reads it.
BIG = b"x 1\n" * 4_000_000
BODY = b"# HELP demo_total A demo.\n# TYPE demo_total counter\n" + b"demo_total 1\n" * 2000


@dataclass
class FakeAgent:
    """What the server calls: a render that can fail or block, readiness, health text."""

    body: bytes = BODY
    ready: bool = True
    error: Exception | None = None
    gate: threading.Event | None = None  # when set, a render waits for it
    rendering: threading.Event = field(default_factory=threading.Event)
    health: str = ""
    renders: int = 0

    def render(self) -> bytes:
        self.renders += 1
        self.rendering.set()
        if self.gate is not None:
            assert self.gate.wait(30), "test never released the render"
        if self.error is not None:
            raise self.error
        return self.body


@pytest.fixture
def agent() -> FakeAgent:
    return FakeAgent()


@pytest.fixture
def serve(agent: FakeAgent) -> Iterator[Callable[..., MetricsServer]]:
    """`serve(address=("127.0.0.1", 0), **limits)`: a started server, stopped at teardown."""
    servers: list[MetricsServer] = []
    registry = CollectorRegistry()
    Counter("demo", "A demo.", registry=registry).inc()

    def start(address: tuple[str, int] = ("127.0.0.1", 0), **kwargs: object) -> MetricsServer:
        server = MetricsServer(
            address,
            registry,
            agent.render,
            lambda: agent.ready,
            health=lambda: agent.health,
            **kwargs,  # type: ignore[arg-type]
        )
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
    if agent.gate is not None:
        agent.gate.set()


class Client:
    """A raw HTTP/1.x client over one socket, reading answers through a buffer, so
    pipelined answers that arrive in one segment are read one at a time."""

    def __init__(
        self, server: MetricsServer, host: str = "127.0.0.1", *, rcvbuf: int | None = None
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        if rcvbuf is not None:  # before connecting: it sets the window the server sees
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((host, server.port))
        self.file = self.sock.makefile("rb")

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def response(self, *, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body) of the next answer."""
        status_line = self.file.readline()
        assert status_line, "connection closed before an answer"
        status = int(status_line.split(b" ")[1])
        headers: dict[str, str] = {}
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = 0 if head_only else int(headers["content-length"])
        body = self.file.read(length)
        assert len(body) == length, "connection closed mid-body"
        return status, headers, body

    def closed_by_server(self) -> bool:
        """True when the server closes the connection (EOF or reset) within 10 s with
        nothing more sent."""
        try:
            return self.file.read(1) == b""
        except ConnectionResetError:
            return True


def get(
    server: MetricsServer, path: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request(method, path, headers=headers or {})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


# Listen addresses.


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":9400", ("", 9400)),
        ("0.0.0.0:9400", ("0.0.0.0", 9400)),
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        ("[::1]:9400", ("::1", 9400)),
        ("[::]:9400", ("::", 9400)),
        ("localhost:9400", ("localhost", 9400)),
        ("gpu-node-7.example.com:0", ("gpu-node-7.example.com", 0)),
        ("[fe80::1%eth0]:65535", ("fe80::1%eth0", 65535)),
    ],
)
def test_listen_addresses_accepted(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen_address("--listen", text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[::1", "unclosed '['"),
        ("[::1]9400", "expected [IPV6]:PORT"),
        ("[127.0.0.1]:9400", "is not an IPv6 address"),
        ("::1:9400", "needs brackets"),
        ("9400", "expected [HOST]:PORT"),
        ("localhost", "expected [HOST]:PORT"),
        ("127.0.0.1:", "port must be a number"),
        ("127.0.0.1:+80", "port must be a number"),
        ("127.0.0.1:65536", "port must be 0-65535"),
        ("300.1.1.1:9400", "is not an IPv4 address or host name"),
        ("bad_host!:9400", "is not an IPv4 address or host name"),
    ],
)
def test_bad_listen_addresses_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_listen_address("--listen", text)
    assert str(err.value).startswith("--listen: ")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback here")


@needs_ipv6
def test_all_addresses_is_dual_stack(serve: Callable[..., MetricsServer]) -> None:
    server = serve(parse_listen_address("--listen", ":0"))
    assert server.address[0] == "::"
    for host in ("127.0.0.1", "::1"):
        with Client(server, host) as sock:
            sock.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.response()[0] == 200


@needs_ipv6
def test_ipv6_loopback_only(serve: Callable[..., MetricsServer]) -> None:
    server = serve(parse_listen_address("--listen", "[::1]:0"))
    with Client(server, "::1") as sock:
        sock.send(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert sock.response()[0] == 200
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5)


def test_ipv4_wildcard_is_ipv4_only(serve: Callable[..., MetricsServer]) -> None:
    server = serve(parse_listen_address("--listen", "0.0.0.0:0"))
    assert server.address[0] == "0.0.0.0"
    assert get(server, "/healthz").status == 200


def test_a_port_in_use_fails_in_the_constructor(serve: Callable[..., MetricsServer]) -> None:
    server = serve()
    with pytest.raises(OSError) as err:
        MetricsServer(("127.0.0.1", server.port), CollectorRegistry(), lambda: b"", lambda: True)
    assert err.value.errno == errno.EADDRINUSE  #: cli.py says "address already in use"


# Endpoints, methods, HEAD.


def test_endpoints(serve: Callable[..., MetricsServer], agent: FakeAgent) -> None:
    server = serve()
    metrics = get(server, "/metrics?debug=1")
    assert metrics.status == 200
    assert metrics.headers["Content-Type"].startswith("text/plain; version=")
    assert get(server, "/").status == 200
    assert get(server, "/nope").status == 404
    agent.ready = False
    assert get(server, "/readyz").status == 503
    agent.ready = True
    assert get(server, "/readyz").status == 200


def test_health_text_is_appended_and_a_failing_one_keeps_healthz_up(
    serve: Callable[..., MetricsServer], agent: FakeAgent
) -> None:
    server = serve()
    agent.health = "stuck collectors: gpu"
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().read() == b"ok\nstuck collectors: gpu\n"
    server.health = lambda: 1 // 0  # type: ignore[assignment]
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    assert response.status == 200
    assert response.read().startswith(b"ok\nhealth details unavailable: ZeroDivisionError")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_other_methods_are_405_with_allow(serve: Callable[..., MetricsServer], method: str) -> None:
    server = serve()
    with Client(server) as sock:
        sock.send(f"{method} /metrics HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, headers, _ = sock.response()
        assert (status, headers["allow"]) == (405, "GET, HEAD")
        sock.send(b"GET /healthz HTTP/1.1\r\n\r\n")  # the connection is still usable
        assert sock.response()[0] == 200


def test_head_answers_the_headers_of_get_without_the_body(
    serve: Callable[..., MetricsServer],
) -> None:
    server = serve()
    with Client(server) as sock:
        sock.send(b"GET /metrics HTTP/1.1\r\n\r\n")
        _, get_headers, body = sock.response()
        sock.send(b"HEAD /metrics HTTP/1.1\r\n\r\n")
        status, head_headers, _ = sock.response(head_only=True)
        assert status == 200
        assert head_headers["content-length"] == str(len(body)) == get_headers["content-length"]
        assert head_headers["content-type"] == get_headers["content-type"]
        # Had a body followed, this next answer would start with it.
        sock.send(b"HEAD /healthz HTTP/1.1\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n")
        assert sock.response(head_only=True)[0] == 200
        assert sock.response()[2] == b"ok\n"


# Encodings.


def test_gzip_when_asked_and_not_when_refused(serve: Callable[..., MetricsServer]) -> None:
    server = serve()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip, deflate"})
    response = conn.getresponse()
    assert response.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(response.read()) == BODY
    conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip;q=0, identity"})
    response = conn.getresponse()
    assert response.headers["Content-Encoding"] is None
    assert response.read() == BODY


def test_openmetrics_when_asked(serve: Callable[..., MetricsServer]) -> None:
    server = serve()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request(
        "GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    response = conn.getresponse()
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert response.read().endswith(b"# EOF\n")


# Keep-alive.


def test_keep_alive_and_pipelining(serve: Callable[..., MetricsServer]) -> None:
    server = serve()
    with Client(server) as sock:
        sock.send(
            b"GET /metrics HTTP/1.1\r\n\r\n"
            b"GET /readyz HTTP/1.1\r\n\r\n"
            b"GET /healthz HTTP/1.1\r\n\r\n"
        )
        assert sock.response()[2] == BODY
        assert sock.response()[2] == b"ready\n"
        assert sock.response()[2] == b"ok\n"
    assert server.stats().accepted == 1


@pytest.mark.parametrize(
    ("request_head", "kept"),
    [
        (b"GET /healthz HTTP/1.1\r\n\r\n", True),
        (b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", False),
        (b"GET /healthz HTTP/1.0\r\n\r\n", False),
        (b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", True),
    ],
)
def test_connection_header_and_version_decide_keep_alive(
    serve: Callable[..., MetricsServer], request_head: bytes, kept: bool
) -> None:
    server = serve()
    with Client(server) as sock:
        sock.send(request_head)
        status, headers, _ = sock.response()
        assert status == 200
        if kept:
            assert headers.get("connection") in (None, "keep-alive")
            sock.send(b"GET /healthz HTTP/1.1\r\n\r\n")
            assert sock.response()[0] == 200
        else:
            assert headers["connection"] == "close"
            assert sock.closed_by_server()


# Sizes and malformed requests: answered, then the connection closes.


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 17000 + b"\r\n\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Many: 1234567890\r\n" * 900 + b"\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\nX-Never-Ends: " + b"a" * 20000, 431),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 1048576\r\n\r\n", 413),
        (
            b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            413,
        ),
        (b"GET /metrics\r\n\r\n", 400),
        (b"GET  /metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nNo colon here\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 1, 2\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    ],
)
def test_refused_requests_are_answered_then_closed(
    serve: Callable[..., MetricsServer], request_bytes: bytes, status: int
) -> None:
    server = serve()
    with Client(server) as sock:
        sock.send(request_bytes)
        got, headers, _ = sock.response()
        assert (got, headers["connection"]) == (status, "close")
        assert sock.closed_by_server()
    assert get(server, "/healthz").status == 200


def test_a_tiny_body_is_read_and_the_connection_kept(serve: Callable[..., MetricsServer]) -> None:
    server = serve()
    with Client(server) as sock:
        sock.send(
            b"GET /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET /readyz HTTP/1.1\r\n\r\n"
        )
        assert sock.response()[2] == b"ok\n"
        assert sock.response()[2] == b"ready\n"


def test_head_size_cap_is_a_keyword(serve: Callable[..., MetricsServer]) -> None:
    server = serve(max_request_bytes=256)
    with Client(server) as sock:
        sock.send(b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 300 + b"\r\n\r\n")
        assert sock.response()[0] == 431


# A render that fails or blocks.


def test_a_failing_render_is_500_and_logged_once_per_change(
    serve: Callable[..., MetricsServer], agent: FakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    server = serve()
    caplog.set_level(logging.INFO, logger="gpuscope.server")
    agent.error = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    assert [get(server, "/metrics").status for _ in range(5)] == [500] * 5
    agent.error = None
    assert get(server, "/metrics").status == 200
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) == 2, lines
    assert lines[0].startswith("rendering /metrics failed, answering 500: UnicodeDecodeError")
    assert lines[1] == "rendering /metrics works again"
    assert all(r.exc_info is None for r in caplog.records)


class GatedOpenMetrics:
    """A registry collector that counts OpenMetrics renders (they read the registry) and
    blocks each until the test lets it go."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.rendering = threading.Event()
        self.renders = 0

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        self.renders += 1
        self.rendering.set()
        assert self.gate.wait(30), "test never released the render"
        yield GaugeMetricFamily("gated", "A gated gauge.", value=1)


def test_differently_spelled_accept_headers_that_ask_for_one_format_share_a_render(
    agent: FakeAgent,
) -> None:
    """Scrapers write OpenMetrics wishes differently (other types beside it, q-values,
    spaces); what they get is one format, and one render serves them all, as for identical
    headers. A wish for another version is another format and gets its own render."""
    gated = GatedOpenMetrics()
    registry = CollectorRegistry()
    registry.register(gated)
    server = MetricsServer(("127.0.0.1", 0), registry, agent.render, lambda: True)
    server.start()
    spellings = [
        "application/openmetrics-text",
        "application/openmetrics-text;q=0.9, text/plain;q=0.5",
        "text/html, application/openmetrics-text",
        "application/openmetrics-text; q=0.8,*/*;q=0.1",
        "APPLICATION/openmetrics-text",  # not OpenMetrics to prometheus_client: the text format
    ]
    other_version = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.3"
    clients: list[Client] = []
    try:
        for header in [*spellings, other_version]:
            clients.append(Client(server))
            clients[-1].send(f"GET /metrics HTTP/1.1\r\nAccept: {header}\r\n\r\n".encode())
            if len(clients) == 1:
                assert gated.rendering.wait(10)
        wait_for(lambda: server.stats().requests == 6, 10, "six requests read")
        gated.gate.set()
        answers = [c.response() for c in clients]
    finally:
        gated.gate.set()
        for c in clients:
            c.close()
        server.stop()
    assert [status for status, _h, _b in answers] == [200] * 6
    types = [headers["content-type"] for _s, headers, _b in answers]
    assert len(set(types[:4])) == 1 and types[0].startswith("application/openmetrics-text")
    assert types[4].startswith("text/plain")
    assert gated.renders == 2  # the four OpenMetrics spellings, then the other version
    assert agent.renders == 1  # the text format
    assert server.stats().coalesced == 3


def test_probes_answer_while_every_render_thread_is_blocked(
    serve: Callable[..., MetricsServer], agent: FakeAgent
) -> None:
    agent.gate = threading.Event()
    server = serve(workers=2)
    variants = ["", "Accept-Encoding: gzip\r\n", "Accept: application/openmetrics-text\r\n"]
    scrapers = [Client(server) for _ in variants]  # three renders: one more than the pool
    for sock, header in zip(scrapers, variants, strict=True):
        sock.send(f"GET /metrics HTTP/1.1\r\n{header}\r\n".encode())
    assert agent.rendering.wait(10)
    for path, status in (("/healthz", 200), ("/readyz", 200), ("/", 200), ("/x", 404)):
        assert get(server, path).status == status
    agent.gate.set()
    for sock in scrapers:
        assert sock.response()[0] == 200
        sock.close()


def test_scrapes_that_arrive_during_a_render_share_it(
    serve: Callable[..., MetricsServer], agent: FakeAgent
) -> None:
    agent.gate = threading.Event()
    server = serve()
    first = Client(server)
    first.send(b"GET /metrics HTTP/1.1\r\n\r\n")
    assert agent.rendering.wait(10)
    rest = [Client(server) for _ in range(5)]
    for sock in rest:
        sock.send(b"GET /metrics HTTP/1.1\r\n\r\n")
    zipped = Client(server)  # another variant: its own render
    zipped.send(b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n")
    wait_for(lambda: server.stats().requests == 7, 10, "seven requests read")
    agent.gate.set()
    for sock in [first, *rest]:
        assert sock.response()[2] == BODY
        sock.close()
    assert gzip.decompress(zipped.response()[2]) == BODY
    zipped.close()
    assert (agent.renders, server.stats().coalesced) == (2, 5)
    assert get(server, "/metrics").status == 200  # nothing kept: a later scrape renders anew
    assert agent.renders == 3


def test_a_client_that_leaves_mid_answer_is_routine(
    serve: Callable[..., MetricsServer], agent: FakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    agent.body = BIG
    server = serve()
    caplog.set_level(logging.DEBUG, logger="gpuscope.server")
    for _ in range(3):
        sock = Client(server, rcvbuf=4096)
        sock.send(b"GET /metrics HTTP/1.1\r\n\r\n")
        sock.file.read(100)
        sock.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset, mid-body
    wait_for(lambda: server.stats().open_connections == 0, 10, "the server to drop the clients")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    gone = [r for r in caplog.records if "went away mid-answer" in r.getMessage()]
    assert gone and all(r.levelno == logging.DEBUG and r.exc_info is None for r in gone)
    assert get(server, "/healthz").status == 200


# Deadlines and the connection cap.


def test_header_deadline_closes_a_silent_or_slow_client(
    serve: Callable[..., MetricsServer],
) -> None:
    server = serve(header_timeout=0.3)
    with Client(server) as silent, Client(server) as slow:
        slow.send(b"GET /metr")
        assert silent.closed_by_server()
        assert slow.closed_by_server()
    assert server.stats().header_timeouts == 2


def test_idle_deadline_closes_a_kept_alive_connection(serve: Callable[..., MetricsServer]) -> None:
    server = serve(idle_timeout=0.3, header_timeout=30)
    with Client(server) as sock:
        sock.send(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert sock.response()[0] == 200
        assert sock.closed_by_server()
    assert server.stats().idle_timeouts == 1


def test_write_deadline_closes_a_client_that_never_reads(
    serve: Callable[..., MetricsServer], agent: FakeAgent
) -> None:
    agent.body = BIG
    server = serve(write_timeout=0.5)
    with Client(server, rcvbuf=4096) as sock:
        sock.send(b"GET /metrics HTTP/1.1\r\n\r\n")
        wait_for(lambda: server.stats().write_timeouts == 1, 10, "the write deadline")
    wait_for(lambda: server.stats().open_connections == 0, 10, "the connection to close")


def test_at_the_cap_the_longest_waiting_connection_makes_room(
    serve: Callable[..., MetricsServer],
) -> None:
    server = serve(max_connections=4)
    idle = [Client(server) for _ in range(4)]
    wait_for(lambda: server.stats().open_connections == 4, 10, "four connections")
    assert get(server, "/healthz").status == 200  # a fifth: the oldest idle one is closed
    assert idle[0].closed_by_server()
    assert server.stats().evicted == 1
    for sock in idle:
        sock.close()


def test_at_the_cap_with_every_connection_answering_a_new_one_is_closed(
    serve: Callable[..., MetricsServer], agent: FakeAgent
) -> None:
    agent.gate = threading.Event()
    server = serve(max_connections=2)
    busy = [Client(server) for _ in range(2)]
    for sock in busy:
        sock.send(b"GET /metrics HTTP/1.1\r\n\r\n")
    wait_for(lambda: server.stats().requests == 2, 10, "two scrapes in flight")
    with Client(server) as extra:
        assert extra.closed_by_server()
    assert server.stats().rejected == 1
    agent.gate.set()
    for sock in busy:
        assert sock.response()[2] == BODY
        sock.close()


def test_stop_closes_every_socket_and_thread(serve: Callable[..., MetricsServer]) -> None:
    before = threading.active_count()
    server = serve(workers=3)
    assert threading.active_count() == before + 1  # the loop; render threads come with renders
    clients = [Client(server) for _ in range(5)]
    clients[0].send(b"GET /healthz HTTP/1.1\r\n\r\n")
    clients[0].response()
    for _ in range(3):  # one scraper at a time: one render thread, reused
        clients[1].send(b"GET /metrics HTTP/1.1\r\n\r\n")
        clients[1].response()
    assert threading.active_count() == before + 2
    server.stop()
    assert all(client.closed_by_server() for client in clients)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5)
    wait_for(lambda: threading.active_count() == before, 10, "the server's threads to end")
    for sock in clients:
        sock.close()


def test_stop_does_not_wait_for_a_hung_render(
    serve: Callable[..., MetricsServer], agent: FakeAgent
) -> None:
    agent.gate = threading.Event()  # never set before stop: a collection stuck in a call
    server = serve()
    client = Client(server)
    client.send(b"GET /metrics HTTP/1.1\r\n\r\n")
    assert agent.rendering.wait(10)
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    stopper.join(15)
    assert not stopper.is_alive(), "stop() waited for the hung render"
    assert client.closed_by_server()
    client.close()


def test_all_addresses_fall_back_to_ipv4_on_a_host_without_ipv6(
    serve: Callable[..., MetricsServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuscope.agent.serve import server as server_module

    real = server_module._listen

    def no_ipv6(family: int, *args: Any, **kwargs: Any) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *args, **kwargs)

    monkeypatch.setattr(server_module, "_listen", no_ipv6)
    server = serve(("", 0))
    assert server.address[0] == "0.0.0.0"
    assert get(server, "/healthz").status == 200
    with pytest.raises(OSError):  # [::] asked for IPv6 by name: no silent fallback
        MetricsServer(("::", 0), CollectorRegistry(), lambda: b"", lambda: True)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET http://node:9400/metrics?x=1 HTTP/1.1\r\n\r\n",  # absolute form (RFC 9112 3.2.2)
        b"GET /metrics HTTP/1.1\n\n",  # bare line feeds, as typed into nc
        b"\r\nGET /metrics HTTP/1.1\r\nHost: node\r\n\r\n",  # a stray CRLF first
    ],
)
def test_lenient_request_forms_still_get_metrics(
    serve: Callable[..., MetricsServer], request_bytes: bytes
) -> None:
    server = serve()
    with Client(server) as sock:
        sock.send(request_bytes)
        assert sock.response()[:3:2] == (200, BODY)


def test_the_text_format_is_served_with_prometheus_clients_content_type() -> None:
    """The server names the text format's type itself, so that a text scrape never imports
    prometheus_client (issue #24); it must stay what the pinned release names."""
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    from gpuscope.agent.serve.server import CONTENT_TYPE_TEXT

    assert CONTENT_TYPE_TEXT == CONTENT_TYPE_LATEST


def test_reason_phrases_are_the_standard_library_s() -> None:
    """The server writes its usual statuses' reason phrases without importing `http`; they
    are http.HTTPStatus's, and any other status still gets its phrase."""
    from http import HTTPStatus

    from gpuscope.agent.serve.http_wire import _REASONS, reason_phrase

    for status in (*_REASONS, 418, 502):
        assert reason_phrase(status) == HTTPStatus(status).phrase

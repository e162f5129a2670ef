"""The HTTP endpoint: /metrics, /healthz (the process serves) and /readyz (first full
collection done), built to hold under abuse.

One event-loop thread owns every connection: it reads requests, enforces the limits and
answers the probes itself. Only a complete /metrics request goes to a small pool of render
threads, because rendering blocks while the agent collects (requests that arrive during a
render share it). So a slow scrape never delays a probe, and a thousand silent or slowloris
connections cost a few kilobytes each instead of a thread each (the threaded server this
replaced held 1,012 threads for 1,000 idle connections). Every wait has a deadline and
every buffer a cap; the limits are constructor keywords, documented in
docs/architecture.md ("The HTTP server").

The loop is agent/serve/selector_loop.py's, or asyncio's when TLS is configured
(agent/serve/asyncio_loop.py): only TLS needs asyncio, whose import every start would pay.

With a web configuration (`--web-config-file`, agent/serve/web_config.py) the loop serves
TLS and checks basic auth. The TLS handshake runs inside the connection's header deadline:
a connection is admitted and its deadline started when TCP accepts it, and the handshake is
then started on it, so a client that never finishes its handshake is cut exactly like one
that never finishes its request, and counts against `max_connections` meanwhile. Basic
auth is checked before routing, on every path but /healthz and /readyz (the kubelet's
probes carry no credentials; they show no workload data): a remembered success is answered
on the loop, a new one is checked with bcrypt on a thread of its own, in an order that lets
no flood of wrong passwords starve a right one (agent/serve/credential_checks.py).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import gzip
import ipaddress
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpuscope.agent.runtime.options import ConfigError
from gpuscope.agent.serve.credential_checks import CredentialChecks, Verdict, client_key
from gpuscope.agent.serve.http_wire import (
    Request,
    RequestError,
    accepts_gzip,
    find_head_end,
    parse_head,
    response_head,
)
from gpuscope.agent.serve.selector_loop import SelectorLoop
from gpuscope.agent.serve.web_config import (
    BasicAuth,
    RateLimit,
    WebConfig,
    load_web_config,
    parse_basic_authorization,
)

if TYPE_CHECKING:
    import ssl

    from prometheus_client.registry import CollectorRegistry

__all__ = ["MetricsServer", "ServerStats", "parse_listen_address"]

log = logging.getLogger("gpuscope.server")

_HOSTNAME_LABEL = "abcdefghijklmnopqrstuvwxyz0123456789-"
_TEXT = "text/plain; charset=utf-8"
# The text format's type: prometheus_client's CONTENT_TYPE_LATEST in the pinned release
# (tests/unit/agent/test_server.py compares them), named here so that a text scrape never
# imports prometheus_client; OpenMetrics does, through `choose_encoder`.
CONTENT_TYPE_TEXT = "text/plain; version=1.0.0; charset=utf-8"
_INDEX = b"<html><body><h1>gpuscope</h1><a href='/metrics'>/metrics</a></body></html>\n"
# Served without credentials (and without the rate limit): the kubelet's probes send none.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def parse_listen_address(flag_name: str, text: str) -> tuple[str, int]:
    """`[HOST]:PORT` -> (host, port), host "" meaning every address (dual-stack where the
    host has IPv6). Accepts `:9400`, `0.0.0.0:9400`, `127.0.0.1:9400`, `[::1]:9400`,
    `[::]:9400` and host names; an IPv6 address must be in brackets, because `::1:9400`
    is itself a valid IPv6 address. Raises ConfigError with one line naming the flag."""
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ConfigError(f"{flag_name}: unclosed '[' in {text!r} (expected [IPV6]:PORT)")
        host, rest = text[1:close], text[close + 1 :]
        if not rest.startswith(":"):
            raise ConfigError(f"{flag_name}: expected [IPV6]:PORT, got {text!r}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"{flag_name}: {host!r} is not an IPv6 address") from None
        return host, _port(flag_name, rest[1:])
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ConfigError(f"{flag_name}: expected [HOST]:PORT, got {text!r}")
    if ":" in host:
        raise ConfigError(
            f"{flag_name}: an IPv6 address needs brackets, e.g. [::1]:9400, got {text!r}"
        )
    if host and not _valid_host(host):
        raise ConfigError(f"{flag_name}: {host!r} is not an IPv4 address or host name")
    return host, _port(flag_name, port_text)


def _port(flag_name: str, text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ConfigError(f"{flag_name}: port must be a number, got {text!r}")
    port = int(text)
    if port > 65535:
        raise ConfigError(f"{flag_name}: port must be 0-65535, got {port}")
    return port


def _valid_host(host: str) -> bool:
    """An IPv4 literal or an RFC 1123 host name (resolved at bind time, not here)."""
    try:
        ipaddress.IPv4Address(host)
        return True
    except ValueError:
        pass
    labels = host.rstrip(".").lower().split(".")
    if len(host) > 253 or all(label.isdigit() for label in labels):
        return False  # 300.1.1.1 is a bad address, not a name
    return all(
        0 < len(label) <= 63
        and all(c in _HOSTNAME_LABEL for c in label)
        and not label.startswith("-")
        and not label.endswith("-")
        for label in labels
    )


def bind_listener(host: str, port: int, backlog: int) -> socket.socket:
    """A listening, non-blocking TCP socket for `host`, as parse_listen_address returns it.

    "" and "::" bind the IPv6 wildcard with IPV6_V6ONLY off, so IPv4 clients connect too;
    on a host without IPv6, "" falls back to 0.0.0.0. A host name binds the first of its
    addresses that binds. Raises OSError (EADDRINUSE, a name that does not resolve...)."""
    if host in ("", "::"):
        try:
            return _listen(socket.AF_INET6, ("::", port), backlog, dual_stack=True)
        except OSError as exc:
            no_ipv6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT)
            if host or exc.errno not in no_ipv6:
                raise
            log.info("no IPv6 on this host (%s): listening on IPv4 only", exc.strerror)
            return _listen(socket.AF_INET, ("0.0.0.0", port), backlog)
    last: OSError | None = None
    # An ASCII host goes as bytes: getaddrinfo() encodes a str with the "idna" codec, which
    # leaves ASCII names as they are and whose import (with stringprep and unicodedata) costs
    # a start about 1 ms. parse_listen_address admits only ASCII hosts but IPv6 scope ids.
    name = host.encode("ascii") if host.isascii() else host
    for family, _, _, _, sockaddr in socket.getaddrinfo(
        name, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
    ):
        try:
            return _listen(family, sockaddr, backlog)
        except OSError as exc:
            last = exc
    raise last or OSError(errno.EADDRNOTAVAIL, f"no address for {host}")


def _listen(
    family: int, sockaddr: tuple[object, ...], backlog: int, *, dual_stack: bool = False
) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


class _Loop(Protocol):
    """What the server and its connections use of their event loop: asyncio's (TLS) or
    agent/serve/selector_loop.py's (plain HTTP) answers it."""

    def time(self) -> float: ...
    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Any: ...
    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> Any: ...


class _Transport(Protocol):
    """What a connection uses of its transport (asyncio's, or selector_loop's)."""

    def write(self, data: bytes) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...
    def is_closing(self) -> bool: ...
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


@dataclass(frozen=True, slots=True)
class ServerStats:
    """Counters since start, for self-metrics and tests: how the limits were used."""

    open_connections: int
    accepted: int
    rejected: int  # closed at once: the cap was reached and every connection was answering
    evicted: int  # idle or unfinished connections closed to make room under the cap
    header_timeouts: int
    idle_timeouts: int
    write_timeouts: int
    requests: int
    coalesced: int  # /metrics requests answered by a render already in flight
    errors: int  # requests answered 4xx/5xx by the server's own rules (not 404)
    tls_errors: int  # TLS handshakes that failed (no or bad client certificate, not TLS...)
    unauthorized: int  # requests answered 401 (no, malformed or wrong credentials)
    rate_limited: int  # requests answered 429 (the web configuration's rate_limit)
    auth_busy: int  # requests answered 503: no room to check their new credentials


@dataclass(frozen=True, slots=True)
class _Answer:
    """An answer as the server decides it. Writing it adds a Content-Type where `headers` has
    none, the web configuration's headers, and the length."""

    status: int
    body: bytes
    headers: list[tuple[str, str]]


class _State(enum.Enum):
    HEAD = "reading a request head"  # header deadline running
    IDLE = "idle between requests"  # keep-alive deadline running
    BUSY = "answering"  # rendering, or waiting for the client to take the answer
    CLOSED = "closed"


class MetricsServer:
    """Serves /metrics, /healthz, /readyz and / on one event-loop thread (see the module
    docstring). Binds in the constructor, so a port conflict raises OSError at once;
    `start()` begins serving; `stop()` closes every socket.

    Limits (keyword arguments, defaults in parentheses; docs/architecture.md says why):
    `max_connections` (1024) open at once, beyond which the connection that has waited
    longest without being answered is closed to make room, or the new one if all are
    being answered; `header_timeout` (10 s) to send a complete request head, from the
    connection's start or from a request's first byte; `idle_timeout` (90 s) between
    requests on a kept-alive connection, above the longest usual scrape interval (60 s)
    so a scraper keeps its connection; `write_timeout` (30 s) for a client to take an
    answer; `max_request_bytes` (16 KiB) of request line and headers, else 431;
    `max_body_bytes` (1 KiB) of request body, else 413; `workers` (4) render threads;
    `backlog` (512) pending connections, a burst of scrapers at once.

    `health`, when given, adds its text to the /healthz body; it is called on the event
    loop and must not block. `web`, when given, turns on what it configures: TLS (and
    client certificates), basic auth, extra response headers and the rate limit; its files
    are checked for changes every `web_reload_interval` seconds (`_WebReloader`).
    """

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry | Callable[[], CollectorRegistry],
        render_text: Callable[[], bytes],
        ready: Callable[[], bool],
        *,
        health: Callable[[], str] | None = None,
        web: WebConfig | None = None,
        web_reload_interval: float = 10.0,
        max_connections: int = 1024,
        header_timeout: float = 10.0,
        idle_timeout: float = 90.0,
        write_timeout: float = 30.0,
        max_request_bytes: int = 16 * 1024,
        max_body_bytes: int = 1024,
        workers: int = 4,
        backlog: int = 512,
    ) -> None:
        self.registry = registry
        self.render_text = render_text
        self.is_ready = ready
        self.health = health
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        self.write_timeout = write_timeout
        self.max_request_bytes = max_request_bytes
        self.max_body_bytes = max_body_bytes
        self._backlog = backlog
        self._sock = bind_listener(address[0], address[1], backlog)
        bound = self._sock.getsockname()
        self._address = (str(bound[0]), int(bound[1]))
        self._workers = _Workers(workers)
        self.web = web
        self.tls: ssl.SSLContext | None = web.tls if web is not None else None
        self.extra_headers = list(web.headers) if web is not None else []
        self._auth = BasicAuth(web.users) if web is not None and web.users else None
        self._checks = CredentialChecks()  # bcrypt, one check at a time
        self._reloader = (
            _WebReloader(web, self._auth, self._reloaded, web_reload_interval)
            if web is not None
            else None
        )
        self._bucket = _Bucket(web.rate_limit) if web is not None and web.rate_limit else None
        self._connections: set[_Connection] = set()
        self._counts = dict.fromkeys(ServerStats.__slots__, 0)
        self._full = False
        self._inflight: dict[tuple[str, bool], list[tuple[_Connection, Request]]] = {}
        self._render_error: str | None = None
        self._render_lock = threading.Lock()
        self._loop_error: str | None = None
        self._loop: _Loop | None = None
        self._request_stop: Callable[[], object] | None = None
        self._serving = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (what `:0` picked)."""
        return self._address[1]

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port): "::" for dual-stack, "0.0.0.0" for IPv4 only."""
        return self._address

    def stats(self) -> ServerStats:
        counts = dict(self._counts, open_connections=len(self._connections))
        return ServerStats(**counts)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def start(self) -> None:
        self._workers.start()
        if self.web is not None:
            self._checks.start()
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._thread.start()
        if not self._serving.wait(10):
            raise RuntimeError("the HTTP server's event loop did not start")

    def stop(self) -> None:
        """Close the listening socket and every connection, then end the threads. A render
        still running (a hung collection) is abandoned; its thread is a daemon."""
        request_stop = self._request_stop
        if request_stop is not None and self._thread is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                request_stop()
            self._thread.join(10)
        if self._reloader is not None:
            self._reloader.stop()
        self._sock.close()
        self._workers.stop()
        self._checks.stop()

    # The event loop thread: asyncio's loop for TLS, else selector_loop's (which says why).

    def _run(self) -> None:
        if self.tls is not None:
            from gpuscope.agent.serve import asyncio_loop

            asyncio_loop.run(self)
            return
        loop = SelectorLoop(self.on_loop_error)
        try:
            loop.serve(self.listener, self.new_connection, self.backlog)
            self.running(loop, loop.stop)
            loop.run_until_stopped()
            loop.stop_serving(self.listener)
            self.kill_connections()
            for _ in range(3):  # let the aborted transports run connection_lost
                loop.run_once(0.0)
        finally:
            loop.close()

    # For the loop modules.

    @property
    def listener(self) -> socket.socket:
        """The bound, listening, non-blocking socket the loop accepts on."""
        return self._sock

    @property
    def backlog(self) -> int:
        return self._backlog

    def new_connection(self) -> _Connection:
        return _Connection(self)

    @property
    def loop(self) -> _Loop:
        """The running loop (connections exist only while it runs)."""
        assert self._loop is not None
        return self._loop

    def running(self, loop: _Loop, request_stop: Callable[[], object]) -> None:
        """The loop accepts: `request_stop`, from any thread, makes it stop."""
        self._loop = loop
        self._request_stop = request_stop
        self._serving.set()
        if self._reloader is not None:
            self._reloader.start()

    def kill_connections(self) -> None:
        for connection in list(self._connections):
            connection.kill()

    def on_loop_error(self, loop: object, context: dict[str, Any]) -> None:
        """The loop reports here what it cannot hand to a caller: accept() out of file
        descriptors, a bug in a protocol callback (which closes that one connection). One
        line per change of message, with the traceback only at debug level."""
        exc = context.get("exception")
        message = f"{context.get('message', 'event loop error')}: {exc!r}"
        level = logging.WARNING if message != self._loop_error else logging.DEBUG
        self._loop_error = message
        log.log(level, "http: %s", message)
        if isinstance(exc, BaseException):
            log.debug("http: traceback", exc_info=exc)

    def count(self, name: str) -> None:
        self._counts[name] += 1

    def admit(self, connection: _Connection) -> bool:
        """Register a new connection, making room under the cap if needed: the connection
        that has waited longest without being answered (a silent or slowloris client, an
        idle keep-alive) is closed; if every one is being answered, the new one is."""
        if len(self._connections) >= self.max_connections:
            if not self._full:
                self._full = True
                log.warning(
                    "http: %d connections open (the limit): closing the longest-waiting ones",
                    len(self._connections),
                )
            waiting = [c for c in self._connections if c.state in (_State.HEAD, _State.IDLE)]
            if not waiting:
                self.count("rejected")
                return False
            min(waiting, key=lambda c: c.since).abort()
            self.count("evicted")
        self._connections.add(connection)
        self.count("accepted")
        return True

    def forget(self, connection: _Connection) -> None:
        self._connections.discard(connection)
        if self._full and len(self._connections) < self.max_connections * 0.9:
            self._full = False
            log.info("http: %d connections open, below the limit again", len(self._connections))

    def _reloaded(self, web: WebConfig, auth: BasicAuth | None) -> None:
        """From the reloader's thread: use `web` for the connections accepted from now on
        (those open keep their TLS session)."""
        loop = self._loop
        if loop is None:
            return

        def apply() -> None:
            self.web = web
            self.tls = web.tls
            self.extra_headers = list(web.headers)
            self._auth = auth
            self._bucket = _Bucket(web.rate_limit) if web.rate_limit else None

        with contextlib.suppress(RuntimeError):  # the loop has ended: nothing to apply
            loop.call_soon_threadsafe(apply)

    # Access: rate limit and basic auth, before routing.

    def check_access(self, request: Request) -> _Answer | tuple[str, bytes] | None:
        """None: serve the request. An answer: refuse with it (401, 429). A (user, password)
        pair: credentials not verified before, to check with bcrypt (`verify_for`)."""
        if request.path in OPEN_PATHS:
            return None
        if self._bucket is not None and not self._bucket.take(time.monotonic()):
            self.count("rate_limited")
            return _Answer(429, b"too many requests\n", [])
        if self._auth is None:
            return None
        credentials = parse_basic_authorization(request.headers.get("authorization", ""))
        if credentials is None:
            return self.unauthorized()
        if self._auth.cached(*credentials):
            return None
        return credentials

    def unauthorized(self) -> _Answer:
        self.count("unauthorized")
        return _Answer(401, b"Unauthorized\n", [("WWW-Authenticate", "Basic")])

    def verify_for(self, connection: _Connection, request: Request, user: str, pw: bytes) -> None:
        """Queue a bcrypt check of the credentials (agent/serve/credential_checks.py), then hand
        the verdict to `connection` on the loop. The check reads the configuration in force
        when its turn comes: a reload while it waited decides against the new hashes."""
        loop = self._loop
        assert loop is not None

        def check() -> bool:
            auth = self._auth
            return auth is None or auth.verify(user, pw)  # None: basic auth was turned off

        def done(verdict: Verdict) -> None:
            try:
                loop.call_soon_threadsafe(connection.verified, request, verdict)
            except RuntimeError:
                log.debug("http: a credential check finished after the server stopped")

        self._checks.submit(client_key(connection.peer), check, done)

    def checks_busy(self) -> _Answer:
        self.count("auth_busy")
        return _Answer(503, b"too many credential checks waiting\n", [("Retry-After", "1")])

    # Answers.

    def route(self, request: Request) -> _Answer | None:
        """The answer to a request, on the loop; None for /metrics, which renders in the
        pool (see `render`)."""
        if request.method not in ("GET", "HEAD"):
            return _Answer(405, b"method not allowed\n", [("Allow", "GET, HEAD")])
        if request.path == "/metrics":
            return None
        if request.path == "/healthz":
            return _Answer(200, b"ok\n" + self._health_text(), [])
        if request.path == "/readyz":
            ready = self.is_ready()
            return _Answer(200 if ready else 503, b"ready\n" if ready else b"not ready\n", [])
        if request.path == "/":
            return _Answer(200, _INDEX, [("Content-Type", "text/html; charset=utf-8")])
        return _Answer(404, b"not found\n", [])

    def _health_text(self) -> bytes:
        if self.health is None:
            return b""
        try:
            text = self.health()
        except Exception as exc:  # noqa: BLE001 - /healthz answers while the loop runs
            text = f"health details unavailable: {type(exc).__name__}: {exc}"
        if text and not text.endswith("\n"):
            text += "\n"
        return text.encode("utf-8", "replace")

    def render(self, request: Request) -> _Answer:
        """/metrics, on a render thread: the text format, or OpenMetrics when `Accept`
        asks for it, gzipped when `Accept-Encoding` allows. A failing render answers 500
        and is logged once per change of error, not once per scrape."""
        accept = _openmetrics_accept(request)
        try:
            if accept:
                encoder, content_type = _choose_encoder(accept)
                registry = self.registry
                body = encoder(registry() if callable(registry) else registry)
            else:
                content_type = CONTENT_TYPE_TEXT
                body = self.render_text()
        except Exception as exc:  # noqa: BLE001 - any render failure: a 500, logged once
            self._render_failed(exc)
            return _Answer(500, b"internal error rendering metrics\n", [])
        self._render_worked()
        headers = [("Content-Type", content_type), ("Vary", "Accept-Encoding")]
        if accepts_gzip(request.headers.get("accept-encoding", "")):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        return _Answer(200, body, headers)

    def _render_failed(self, exc: Exception) -> None:
        message = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        with self._render_lock:
            changed, self._render_error = message != self._render_error, message
        if changed:
            log.error("rendering /metrics failed, answering 500: %s", message)
        else:
            log.debug("rendering /metrics failed again: %s", message)

    def _render_worked(self) -> None:
        with self._render_lock:
            failed, self._render_error = self._render_error, None
        if failed is not None:
            log.info("rendering /metrics works again")

    def render_for(self, connection: _Connection, request: Request) -> None:
        """Render /metrics for `connection`, on the loop. A request that arrives while a
        render of the same variant (negotiated format, gzip) is in flight waits for it and
        shares its answer: a burst of scrapers costs one render, not one each, and no
        answer is older than the render in flight when its request arrived. Nothing is
        kept once answered (how fresh a collection must be is the agent's business)."""
        key = (
            _negotiated_format(request),
            accepts_gzip(request.headers.get("accept-encoding", "")),
        )
        waiting = self._inflight.get(key)
        if waiting is not None:
            waiting.append((connection, request))
            self.count("coalesced")
            return
        self._inflight[key] = [(connection, request)]
        loop = self._loop
        assert loop is not None

        def job() -> Callable[[], None]:
            answer = self.render(request)

            def hand_back() -> None:
                try:
                    loop.call_soon_threadsafe(self._rendered, key, answer)
                except RuntimeError:
                    log.debug("http: a render finished after the server stopped")

            return hand_back

        self._workers.submit(job)

    def _rendered(self, key: tuple[str, bool], answer: _Answer) -> None:
        for connection, request in self._inflight.pop(key, []):
            connection.rendered(request, answer)


def _negotiated_format(request: Request) -> str:
    """The content type `render` answers `request` with ("" for the text format): renders
    are shared by it, not by the `Accept` header's spelling, so scrapers that write the
    same wish differently (order, spaces, q-values, other types beside it) share one."""
    accept = _openmetrics_accept(request)
    return _choose_encoder(accept)[1] if accept else ""


def _choose_encoder(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """prometheus_client's encoder and content type for an OpenMetrics `Accept` header."""
    from prometheus_client.exposition import choose_encoder

    return choose_encoder(accept)


def _openmetrics_accept(request: Request) -> str:
    """The `Accept` header when it asks for OpenMetrics, else "" (the text format)."""
    accept = request.headers.get("accept", "")
    return accept if "application/openmetrics-text" in accept else ""


class _Connection:
    """One client connection, driven by the event loop's callbacks.

    States: HEAD (bytes of a request arriving, under the header deadline), IDLE (kept alive
    between requests, under the idle deadline), BUSY (rendering, or waiting for the client
    to take the answer; reading is paused so a client cannot queue unbounded requests),
    CLOSED. One request is answered at a time, in order, so pipelined requests work."""

    def __init__(self, server: MetricsServer) -> None:
        self.server = server
        self.state = _State.HEAD
        self.since = 0.0
        self.transport: _Transport | None = None
        self.peer = "?"
        self._buffer = bytearray()
        self._scanned = 0
        self._timer: _Cancellable | None = None
        self._write_paused = False
        self._close_after = False
        self._tls_started = False
        self._tls_up = False

    def connection_made(self, transport: _Transport) -> None:
        """Called once for TCP, and once more with the TLS transport when the handshake
        completes (the header deadline started at the first call keeps running)."""
        if self._tls_started:
            self._tls_ready(transport)
            return
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) else "?"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Header and body go out in two writes; with Nagle's algorithm the body would
            # wait for the peer's delayed ACK of the head, adding milliseconds to a scrape.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.server.admit(self):
            self.state = _State.CLOSED
            transport.abort()
            return
        self._enter(_State.HEAD, self.server.header_timeout, self._header_timeout)
        if self.server.tls is not None:
            from gpuscope.agent.serve import asyncio_loop  # TLS: the loop is asyncio's

            self._tls_started = True
            asyncio_loop.start_tls(
                self, transport, self.server.tls, int(self.server.header_timeout) + 5
            )

    def handshake_done(self, error: BaseException | None) -> None:
        """The TLS handshake ended, `error` or not. A failed handshake never reaches
        connection_lost (the TLS layer tells only a protocol it connected): forget the
        connection here. Failed means this protocol was not connected by the time the
        handshake ended, whatever `error` says (a socket closed mid-handshake can end it with
        none)."""
        if self._tls_up or self.state is _State.CLOSED:
            return
        log.debug("http: TLS handshake with %s failed: %r", self.peer, error)
        self.server.count("tls_errors")
        self.state = _State.CLOSED
        self._cancel_timer()
        self.server.forget(self)

    def _tls_ready(self, transport: _Transport) -> None:
        self._tls_up = True
        self.transport = transport
        if self.state is _State.CLOSED:
            transport.abort()
            return
        web = self.server.web
        if web is not None and not web.san_allowed(transport.get_extra_info("peercert")):
            log.debug("http: client certificate of %s has none of client_allowed_sans", self.peer)
            self.server.count("tls_errors")
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is _State.BUSY and exc is not None:
            log.debug("http: client %s went away mid-answer: %s", self.peer, exc)
        self.state = _State.CLOSED
        self._cancel_timer()
        self.server.forget(self)

    def data_received(self, data: bytes) -> None:
        if self.state is _State.CLOSED:
            return
        self._buffer += data
        if self.state is _State.IDLE:
            self._enter(_State.HEAD, self.server.header_timeout, self._header_timeout)
        if self.state is _State.HEAD:
            self._process()

    def eof_received(self) -> bool:
        """The client will send no more. Mid-answer, finish the answer and then close
        (`printf 'GET ...' | nc -N` half-closes); otherwise close now."""
        if self.state is _State.BUSY:
            self._close_after = True
            return True
        return False

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.state is _State.BUSY and self._timer is not None:
            self._after_answer()
            self._process()

    def abort(self) -> None:
        """Close now, discarding anything unsent. The connection leaves the server's set at
        once, so a burst of new connections at the cap never picks the same one twice."""
        self._close(graceful=False)

    def kill(self) -> None:
        """Abort whatever the state, a graceful close in progress included: stop()."""
        self.state = _State.CLOSED
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()

    def _close(self, *, graceful: bool) -> None:
        """Abort (the socket closes on the loop's next turn; the connection is forgotten
        now) or close gracefully (what is buffered is sent first, within the write
        deadline; the connection counts as open until it is gone)."""
        transport = self.transport
        if self.state is _State.CLOSED or transport is None:
            return
        self.state = _State.CLOSED
        self._cancel_timer()
        if graceful:
            transport.close()
            self._timer = self.server.loop.call_later(self.server.write_timeout, transport.abort)
        else:
            self.server.forget(self)
            transport.abort()

    # Reading requests.

    def _process(self) -> None:
        """Answer every complete request in the buffer, in order, while not busy."""
        while self.state is _State.HEAD:
            request = self._take_request()
            if request is None:
                return
            self.server.count("requests")
            access = self.server.check_access(request)
            if isinstance(access, _Answer):
                self._answer(request, access)
            elif access is not None:
                self._verify(request, *access)
            else:
                self._dispatch(request)

    def _dispatch(self, request: Request) -> None:
        answer = self.server.route(request)
        if answer is not None:
            self._answer(request, answer)
        else:
            self._render(request)

    def _verify(self, request: Request, user: str, password: bytes) -> None:
        self._enter(_State.BUSY, None, None)
        assert self.transport is not None
        self.transport.pause_reading()
        self.server.verify_for(self, request, user, password)

    def verified(self, request: Request, verdict: Verdict) -> None:
        if self.state is _State.CLOSED:
            return
        if verdict is Verdict.GOOD:
            self._dispatch(request)
        elif verdict is Verdict.WRONG:
            self._answer(request, self.server.unauthorized())
        else:
            self._answer(request, self.server.checks_busy())
        self._process()

    def _take_request(self) -> Request | None:
        server = self.server
        found = find_head_end(self._buffer, self._scanned)
        if found is None:
            if len(self._buffer) > server.max_request_bytes:
                self._refuse(431, "request head too large")
            else:
                self._scanned = max(0, len(self._buffer) - 3)
            return None
        head_end, body_start = found
        if head_end > server.max_request_bytes:
            self._refuse(431, "request head too large")
            return None
        try:
            request = parse_head(bytes(self._buffer[:head_end]), server.max_body_bytes)
        except RequestError as exc:
            self._refuse(exc.status, exc.reason)
            return None
        end = body_start + request.body_length
        if len(self._buffer) < end:
            return None  # a small body still arriving, under the same header deadline
        del self._buffer[:end]
        self._scanned = 0
        return request

    def _refuse(self, status: int, reason: str) -> None:
        """A request the server will not read further: answer and close."""
        log.debug("http: %s from %s: %s", status, self.peer, reason)
        self.server.count("requests")
        self.server.count("errors")
        self._close_after = True
        body = f"{reason}\n".encode()
        self._send(status, body, [("Content-Type", _TEXT)], head_only=False, version=(1, 1))

    def _render(self, request: Request) -> None:
        self._enter(_State.BUSY, None, None)
        assert self.transport is not None
        self.transport.pause_reading()
        self.server.render_for(self, request)

    def rendered(self, request: Request, answer: _Answer) -> None:
        if self.state is _State.CLOSED:
            log.debug("http: client %s left before its /metrics answer", self.peer)
            return
        self._answer(request, answer)
        self._process()

    # Writing answers.

    def _answer(self, request: Request, answer: _Answer) -> None:
        if answer.status >= 400 and answer.status != 404:
            self.server.count("errors")
        if not request.keep_alive:
            self._close_after = True
        headers = answer.headers
        if not any(name == "Content-Type" for name, _ in headers):
            headers = [("Content-Type", _TEXT), *headers]
        self._send(
            answer.status,
            answer.body,
            headers,
            head_only=request.method == "HEAD",
            version=request.version,
        )

    def _send(
        self,
        status: int,
        body: bytes,
        headers: list[tuple[str, str]],
        *,
        head_only: bool,
        version: tuple[int, int],
    ) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        keep = not self._close_after
        headers = [*headers, *self.server.extra_headers]
        transport.write(response_head(status, len(body), headers, keep_alive=keep, version=version))
        if not head_only and body:
            transport.write(body)
        self._enter(_State.BUSY, self.server.write_timeout, self._write_timeout)
        transport.pause_reading()
        if self._close_after:
            transport.close()  # flushes the answer first; the write deadline still runs
        elif not self._write_paused:
            self._after_answer()

    def _after_answer(self) -> None:
        """The answer has been handed to the kernel: wait for the next request."""
        assert self.transport is not None
        if self._close_after:
            return
        self._cancel_timer()
        self.transport.resume_reading()
        if self._buffer:
            self._enter(_State.HEAD, self.server.header_timeout, self._header_timeout)
        else:
            self._enter(_State.IDLE, self.server.idle_timeout, self._idle_timeout)

    # Deadlines.

    def _enter(
        self, state: _State, timeout: float | None, on_timeout: Callable[[], None] | None
    ) -> None:
        assert self.transport is not None
        self._cancel_timer()
        self.state = state
        loop = self.server.loop
        self.since = loop.time()
        if timeout is not None and on_timeout is not None:
            self._timer = loop.call_later(timeout, on_timeout)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_timeout(self) -> None:
        log.debug("http: %s sent no complete request in time, closing", self.peer)
        self.server.count("header_timeouts")
        self.abort()

    def _idle_timeout(self) -> None:
        self.server.count("idle_timeouts")
        self._close(graceful=True)

    def _write_timeout(self) -> None:
        log.debug("http: %s did not take its answer in time, closing", self.peer)
        self.server.count("write_timeouts")
        self.abort()


class _WebReloader:
    """Reads the web configuration again when the file or one of its certificate files
    changes, checked every `interval` seconds on a thread of its own. exporter-toolkit reads
    its file for every connection, so a renewed certificate (a cert-manager Secret, which
    the kubelet swaps in place) is served without a restart; so here, within `interval`.
    A file that no longer loads leaves the previous configuration in force, said once per
    change of error; so does turning TLS on or off, which changes the scheme every scraper
    is configured with and needs a restart. bcrypt's decoy hash is made here, off the loop.
    """

    def __init__(
        self,
        web: WebConfig,
        auth: BasicAuth | None,
        apply: Callable[[WebConfig, BasicAuth | None], None],
        interval: float,
    ) -> None:
        self._web = web
        self._auth = auth
        self._apply = apply
        self._interval = interval
        self._seen = web.fingerprint()
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="web-config", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.check()
            except Exception:  # a bug here must not end the thread, nor the agent
                log.exception("web config: checking for changes failed")

    def check(self) -> None:
        seen = self._web.fingerprint()
        if seen == self._seen:
            return
        self._seen = seen
        path = self._web.path
        try:
            web = load_web_config(path)
            if (web.tls is None) != (self._web.tls is None):
                raise ConfigError(
                    f"{path}: turning TLS {'off' if web.tls is None else 'on'} needs a restart"
                )
        except ConfigError as exc:
            if str(exc) != self._error:
                log.error("web config changed but cannot be used, keeping the previous: %s", exc)
            self._error = str(exc)
            return
        self._error = None
        self._web = web
        # Carried over: logins verified under hashes the new file keeps stay remembered.
        self._auth = BasicAuth(web.users, previous=self._auth) if web.users else None
        self._apply(web, self._auth)
        log.info("web config %s reloaded: %s", path, web.summary())


class _Bucket:
    """`rate_limit` as golang.org/x/time/rate does it: `burst` tokens to start, one more
    every `interval` seconds up to `burst`; a request takes one or is refused. Loop only."""

    def __init__(self, limit: RateLimit) -> None:
        self._interval = limit.interval
        self._burst = float(limit.burst)
        self._tokens = float(limit.burst)
        self._last: float | None = None

    def take(self, now: float) -> bool:
        if self._last is not None:
            self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
        self._last = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


_Job = Callable[[], Callable[[], None] | None]


class _Workers:
    """Up to `count` daemon render threads, each started when a job finds every existing one
    busy: an agent scraped by one Prometheus keeps one (the others would cost memory for
    nothing: issue #24), a burst of scrapes of different variants gets up to `count`. Not
    concurrent.futures: its threads are joined at interpreter exit, so one hung render
    would keep the process from exiting. Jobs in flight are bounded by the variants of
    /metrics (one render each at a time)."""

    def __init__(self, count: int) -> None:
        self._count = count
        # A job returns what hands its result back, called once the thread counts as idle
        # again: the client's next request then finds it free instead of starting another.
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job that no submitted job has claimed
        self._started = False

    def start(self) -> None:
        with self._lock:
            self._started = True

    def submit(self, job: _Job) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # claimed: a second job at once does not count on it too
            elif self._started and len(self._threads) < self._count:
                name = f"http-render-{len(self._threads)}"
                thread = threading.Thread(target=self._run, name=name, daemon=True)
                thread.start()
                self._threads.append(thread)
        self._jobs.put(job)

    def stop(self) -> None:
        """End the threads, waiting at most a second in all for renders in flight."""
        with self._lock:
            self._started = False
            threads = list(self._threads)
            self._threads.clear()
        for _ in threads:
            self._jobs.put(None)
        deadline = time.monotonic() + 1.0
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            hand_back: Callable[[], None] | None = None
            try:
                hand_back = job()
            except Exception:  # a bug here must not end the thread: the pool would shrink
                log.exception("http: render job failed")
            with self._lock:
                self._idle += 1
            if hand_back is not None:
                hand_back()

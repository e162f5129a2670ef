"""The plain-HTTP server's event loop: `selectors`, and what of asyncio the server uses.

Importing asyncio costs an agent's start about 8 ms of CPU, and the `ssl` it imports with it
(TLS or not) about 5 ms more, with libssl and libcrypto mapped for the process's life
(issue #24: the GPU-only agent is measured against nvitop-exporter's start). Only TLS needs
either: a server with TLS runs on asyncio (agent/serve/asyncio_loop.py), one without on
this loop. The connection logic is the same object on both (`_Connection` in
agent/serve/server.py), so this module implements exactly the part of asyncio's event
loop, transport and protocol contract that it uses, with asyncio's semantics:

- the loop: `time()`, `call_soon`, `call_later` (handles with `cancel()`),
  `call_soon_threadsafe` (RuntimeError once the loop is closed), and an exception
  handler called with asyncio's context dict (`message`, `exception`);
- accepting: up to `backlog` connections per turn; out of file descriptors (EMFILE,
  ENFILE, ENOBUFS, ENOMEM), accepting pauses for a second, reported once per pause;
- each connection's transport: `write` (sent at once if it can be, else buffered and sent
  as the socket drains; the protocol's `pause_writing()` above 64 KiB buffered,
  `resume_writing()` below 16 KiB), `pause_reading`/`resume_reading`, `close()` (no more
  reading; the buffer is sent, then the socket closes), `abort()` (closes at once, unsent
  bytes dropped), `is_closing()`, `get_extra_info("peername" | "sockname" | "socket")`;
- the protocol's callbacks: `connection_made` on the turn after accept, `data_received`,
  `eof_received` (a false answer closes the transport; a true one keeps it open for
  writing), `connection_lost(exc)` once, on a later turn than the close that caused it.
  An exception in a callback is reported to the handler and aborts that connection only.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import heapq
import itertools
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("gpuscope.server")

READ_SIZE = 256 * 1024  # what asyncio's selector transports read at once
WRITE_HIGH = 64 * 1024  # asyncio's default write-buffer limits
WRITE_LOW = 16 * 1024
ACCEPT_RETRY_DELAY = 1.0  # asyncio's, after accept() ran out of descriptors
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class ConnectionProtocol(Protocol):
    """What the loop calls on a connection (asyncio.Protocol's callbacks)."""

    def connection_made(self, transport: Any) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def eof_received(self) -> bool | None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


ExceptionHandler = Callable[["SelectorLoop", dict[str, Any]], None]


class Handle:
    """A callback the loop will run once, unless cancelled first."""

    __slots__ = ("_args", "_callback", "_cancelled", "_due", "_loop", "when")

    def __init__(
        self, loop: SelectorLoop, when: float, callback: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        self._loop = loop
        self.when = when
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._due = False  # a timer that left the heap: cancelling it sweeps nothing

    def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            if self.when and not self._due:  # a timer still in the heap
                self._loop._timer_cancelled()

    def cancelled(self) -> bool:
        return self._cancelled

    def _run(self) -> None:
        try:
            self._callback(*self._args)
        except Exception as exc:  # noqa: BLE001 - reported, the loop goes on (as asyncio's)
            self._loop.call_exception_handler(
                {"message": f"exception in callback {self._callback!r}", "exception": exc}
            )


class SelectorLoop:
    """One thread's loop over one selector; every method but `call_soon_threadsafe` and
    `stop` is called on that thread."""

    def __init__(self, exception_handler: ExceptionHandler | None = None) -> None:
        self._selector = selectors.DefaultSelector()
        self._ready: collections.deque[Handle] = collections.deque()
        self._timers: list[tuple[float, int, Handle]] = []
        self._order = itertools.count()  # ties in the timer heap run in scheduling order
        self._threadsafe: collections.deque[Handle] = collections.deque()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, self._drain_wakeups)
        self._handler = exception_handler
        self._stopping = False
        self._closed = False
        self._close_lock = threading.Lock()
        self._transports: set[Transport] = set()
        self._listeners: set[socket.socket] = set()
        self._cancelled_timers = 0

    # The loop's interface.

    def time(self) -> float:
        return time.monotonic()

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> Handle:
        handle = Handle(self, 0.0, callback, args)
        self._ready.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Handle:
        handle = Handle(self, self.time() + max(0.0, delay), callback, args)
        heapq.heappush(self._timers, (handle.when, next(self._order), handle))
        return handle

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> Handle:
        """From any thread. RuntimeError once the loop is closed, as asyncio's."""
        with self._close_lock:
            if self._closed:
                raise RuntimeError("the event loop is closed")
            handle = Handle(self, 0.0, callback, args)
            self._threadsafe.append(handle)
            with contextlib.suppress(BlockingIOError, InterruptedError):  # one is pending
                self._wake_writer.send(b"\0")
        return handle

    def stop(self) -> None:
        """From any thread: `run_until_stopped` returns after the turn in progress.
        RuntimeError once the loop is closed."""
        self.call_soon_threadsafe(self._set_stopping)

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        if self._handler is None:
            exc = context.get("exception")
            log.error("http: %s", context.get("message"), exc_info=exc)
            return
        try:
            self._handler(self, context)
        except Exception:  # a failing handler must not end the loop
            log.exception("http: the event loop's exception handler failed")

    # Serving.

    def serve(self, listener: socket.socket, factory: Callable[[], Any], backlog: int) -> None:
        """Accept on `listener` (bound, listening, non-blocking), a protocol from `factory`
        for each connection, until `stop_serving`."""
        self._listeners.add(listener)
        self._selector.register(
            listener, selectors.EVENT_READ, lambda: self._accept(listener, factory, backlog)
        )

    def stop_serving(self, listener: socket.socket) -> None:
        self._listeners.discard(listener)
        self._remove(listener)

    def run_until_stopped(self) -> None:
        self._stopping = False
        while not self._stopping:
            self.run_once()

    def run_once(self, timeout: float | None = None) -> None:
        """One turn: wait for sockets (at most until the next timer, or `timeout` if no
        timer is sooner), run their callbacks, the due timers, then what was ready."""
        if self._ready or self._threadsafe:
            wait: float | None = 0.0
        else:
            wait = timeout
            while self._timers and self._timers[0][2].cancelled():
                heapq.heappop(self._timers)[2]._due = True
                self._cancelled_timers = max(0, self._cancelled_timers - 1)
            if self._timers:
                until_timer = max(0.0, self._timers[0][0] - self.time())
                wait = until_timer if wait is None else min(wait, until_timer)
        for key, _events in self._selector.select(wait):
            try:
                key.data()
            except Exception as exc:  # noqa: BLE001 - reported, the loop goes on (as asyncio's)
                self.call_exception_handler(
                    {
                        "message": f"exception in a readiness callback of {key.fileobj!r}",
                        "exception": exc,
                    }
                )
        now = self.time()
        while self._timers and self._timers[0][0] <= now:
            _, _, handle = heapq.heappop(self._timers)
            handle._due = True
            if handle.cancelled():
                self._cancelled_timers = max(0, self._cancelled_timers - 1)
            else:
                self._ready.append(handle)
        while self._threadsafe:
            self._ready.append(self._threadsafe.popleft())
        for _ in range(len(self._ready)):  # what this turn's callbacks schedule runs next turn
            handle = self._ready.popleft()
            if not handle.cancelled():
                handle._run()

    def close(self) -> None:
        """Abort what is still open and release the selector; `call_soon_threadsafe` raises
        from now on."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        for transport in list(self._transports):
            transport.abort()
        for _ in range(2):  # their connection_lost callbacks
            self.run_once(0.0)
        self._selector.close()
        self._wake_reader.close()
        self._wake_writer.close()

    # Internals, for the transports.

    def _set_stopping(self) -> None:
        self._stopping = True

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _accept(self, listener: socket.socket, factory: Callable[[], Any], backlog: int) -> None:
        for _ in range(backlog):
            try:
                sock, _address = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise
                self.call_exception_handler(
                    {"message": "socket.accept() out of system resource", "exception": exc}
                )
                self._remove(listener)
                self.call_later(
                    ACCEPT_RETRY_DELAY, self._resume_accepting, listener, factory, backlog
                )
                return
            sock.setblocking(False)
            Transport(self, sock, factory())

    def _resume_accepting(
        self, listener: socket.socket, factory: Callable[[], Any], backlog: int
    ) -> None:
        if listener in self._listeners:  # not stop_serving()'d meanwhile
            self.serve(listener, factory, backlog)

    def _timer_cancelled(self) -> None:
        """Cancelled timers stay in the heap until due (a connection re-arms its deadline at
        every state change); past half the heap, and more than a few, they are swept."""
        self._cancelled_timers += 1
        if self._cancelled_timers > 64 and self._cancelled_timers * 2 > len(self._timers):
            self._timers = [entry for entry in self._timers if not entry[2].cancelled()]
            heapq.heapify(self._timers)
            self._cancelled_timers = 0

    def _watch(self, sock: socket.socket, events: int, callback: Callable[[], None]) -> None:
        """Call `callback` when `sock` is ready for `events` (read, write, or both: one
        callback dispatches on what the socket is registered for)."""
        try:
            self._selector.modify(sock, events, callback)
        except KeyError:
            self._selector.register(sock, events, callback)

    def _remove(self, sock: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):  # not registered, or closed
            self._selector.unregister(sock)


class Transport:
    """One accepted TCP connection (asyncio's selector socket transport, in part)."""

    def __init__(self, loop: SelectorLoop, sock: socket.socket, protocol: Any) -> None:
        self._loop = loop
        self._sock = sock
        self._protocol: ConnectionProtocol = protocol
        self._buffer = bytearray()
        self._reading = True
        self._read_paused = False
        self._closing = False
        self._lost = False
        self._protocol_paused = False
        self._extra: dict[str, Any] = {"socket": sock}
        try:
            self._extra["peername"] = sock.getpeername()
        except OSError:
            self._extra["peername"] = None
        try:
            self._extra["sockname"] = sock.getsockname()
        except OSError:
            self._extra["sockname"] = None
        loop._transports.add(self)
        loop.call_soon(self._start)

    def _start(self) -> None:
        if self._lost:
            return
        self._guard(self._protocol.connection_made, self)
        self._update_watch()  # nothing if the protocol closed or failed meanwhile

    # The transport's interface.

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        if self._closing or self._read_paused:
            return
        self._read_paused = True
        self._update_watch()

    def resume_reading(self) -> None:
        if self._closing or not self._read_paused:
            return
        self._read_paused = False
        self._update_watch()

    def write(self, data: bytes) -> None:
        """As asyncio's: accepted until the connection is lost, after a graceful close()
        too (its bytes go out before the socket closes); dropped after that."""
        if not data or self._lost:
            return
        if not self._buffer:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._fatal(exc)
                return
            data = data[sent:]
            if not data:
                return
        self._buffer += data
        self._update_watch()
        if not self._protocol_paused and len(self._buffer) > WRITE_HIGH:
            self._protocol_paused = True
            self._guard(self._protocol.pause_writing)

    def close(self) -> None:
        """No more reading; what is buffered is sent, then the socket closes."""
        if self._closing:
            return
        self._closing = True
        self._update_watch()
        if not self._buffer:
            self._lose(None)

    def abort(self) -> None:
        """Close now; what is buffered is dropped."""
        self._buffer.clear()
        self._closing = True
        self._lose(None)

    # Readiness.

    def _update_watch(self) -> None:
        if self._lost:
            return
        events = 0
        if self._reading and not self._read_paused and not self._closing:
            events |= selectors.EVENT_READ
        if self._buffer:
            events |= selectors.EVENT_WRITE
        if events:
            self._loop._watch(self._sock, events, self._ready)
        else:
            self._loop._remove(self._sock)

    def _ready(self) -> None:
        """The selector says the socket can be read or written: try both that apply. An
        error here (a bug, not the peer's doing) is reported and ends this connection, so it
        cannot leave a ready socket that the loop would wake for forever."""
        try:
            if self._buffer and not self._lost:
                self._write_ready()
            if self._reading and not self._read_paused and not self._closing and not self._lost:
                self._read_ready()
        except Exception as exc:  # noqa: BLE001 - one connection's failure ends that connection
            self._fatal(exc, report=True)

    def _read_ready(self) -> None:
        try:
            data = self._sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fatal(exc)
            return
        if data:
            self._guard(self._protocol.data_received, data)
            return
        # The peer will send no more.
        self._reading = False
        self._update_watch()
        keep_open = self._guard(self._protocol.eof_received)
        if not keep_open:
            self.close()

    def _write_ready(self) -> None:
        try:
            sent = self._sock.send(self._buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fatal(exc)
            return
        del self._buffer[:sent]
        if self._protocol_paused and len(self._buffer) <= WRITE_LOW:
            self._protocol_paused = False
            self._guard(self._protocol.resume_writing)
        if not self._buffer:
            if self._closing:
                self._lose(None)
            else:
                self._update_watch()

    # Ends.

    def _guard(self, callback: Callable[..., Any], *args: Any) -> Any:
        """A protocol callback: its exception is reported and aborts this connection
        (asyncio's "Fatal error: protocol.data_received() call failed."). Returns the
        callback's answer, or None if it raised."""
        try:
            return callback(*args)
        except Exception as exc:  # noqa: BLE001 - one connection's bug ends that connection
            self._loop.call_exception_handler(
                {"message": f"protocol.{callback.__name__}() call failed", "exception": exc}
            )
            self._fatal(exc, report=False)
            return None

    def _fatal(self, exc: Exception, *, report: bool = False) -> None:
        """A socket error (a reset, a broken pipe) ends the connection, passing the error
        to connection_lost; asyncio reports those only in debug mode."""
        if report:
            self._loop.call_exception_handler({"message": "fatal error", "exception": exc})
        self._buffer.clear()
        self._closing = True
        self._lose(exc)

    def _lose(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._loop._remove(self._sock)
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: Exception | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()
            self._loop._transports.discard(self)

"""gRPC unary calls over HTTP/2 on a unix socket: what the PodResources client needs, without
grpcio.

grpcio is 12 MB of resident code and eight threads in every agent for four unary calls on
one local socket. This speaks the same protocol (https://github.com/grpc/grpc/blob/master/
doc/PROTOCOL-HTTP2.md) with `h2`, the pure-Python HTTP/2 state machine: a POST to
`/<service>/<method>` with `content-type: application/grpc` and `te: trailers`, the request
as one length-prefixed message, the answer as one message and `grpc-status` /
`grpc-message` in the trailers (or in the headers of a trailers-only answer). Tests drive
it against grpcio's own server (tests/doubles/kubelet_server.py).

One connection, dialled lazily, carries the calls one at a time (a kubelet is asked a few
times a second at most). A connection the server closed while idle (a kubelet restart) is
found out by the next call, which dials again once before it fails.
"""

from __future__ import annotations

import enum
import errno
import socket
import struct
import threading
import time
import urllib.parse
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

READ_SIZE = 65536
WINDOW = 16 * 1024 * 1024  # receive window: a whole answer without waiting on WINDOW_UPDATEs


class Code(enum.IntEnum):
    """gRPC status codes (grpc/include/grpcpp/impl/codegen/status_code_enum.h)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# HTTP statuses of answers that are not gRPC's own, as gRPC clients map them
# (doc/http-grpc-status-mapping.md).
_HTTP_CODES = {
    400: Code.INTERNAL,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.UNIMPLEMENTED,
    429: Code.UNAVAILABLE,
    502: Code.UNAVAILABLE,
    503: Code.UNAVAILABLE,
    504: Code.UNAVAILABLE,
}


class RpcFailure(Exception):
    """The call failed with a gRPC status: the server's, or the client's own."""

    def __init__(self, code: Code, details: str = "") -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class Unreachable(Exception):
    """connect(2) to the socket failed; `strerror` is its reason."""

    def __init__(self, strerror: str) -> None:
        super().__init__(strerror)
        self.strerror = strerror


class _Closed(Exception):
    """The server closed the connection (or reset it) before answering."""


class Channel:
    """Unary calls to one unix socket. Thread-safe; calls are serialized."""

    def __init__(self, path: Path, *, max_message_bytes: int) -> None:
        self.path = path
        self.max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._conn: h2.connection.H2Connection | None = None

    def unary(self, method: str, request: bytes, timeout: float) -> bytes:
        """Call `method` ("/package.Service/Method") with a serialized request message and
        return the serialized answer. Raises Unreachable, or RpcFailure (DEADLINE_EXCEEDED
        when `timeout` seconds pass, UNAVAILABLE when the connection breaks)."""
        deadline = time.monotonic() + timeout
        if not self._lock.acquire(timeout=timeout):
            raise RpcFailure(Code.DEADLINE_EXCEEDED, "waiting for another call")
        try:
            answer = self._exchange(method, request, deadline)
        finally:
            self._lock.release()
        # The stream ended cleanly: a status of the server's own (NOT_FOUND, UNIMPLEMENTED,
        # ...) leaves the connection as good as an answer does.
        return answer.result()

    def _exchange(self, method: str, request: bytes, deadline: float) -> _Answer:
        try:
            reused = self._sock is not None
            try:
                return self._call(method, request, deadline)
            except _Closed as exc:
                self._drop()
                if not reused:
                    raise RpcFailure(Code.UNAVAILABLE, str(exc)) from None
            try:  # a connection the server closed while idle: once more, on a new one
                return self._call(method, request, deadline)
            except _Closed as exc:
                self._drop()
                raise RpcFailure(Code.UNAVAILABLE, str(exc)) from None
        except BaseException:
            self._drop()  # a broken or abandoned exchange: the next call starts clean
            raise

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        sock, self._sock, self._conn = self._sock, None, None
        if sock is not None:
            sock.close()

    def _connect(self, deadline: float) -> tuple[socket.socket, h2.connection.H2Connection]:
        if self._sock is not None and self._conn is not None:
            return self._sock, self._conn
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            sock.connect(str(self.path))
        except TimeoutError:
            sock.close()
            raise RpcFailure(Code.DEADLINE_EXCEEDED, "connecting") from None
        except OSError as exc:
            sock.close()
            raise Unreachable(
                exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
            ) from None
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        conn.initiate_connection()
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW})
        conn.increment_flow_control_window(WINDOW - conn.inbound_flow_control_window)
        self._sock, self._conn = sock, conn
        return sock, conn

    def _call(self, method: str, request: bytes, deadline: float) -> _Answer:
        sock, conn = self._connect(deadline)
        stream = conn.get_next_available_stream_id()
        remaining = max(0.001, deadline - time.monotonic())
        conn.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", method),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-timeout", f"{max(1, int(remaining * 1000))}m"),
            ],
        )
        conn.send_data(stream, struct.pack(">BI", 0, len(request)) + request, end_stream=True)
        answer = _Answer(stream, self.max_message_bytes)
        try:
            self._send(sock, conn, deadline)
            while not answer.ended:
                self._send(sock, conn, deadline)
                data = self._receive(sock, deadline, answered=answer.started)
                for event in conn.receive_data(data):
                    answer.take(event, conn)
        except h2.exceptions.ProtocolError as exc:
            raise RpcFailure(Code.INTERNAL, f"HTTP/2 protocol error: {exc}") from None
        self._send(sock, conn, deadline)
        return answer

    @staticmethod
    def _send(sock: socket.socket, conn: h2.connection.H2Connection, deadline: float) -> None:
        data = conn.data_to_send()
        if not data:
            return
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            sock.sendall(data)
        except TimeoutError:
            raise RpcFailure(Code.DEADLINE_EXCEEDED, "sending") from None
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _Closed(f"connection closed: {exc.strerror}") from None

    @staticmethod
    def _receive(sock: socket.socket, deadline: float, *, answered: bool) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RpcFailure(Code.DEADLINE_EXCEEDED, "waiting for the answer")
        sock.settimeout(left)
        try:
            data = sock.recv(READ_SIZE)
        except TimeoutError:
            raise RpcFailure(Code.DEADLINE_EXCEEDED, "waiting for the answer") from None
        except ConnectionResetError as exc:
            data, reason = b"", exc.strerror
        else:
            reason = "connection closed by the server"
        if data:
            return data
        if answered:  # it started answering: this call failed, the next one dials again
            raise RpcFailure(Code.UNAVAILABLE, reason or "connection closed")
        raise _Closed(reason or "connection closed")


class _Answer:
    """One call's answer as h2 events arrive: headers, the message, the trailers."""

    def __init__(self, stream: int, max_message_bytes: int) -> None:
        self.stream = stream
        self.max_message_bytes = max_message_bytes
        self.started = False
        self.ended = False
        self.http_status: int | None = None
        self.headers: dict[str, str] = {}
        self.trailers: dict[str, str] = {}
        self.body = bytearray()

    def take(self, event: h2.events.Event, conn: h2.connection.H2Connection) -> None:
        if isinstance(event, h2.events.ConnectionTerminated):
            if not self.started:
                raise _Closed("the server closed the connection (GOAWAY)")
            raise RpcFailure(Code.UNAVAILABLE, "the server closed the connection (GOAWAY)")
        if getattr(event, "stream_id", self.stream) != self.stream:
            return
        if isinstance(event, h2.events.ResponseReceived):
            self.started = True
            self.headers = {str(k): str(v) for k, v in event.headers}
            self.http_status = int(self.headers.get(":status", "0"))
        elif isinstance(event, h2.events.DataReceived):
            self.started = True
            self.body += event.data
            conn.acknowledge_received_data(event.flow_controlled_length, self.stream)
            if len(self.body) >= 5:
                (length,) = struct.unpack_from(">I", self.body, 1)
                if length > self.max_message_bytes:
                    conn.reset_stream(self.stream, h2.errors.ErrorCodes.CANCEL)
                    raise RpcFailure(
                        Code.RESOURCE_EXHAUSTED,
                        f"Received message larger than max ({length} vs. {self.max_message_bytes})",
                    )
        elif isinstance(event, h2.events.TrailersReceived):
            self.trailers = {str(k): str(v) for k, v in event.headers}
        elif isinstance(event, h2.events.StreamEnded):
            self.ended = True
        elif isinstance(event, h2.events.StreamReset):
            if not self.started:
                raise _Closed(f"the server reset the stream ({event.error_code!s})")
            raise RpcFailure(
                Code.UNAVAILABLE, f"the server reset the stream ({event.error_code!s})"
            )

    def result(self) -> bytes:
        status = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        if status is None:
            code = _HTTP_CODES.get(self.http_status or 0, Code.UNKNOWN)
            raise RpcFailure(code, f"HTTP status {self.http_status} without a gRPC status")
        message = self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))
        try:
            code = Code(int(status))
        except ValueError:
            code = Code.UNKNOWN
        if code != Code.OK:
            raise RpcFailure(code, urllib.parse.unquote(message))
        if len(self.body) < 5:
            raise RpcFailure(Code.INTERNAL, "an OK answer without a message")
        compressed, length = struct.unpack_from(">BI", self.body)
        if compressed:
            raise RpcFailure(Code.INTERNAL, "a compressed answer (none was offered)")
        if len(self.body) != 5 + length:
            raise RpcFailure(Code.INTERNAL, f"one {length}-byte message expected, got more or less")
        return bytes(self.body[5:])

"""The HTTP server's event loop when it serves TLS: asyncio's, for its TLS layer.

Imported only by a server with TLS configured: a server without runs on
agent/serve/selector_loop.py, which says why (asyncio and ssl cost every start their
import). TLS cannot be turned on or off without a restart (agent/serve/server.py,
`_WebReloader`), so a server keeps the loop it started on.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    import ssl


class Server(Protocol):
    """What the loop needs of agent/serve/server.py's MetricsServer."""

    @property
    def listener(self) -> socket.socket: ...
    @property
    def backlog(self) -> int: ...
    def new_connection(self) -> Any: ...
    def running(self, loop: Any, request_stop: Callable[[], object]) -> None: ...
    def kill_connections(self) -> None: ...
    def on_loop_error(self, loop: object, context: dict[str, Any]) -> None: ...


class TlsConnection(Protocol):
    """What `start_tls` needs of a connection, beside asyncio's protocol callbacks."""

    def handshake_done(self, error: BaseException | None) -> None: ...


def run(server: Server) -> None:
    """Serve on a new asyncio loop until the server asks it to stop."""
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(server.on_loop_error)
    try:
        loop.run_until_complete(_serve(server, loop))
    finally:
        loop.close()


async def _serve(server: Server, loop: asyncio.AbstractEventLoop) -> None:
    stopping = asyncio.Event()
    # A connection is an asyncio protocol by its methods, not by its base class.
    factory = cast(Callable[[], asyncio.BaseProtocol], server.new_connection)
    listening = await loop.create_server(factory, sock=server.listener, backlog=server.backlog)
    server.running(loop, lambda: loop.call_soon_threadsafe(stopping.set))
    await stopping.wait()
    listening.close()
    server.kill_connections()
    await listening.wait_closed()
    for _ in range(3):  # let the aborted transports run connection_lost: sockets close
        await asyncio.sleep(0)


def start_tls(
    connection: TlsConnection,
    transport: object,
    context: ssl.SSLContext,
    handshake_timeout: int,
) -> None:
    """Put asyncio's TLS layer between the socket and `connection`, as
    `loop.create_server(ssl=...)` does, but after admission: the connection calls this in
    its first connection_made, before anything has been read, so the layer sees the whole
    handshake. (`loop.start_tls` would run a turn later, when bytes may already have
    arrived.) The layer's own handshake timeout is only a backstop behind the connection's
    header deadline. The connection hears connection_made again, with the TLS transport,
    when the handshake completes; `handshake_done` when it ends either way."""
    assert isinstance(transport, asyncio.Transport)  # this loop's, as the server runs on it
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    layer = _TlsLayer(
        loop,
        connection,  # type: ignore[arg-type]  # an asyncio protocol by its methods
        context,
        waiter,
        server_side=True,
        call_connection_made=True,
        ssl_handshake_timeout=handshake_timeout,
    )
    transport.set_protocol(layer)
    layer.connection_made(transport)
    waiter.add_done_callback(
        lambda done: connection.handshake_done(None if done.cancelled() else done.exception())
    )


class _TlsLayer(asyncio.sslproto.SSLProtocol):
    """asyncio's TLS layer with a 16 KiB read buffer instead of 256 KiB. It allocates the
    buffer for every connection when it is made, so 1,000 idle TLS connections held about
    300 MB (measured), near the DaemonSet's memory limit; requests here are at most 16 KiB,
    and a TLS record is at most 16 KiB of plaintext, so a larger buffer buys nothing."""

    max_size = 16 * 1024

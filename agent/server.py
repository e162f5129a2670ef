"""The HTTP endpoint: /metrics, /healthz (the process serves) and /readyz (first full
collection done). Threaded, so a slow scrape never blocks a liveness probe."""

from __future__ import annotations

import gzip
import logging
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger("gpuscope.server")


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        render_text: Callable[[], bytes],
        ready: Callable[[], bool],
    ) -> None:
        self.registry = registry
        self.render_text = render_text
        self.is_ready = ready
        super().__init__(address, _Handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def handle_error(self, request: object, client_address: object) -> None:
        """A scraper that hangs up mid-answer (a timeout, Ctrl-C on curl) is routine: one
        debug line, not a traceback on stderr."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError)):
            log.debug("client %s went away: %s", client_address, exc)
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle's algorithm the body waits for the
    # peer's (delayed) ACK of the headers, adding milliseconds to every scrape.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._metrics()
        elif path == "/healthz":
            self._send(200, b"ok\n")
        elif path == "/readyz":
            ready = self.server.is_ready()
            self._send(200 if ready else 503, b"ready\n" if ready else b"not ready\n")
        elif path == "/":
            self._send(
                200,
                b"<html><body><h1>gpuscope</h1><a href='/metrics'>/metrics</a></body></html>\n",
                "text/html; charset=utf-8",
            )
        else:
            self._send(404, b"not found\n")

    def _metrics(self) -> None:
        accept = self.headers.get("Accept", "")
        try:
            if "application/openmetrics-text" in accept:
                encoder, content_type = choose_encoder(accept)
                body = encoder(self.server.registry)
            else:
                content_type = CONTENT_TYPE_LATEST
                body = self.server.render_text()
        except Exception:
            log.exception("rendering /metrics failed")
            self._send(500, b"internal error rendering metrics\n")
            return
        headers = {}
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        self._send(200, body, content_type, headers)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("%s " + format, self.client_address[0], *args)

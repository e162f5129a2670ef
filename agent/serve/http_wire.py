"""HTTP/1.x on the wire, as much of it as a metrics endpoint needs: find the end of a
request head, parse it strictly, and write a response head.

Kept apart from the server (agent/serve/server.py) so the rules are pure functions a test can
feed bytes to: what a request may look like is decided here, when and where it is read
is decided there. Anything this module rejects raises `RequestError` with the status to
answer; the server answers it and closes the connection, because after a malformed head
the next request's first byte cannot be found.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

__all__ = [
    "Request",
    "RequestError",
    "accepts_gzip",
    "find_head_end",
    "parse_head",
    "response_head",
]

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/(\d)\.(\d)")


class RequestError(Exception):
    """A request the server refuses: `status` is what it answers before closing."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed request head. Header names are lower case; a repeated header's values
    are joined with ", " (RFC 9110 5.3), which is how every header read here combines."""

    method: str
    target: str
    path: str
    version: tuple[int, int]
    headers: dict[str, str]
    body_length: int

    @property
    def keep_alive(self) -> bool:
        """HTTP/1.1 keeps the connection unless `Connection: close`; HTTP/1.0 closes it
        unless `Connection: keep-alive` (RFC 9112 9.3)."""
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version >= (1, 1):
            return "close" not in tokens
        return "keep-alive" in tokens and "close" not in tokens


def find_head_end(buffer: bytes | bytearray, start: int = 0) -> tuple[int, int] | None:
    """(where the head ends, where the body starts) in `buffer`, searching from `start`,
    or None while the blank line has not arrived. Bare LF line ends are accepted, as
    http.server and most servers do for hand-typed requests."""
    match = _HEAD_END.search(buffer, start)
    if match is None:
        return None
    return match.start(), match.end()


def parse_head(head: bytes, max_body: int) -> Request:
    """Parse a request head (request line and header lines, without the blank line).

    Raises RequestError: 400 for anything malformed, 505 for an HTTP version other than
    1.x, 413 for a body over `max_body` bytes or of unknown length (any Transfer-Encoding:
    a scrape never sends a body, so none is worth reading)."""
    text = head.decode("latin-1").lstrip("\r\n")  # RFC 9112 2.2: ignore leading blank lines
    lines = text.replace("\r\n", "\n").split("\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise RequestError(400, f"malformed request line {lines[0][:80]!r}")
    method, target, version_text = parts
    if not _TOKEN.fullmatch(method):
        raise RequestError(400, f"malformed method {method[:40]!r}")
    version_match = _VERSION.fullmatch(version_text)
    if version_match is None:
        raise RequestError(400, f"malformed HTTP version {version_text[:40]!r}")
    version = (int(version_match[1]), int(version_match[2]))
    if version[0] != 1:
        raise RequestError(505, f"HTTP version {version_text} not supported")
    if not target or any(c.isspace() or not c.isprintable() for c in target):
        raise RequestError(400, "malformed request target")
    headers = _parse_headers(lines[1:])
    return Request(
        method, target, _path_of(target), version, headers, _body_length(headers, max_body)
    )


def _parse_headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        if line[:1] in (" ", "\t"):
            raise RequestError(400, "obsolete line folding in headers")
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise RequestError(400, f"malformed header line {line[:80]!r}")
        key = name.lower()
        value = value.strip(" \t")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers


def _body_length(headers: dict[str, str], max_body: int) -> int:
    if "transfer-encoding" in headers:
        raise RequestError(413, "request bodies of unknown length are not accepted")
    text = headers.get("content-length")
    if text is None:
        return 0
    values = {v.strip() for v in text.split(",")}
    if len(values) != 1:
        raise RequestError(400, "conflicting Content-Length values")
    value = values.pop()
    if not value.isascii() or not value.isdigit():
        raise RequestError(400, f"malformed Content-Length {value[:40]!r}")
    length = int(value)
    if length > max_body:
        raise RequestError(413, f"request body of {length} bytes (at most {max_body})")
    return length


def _path_of(target: str) -> str:
    """The path of an origin-form target (`/metrics?x=1`) or an absolute-form one
    (`http://node:9400/metrics`, which RFC 9112 3.2.2 says a server must accept)."""
    if "://" in target:
        rest = target.split("://", 1)[1]
        slash = rest.find("/")
        target = rest[slash:] if slash >= 0 else "/"
    return target.split("?", 1)[0].split("#", 1)[0]


def accepts_gzip(accept_encoding: str) -> bool:
    """True when `Accept-Encoding` lists gzip (or `*`) without `q=0`."""
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip", "*"):
            continue
        q = params.replace(" ", "").lower()
        if q.startswith("q="):
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
        return True
    return False


_date_cache: tuple[int, str] = (0, "")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _imf_fixdate(seconds: int) -> str:
    """`seconds` since the epoch as an IMF-fixdate, what email.utils.formatdate(usegmt=True)
    writes (that module would load the email package for this one line)."""
    t = time.gmtime(seconds)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


def _http_date() -> str:
    """The Date header (RFC 9110 6.6.1), formatted once a second, not once a response."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, _imf_fixdate(now))
    return _date_cache[1]


# The reason phrases of the statuses the server answers with (RFC 9110's, as http.HTTPStatus
# has them): importing `http` builds its whole HTTPStatus enum, about 0.6 ms of every start.
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Request Entity Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


def reason_phrase(status: int) -> str:
    """`http.HTTPStatus(status).phrase`, without importing `http` for the usual ones."""
    phrase = _REASONS.get(status)
    if phrase is None:
        from http import HTTPStatus

        phrase = HTTPStatus(status).phrase
    return phrase


def response_head(
    status: int,
    content_length: int,
    headers: list[tuple[str, str]],
    *,
    keep_alive: bool,
    version: tuple[int, int] = (1, 1),
) -> bytes:
    """The status line and headers of an answer, ending with the blank line. An HTTP/1.0
    client that asked for keep-alive is told it is kept; any client is told when the
    connection closes after this answer."""
    lines = [f"HTTP/1.1 {status} {reason_phrase(status)}", f"Date: {_http_date()}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append(f"Content-Length: {content_length}")
    if not keep_alive:
        lines.append("Connection: close")
    elif version < (1, 1):
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

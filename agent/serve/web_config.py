"""`--web-config-file`: TLS, basic auth and response headers in the format of Prometheus's
exporter-toolkit (its docs/web-configuration.md), so one file serves node_exporter and
gpuscope alike.

The file is read at start, and everything in it is checked then: the YAML is strict (an
unknown or repeated key is an error, as exporter-toolkit's `yaml.UnmarshalStrict` makes it),
certificates and keys are loaded into an `ssl.SSLContext`, and every bcrypt hash is
validated. Any problem is a `ConfigError` with one line naming the key, so the agent exits 2
before it serves anything. Relative paths are relative to the file's folder, as in
exporter-toolkit. The server reads the file again when it or a certificate file changes (a
renewed certificate), keeping the previous configuration if the new one does not load
(agent/serve/server.py, `_WebReloader`).

Where Python's `ssl` cannot do what the Go server does, the file is refused with a line
that says so, never served differently from what it asks: `client_auth_type:
RequireAnyClientCert` (Python verifies every client certificate it asks for) and more than
one `curve_preferences` entry (Python 3.11 sets one curve), or X25519 as that one (it sets
only NIST curves; the default groups offer X25519 first). `RequestClientCert` is served
without asking for a certificate: the Go server asks but neither checks nor uses it, so who
is let in is the same. `http_server_config.http2` is accepted and has no effect: gpuscope
speaks HTTP/1.1 only, and offers only `http/1.1` by ALPN.
"""

from __future__ import annotations

import base64
import binascii
import errno
import functools
import ipaddress
import os
import re
import stat
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuscope.agent.runtime.options import ConfigError

if TYPE_CHECKING:
    import ssl

__all__ = [
    "BasicAuth",
    "RateLimit",
    "WebConfig",
    "load_web_config",
    "parse_basic_authorization",
]

# exporter-toolkit's only configurable headers, with the values it accepts (None: any).
HEADERS: Mapping[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}

# Names in `ssl`, looked up when a configuration asks for TLS: `ssl` (libssl, libcrypto) is
# imported only then, not by every agent that imports this module (issue #24).
_TLS_VERSIONS = {
    "TLS10": "TLSv1",
    "TLS11": "TLSv1_1",
    "TLS12": "TLSv1_2",
    "TLS13": "TLSv1_3",
}

# Go's crypto/tls.CipherSuites() (the ones exporter-toolkit accepts) -> OpenSSL's names.
# The TLS 1.3 suites map to None: Go ignores cipher_suites for TLS 1.3, and so does this.
_CIPHERS: Mapping[str, str | None] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}

_CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}

_CLIENT_AUTH = {  # names in `ssl`, as _TLS_VERSIONS
    "": "CERT_NONE",
    "NoClientCert": "CERT_NONE",
    "RequestClientCert": "CERT_NONE",  # asked for but unchecked in Go: see the docstring
    "VerifyClientCertIfGiven": "CERT_OPTIONAL",
    "RequireAndVerifyClientCert": "CERT_REQUIRED",
}
_UNSUPPORTED_CLIENT_AUTH = ("RequireAnyClientCert", "RequireClientCert")

_KEYS: Mapping[str, tuple[str, ...]] = {
    "": ("tls_server_config", "http_server_config", "rate_limit", "basic_auth_users"),
    "tls_server_config": (
        "cert",
        "key",
        "client_ca",
        "cert_file",
        "key_file",
        "client_auth_type",
        "client_ca_file",
        "client_allowed_sans",
        "min_version",
        "max_version",
        "cipher_suites",
        "prefer_server_cipher_suites",
        "curve_preferences",
    ),
    "http_server_config": ("http2", "headers"),
    "rate_limit": ("interval", "burst"),
}

# $2a$, $2b$ or $2y$, a two-digit cost, 22 characters of salt and 31 of hash.
_BCRYPT = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


@dataclass(frozen=True, slots=True)
class RateLimit:
    """`rate_limit`: a token bucket over every request, refilled one token per `interval`
    seconds up to `burst` (golang.org/x/time/rate, as exporter-toolkit uses it)."""

    interval: float
    burst: int


@dataclass(frozen=True)
class WebConfig:
    """What the file asks for, checked and loaded. `tls` is None for plain HTTP."""

    path: Path
    tls: ssl.SSLContext | None
    client_auth_type: str
    client_allowed_sans: frozenset[str]  # empty: any verified client certificate
    headers: tuple[tuple[str, str], ...]
    http2: bool
    users: Mapping[str, bytes]  # user -> bcrypt hash; empty: no basic auth
    rate_limit: RateLimit | None
    files: tuple[Path, ...] = ()  # what was read: the file, then its certificate files

    def fingerprint(self) -> tuple[tuple[int, int, int] | None, ...]:
        """(mtime, size, inode) of every file read, None for one that is gone: a change
        means the file or a certificate was replaced (a renewed Secret, say)."""
        out: list[tuple[int, int, int] | None] = []
        for file in self.files:
            try:
                st = file.stat()
            except OSError:
                out.append(None)
            else:
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def __str__(self) -> str:  # for --help's default column and logs
        return str(self.path)

    def summary(self) -> str:
        """One line for the start-up log: what the file turned on."""
        parts = [
            f"TLS ({self.client_auth_type or 'NoClientCert'})" if self.tls else "plain HTTP",
            f"basic auth ({len(self.users)} user{'s' if len(self.users) != 1 else ''})"
            if self.users
            else "no basic auth",
        ]
        if self.rate_limit is not None:
            parts.append(f"rate limit {self.rate_limit.burst}/{self.rate_limit.interval:g} s")
        return ", ".join(parts)

    def san_allowed(self, peercert: Mapping[str, Any] | None) -> bool:
        """Whether a verified client certificate (`SSLSocket.getpeercert()`) carries one of
        `client_allowed_sans` (DNS, IP, e-mail or URI), compared exactly as Go does."""
        if not self.client_allowed_sans:
            return True
        for kind, value in (peercert or {}).get("subjectAltName", ()):
            if kind == "IP Address":
                value = _normal_ip(value)
            if kind in ("DNS", "IP Address", "email", "URI") and value in self.client_allowed_sans:
                return True
        return False


FILE_CAP = 1 << 20  # bytes read at most from the web config or a file it names


class NotRegularFile(OSError):
    """A path that is a FIFO, a directory, a device or a socket, not a file to read."""


def read_regular_file(path: Path, cap: int = FILE_CAP) -> bytes:
    """The bytes of a regular file, opened without blocking: a FIFO put at the path (by
    mistake, or by someone who can write the folder) would otherwise block the open
    forever, and with it the reloader and every certificate renewal after it. Raises
    OSError (NotRegularFile for what is not a regular file, or one over `cap` bytes)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file")
        chunks, size = [], 0
        while chunk := os.read(fd, min(65536, cap + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                raise NotRegularFile(errno.EFBIG, f"larger than {cap} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_web_config(path: Path) -> WebConfig:
    """Read, check and load a web configuration file; raise ConfigError (one line)."""
    try:
        text = read_regular_file(path)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    import yaml

    try:
        document = yaml.load(text, Loader=_strict_loader())  # a SafeLoader: no object tags
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_one_line(exc)}") from None
    try:
        return _build(path, _mapping(document, ""))
    except _Bad as exc:
        raise ConfigError(f"{path}: {exc}") from None


class _Bad(Exception):
    """A problem in the file; the message names the key."""


@functools.cache
def _strict_loader() -> Any:
    """A SafeLoader that refuses a key given twice in one mapping (yaml.v2's strict mode).

    Built on first use: PyYAML (like bcrypt) is imported only when a web configuration is
    given, so an agent without one, and scripts/gpu-check on a bare GPU machine, run with
    neither installed."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def _build(path: Path, top: dict[str, Any]) -> WebConfig:
    base = path.parent
    tls_section = _mapping(top.get("tls_server_config"), "tls_server_config")
    http_section = _mapping(top.get("http_server_config"), "http_server_config")
    users = _users(top.get("basic_auth_users"))
    client_auth = _string(tls_section, "tls_server_config", "client_auth_type")
    sans = _strings(tls_section, "tls_server_config", "client_allowed_sans")
    context = _tls_context(base, tls_section)
    if sans and client_auth != "RequireAndVerifyClientCert":
        raise _Bad(
            "tls_server_config.client_allowed_sans needs client_auth_type "
            "RequireAndVerifyClientCert"
        )
    tls_files = (
        tuple(
            _join(base, name)
            for key in ("cert_file", "key_file", "client_ca_file")
            if (name := _string(tls_section, "tls_server_config", key))
        )
        if context is not None
        else ()
    )
    return WebConfig(
        path=path,
        files=(path, *tls_files),
        tls=context,
        client_auth_type=client_auth if context is not None else "",
        client_allowed_sans=frozenset(_normal_ip(s) for s in sans),
        headers=_headers(http_section.get("headers")),
        http2=_boolean(http_section, "http_server_config", "http2", default=True),
        users=users,
        rate_limit=_rate_limit(top.get("rate_limit")),
    )


# --- TLS ------------------------------------------------------------------------------------


def _tls_context(base: Path, section: dict[str, Any]) -> ssl.SSLContext | None:
    """The server's SSLContext, or None for plain HTTP. Each step turns its own errors into
    a line naming its key; an ssl or OS error from any other step (one this OpenSSL build
    refuses) becomes one line too, never an uncaught traceback at start or in the reloader."""
    import ssl  # here, not at the top: see _TLS_VERSIONS

    try:
        return _new_tls_context(base, section)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise _Bad(f"tls_server_config: {_ssl_reason(exc)}") from None


def _new_tls_context(base: Path, section: dict[str, Any]) -> ssl.SSLContext | None:
    where = "tls_server_config"
    get = {k: _string(section, where, k) for k in ("cert", "key")}
    files = {k: _string(section, where, k) for k in ("cert_file", "key_file", "client_ca_file")}
    ca_text = _string(section, where, "client_ca")
    client_auth = _string(section, where, "client_auth_type")
    enabled = any(get.values()) or any(files.values()) or ca_text or client_auth
    if not enabled:
        return None  # like exporter-toolkit: no certificate, no TLS (plain HTTP)
    if not (files["cert_file"] or get["cert"]):
        raise _Bad(f"{where}: missing one of cert or cert_file")
    if not (files["key_file"] or get["key"]):
        raise _Bad(f"{where}: missing one of key or key_file")
    if client_auth in _UNSUPPORTED_CLIENT_AUTH:
        raise _Bad(
            f"{where}.client_auth_type {client_auth} is not supported: Python's ssl verifies "
            "every client certificate it asks for; use RequireAndVerifyClientCert with "
            "client_ca_file"
        )
    if client_auth not in _CLIENT_AUTH:
        raise _Bad(
            f"{where}.client_auth_type: unknown {client_auth!r} (expected NoClientCert, "
            "RequestClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert)"
        )

    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _version(section, "min_version", "TLS12")
    context.maximum_version = _version(section, "max_version", "TLS13")
    if context.minimum_version > context.maximum_version:
        raise _Bad(f"{where}: min_version is above max_version")
    context.set_alpn_protocols(["http/1.1"])
    _load_certificate(context, base, files["cert_file"], files["key_file"], get)
    _ciphers(context, section)
    _curve(context, section)

    mode = getattr(ssl, _CLIENT_AUTH[client_auth])
    has_ca = bool(files["client_ca_file"] or ca_text)
    if has_ca and mode is ssl.CERT_NONE:
        raise _Bad(f"{where}: client CA given without a client_auth_type that verifies")
    if mode is not ssl.CERT_NONE:
        if not has_ca:
            raise _Bad(f"{where}.client_auth_type {client_auth} needs client_ca_file or client_ca")
        try:
            if files["client_ca_file"]:
                ca_path = _join(base, files["client_ca_file"])
                try:
                    ca_pem = read_regular_file(ca_path).decode("ascii")
                except OSError as exc:
                    raise _Bad(
                        f"{where}.client_ca_file: no CA certificate loaded: cannot read "
                        f"{ca_path}: {exc.strerror or exc}"
                    ) from None
                except UnicodeDecodeError:
                    raise _Bad(
                        f"{where}.client_ca_file: no CA certificate loaded: {ca_path} is not PEM"
                    ) from None
                context.load_verify_locations(cadata=ca_pem)
            else:
                context.load_verify_locations(cadata=ca_text)
        except (OSError, ssl.SSLError, ValueError) as exc:
            name = "client_ca_file" if files["client_ca_file"] else "client_ca"
            raise _Bad(f"{where}.{name}: no CA certificate loaded: {_ssl_reason(exc)}") from None
        context.verify_mode = mode
    return context


def _load_certificate(
    context: ssl.SSLContext,
    base: Path,
    cert_file: str,
    key_file: str,
    inline: Mapping[str, str],
) -> None:
    """cert_file/key_file, else the inline PEM `cert`/`key` (a file wins, as in Go). Inline
    PEM goes through a memory file: ssl loads chains only from paths, and a private key
    should not be written to disk."""
    import ssl

    where = "tls_server_config"
    pem: dict[str, bytes] = {}
    for name, file_name in (("cert", cert_file), ("key", key_file)):
        if file_name:
            file_path = _join(base, file_name)
            try:
                pem[name] = read_regular_file(file_path)
            except OSError as exc:
                raise _Bad(
                    f"{where}.{name}_file: cannot read {file_path}: {exc.strerror or exc}"
                ) from None
        else:
            pem[name] = inline[name].encode()
    fd = os.memfd_create("gpuscope-web-config", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem["key"] + b"\n" + pem["cert"])
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    except (ssl.SSLError, OSError) as exc:
        cert = f"cert_file {cert_file}" if cert_file else "cert"
        key = f"key_file {key_file}" if key_file else "key"
        raise _Bad(
            f"{where}: {cert} and {key} are not a PEM certificate and its key: {_ssl_reason(exc)}"
        ) from None
    finally:
        os.close(fd)


def _version(section: dict[str, Any], key: str, default: str) -> ssl.TLSVersion:
    import ssl

    name = _string(section, "tls_server_config", key) or default
    if name not in _TLS_VERSIONS:
        raise _Bad(
            f"tls_server_config.{key}: unknown TLS version {name!r} (expected "
            f"{', '.join(_TLS_VERSIONS)})"
        )
    version: ssl.TLSVersion = getattr(ssl.TLSVersion, _TLS_VERSIONS[name])
    return version


def _ciphers(context: ssl.SSLContext, section: dict[str, Any]) -> None:
    import ssl

    where = "tls_server_config"
    names = _strings(section, where, "cipher_suites")
    unknown = [n for n in names if n not in _CIPHERS]
    if unknown:
        raise _Bad(f"{where}.cipher_suites: unknown cipher {unknown[0]!r}")
    openssl = [c for c in (_CIPHERS[n] for n in names) if c is not None]
    if openssl:
        try:
            context.set_ciphers(":".join(openssl))
        except ssl.SSLError:
            raise _Bad(f"{where}.cipher_suites: none of them is available here") from None
    if not _boolean(section, where, "prefer_server_cipher_suites", default=True):
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE


def _curve(context: ssl.SSLContext, section: dict[str, Any]) -> None:
    import ssl

    where = "tls_server_config.curve_preferences"
    curves = _strings(section, "tls_server_config", "curve_preferences")
    unknown = [c for c in curves if c not in _CURVES]
    if unknown:
        raise _Bad(f"{where}: unknown curve {unknown[0]!r} (expected {', '.join(_CURVES)})")
    if len(curves) > 1:
        raise _Bad(f"{where}: gpuscope can use only one curve (Python's ssl sets one); give one")
    if curves:
        try:
            context.set_ecdh_curve(_CURVES[curves[0]])
        except (ssl.SSLError, ValueError) as exc:  # never an uncaught error at start
            if curves[0] == "X25519":
                # Python 3.11's set_ecdh_curve makes an EC key by curve name, and X25519 is
                # no EC curve: it cannot be the only group. Refused, never left unset.
                raise _Bad(
                    f"{where}: X25519 cannot be set alone by this Python's ssl; remove "
                    "curve_preferences (the default groups offer X25519 first)"
                ) from None
            raise _Bad(f"{where}: {curves[0]} is not available here: {_ssl_reason(exc)}") from None


def _ssl_reason(exc: BaseException) -> str:
    # OpenSSL's errors carry `reason`; one raised by Python code (or an older build) may not.
    import ssl

    reason = getattr(exc, "reason", None) if isinstance(exc, ssl.SSLError) else None
    if reason:
        return str(reason).replace("_", " ").lower()
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return _one_line(exc)


# --- the other sections -----------------------------------------------------------------------


def _headers(value: Any) -> tuple[tuple[str, str], ...]:
    where = "http_server_config.headers"
    section = _mapping(value, where, open_keys=True)
    out = []
    for name, text in section.items():
        if name not in HEADERS:
            raise _Bad(f"{where}: HTTP header {name!r} can not be configured")
        if not isinstance(text, str):
            raise _Bad(f"{where}.{name}: expected a string")
        allowed = HEADERS[name]
        if allowed is not None and text not in allowed:
            raise _Bad(f"{where}.{name}: expected one of {', '.join(allowed)}, got {text!r}")
        if any(c in text for c in "\r\n\0"):
            raise _Bad(f"{where}.{name}: a header value cannot hold a line break")
        if text:  # blank means unset
            out.append((name, text))
    return tuple(out)


def _users(value: Any) -> dict[str, bytes]:
    where = "basic_auth_users"
    section = _mapping(value, where, open_keys=True)
    users = {}
    for user, hashed in section.items():
        if not isinstance(user, str) or not isinstance(hashed, str):
            raise _Bad(f"{where}: expected user: bcrypt-hash strings")
        match = _BCRYPT.fullmatch(hashed)
        if match is None:
            raise _Bad(f"{where}.{user}: not a bcrypt hash ($2a$, $2b$ or $2y$, 60 characters)")
        if not 4 <= int(match.group(1)) <= 31:
            raise _Bad(f"{where}.{user}: bcrypt cost {match.group(1)} is outside 4-31")
        users[user] = hashed.encode()
    return users


def _rate_limit(value: Any) -> RateLimit | None:
    section = _mapping(value, "rate_limit")
    interval = _duration(section.get("interval", 0))
    burst = section.get("burst", 0)
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 0:
        raise _Bad("rate_limit.burst: expected a whole number >= 0")
    return RateLimit(interval, burst) if interval > 0 else None


def _duration(value: Any) -> float:
    """A Go duration ("1s", "250ms", "1m30s") or a whole number of nanoseconds, in seconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value * 1e-9
    if not isinstance(value, str):
        raise _Bad("rate_limit.interval: expected a duration such as 1s or 250ms")
    text = value.strip()
    if text == "0":
        return 0.0
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise _Bad(f"rate_limit.interval: {value!r} is not a duration such as 1s or 250ms")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


# --- YAML shapes ------------------------------------------------------------------------------


def _mapping(value: Any, where: str, *, open_keys: bool = False) -> dict[str, Any]:
    """A mapping (null counts as empty), its keys checked against the section's known keys
    unless `open_keys` (headers and users are open mappings)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Bad(f"{where or 'the file'}: expected a mapping")
    keys = None if open_keys else _KEYS.get(where)
    if keys is not None:
        for key in value:
            if key not in keys:
                at = f" in {where}" if where else ""
                raise _Bad(f"unknown key {key!r}{at} (known: {', '.join(keys)})")
    return value


def _string(section: dict[str, Any], where: str, key: str) -> str:
    value = section.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Bad(f"{where}.{key}: expected a string")
    return value


def _strings(section: dict[str, Any], where: str, key: str) -> list[str]:
    value = section.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Bad(f"{where}.{key}: expected a list of strings")
    return value


def _boolean(section: dict[str, Any], where: str, key: str, *, default: bool) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise _Bad(f"{where}.{key}: expected true or false")
    return value


def _join(base: Path, name: str) -> Path:
    path = Path(name)
    return path if path.is_absolute() else base / path


def _normal_ip(text: str) -> str:
    """IP SANs compare as addresses ("::1" and Python's "0:0:0:0:0:0:0:1" are one)."""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        return text


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


# --- basic auth -------------------------------------------------------------------------------


def parse_basic_authorization(header: str) -> tuple[str, bytes] | None:
    """`Authorization: Basic base64(user:password)` -> (user, password), else None."""
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


class BasicAuth:
    """Checks credentials against `basic_auth_users` at a bounded cost.

    bcrypt costs about 100 ms at cost 10, by design. A check that succeeded is remembered
    for as long as the user's hash is unchanged, so a scraper pays bcrypt once per agent
    (and per password), not once per scrape or per minute: an expiring memory sends the
    regular scraper back to the bcrypt queue, where a flood of wrong passwords is waiting.
    The memory is keyed by an HMAC of user, hash and password under a secret drawn at start,
    so neither the password nor an offline-testable digest of it is kept; it holds at most
    `max_entries` credentials, least recently used out first, and only successes enter it,
    so wrong passwords cannot push a good one out. `cached` answers from it at once and is
    what the event loop calls; `verify` pays bcrypt (one check at a time, as exporter-toolkit
    does). An unknown user is checked against a decoy hash of the same cost, so timing does
    not reveal user names.

    A reloaded configuration is built with `previous=` the one in force: credentials of
    users whose hash did not change stay remembered, so a certificate renewal or a new user
    does not send every scraper back to bcrypt.
    """

    def __init__(
        self,
        users: Mapping[str, bytes],
        *,
        max_entries: int = 256,
        previous: BasicAuth | None = None,
    ) -> None:
        self._users = dict(users)
        self._max = max_entries
        self._good: OrderedDict[bytes, str] = OrderedDict()  # HMAC -> user
        self._lock = threading.Lock()
        cost = _bcrypt_cost(next(iter(self._users.values()), b""))
        if previous is None:
            self._secret = os.urandom(32)
            self._bcrypt_lock = threading.Lock()
        else:
            self._secret = previous._secret
            self._bcrypt_lock = previous._bcrypt_lock  # one bcrypt at a time, across reloads
            with previous._lock:
                for key, user in previous._good.items():
                    if user in self._users and self._users[user] == previous._users.get(user):
                        self._good[key] = user
            while len(self._good) > self._max:
                self._good.popitem(last=False)
        self._decoy: bytes
        if previous is not None and _bcrypt_cost(previous._decoy) == cost:
            self._decoy = previous._decoy  # making one costs a bcrypt round
        else:
            import bcrypt

            self._decoy = bcrypt.hashpw(b"decoy password", bcrypt.gensalt(cost))

    def __len__(self) -> int:
        """How many verified credentials are remembered."""
        with self._lock:
            return len(self._good)

    def _key(self, user: str, password: bytes) -> bytes:
        hashed = self._users.get(user, b"")
        message = b"\0".join((user.encode("utf-8", "surrogateescape"), hashed, password))
        # Imported with the first login, not with the server: an agent without basic auth
        # never loads them (hashlib costs about 0.6 MB resident).
        import hashlib
        import hmac

        return hmac.new(self._secret, message, hashlib.sha256).digest()

    def cached(self, user: str, password: bytes) -> bool:
        """True when these exact credentials were verified under the user's current hash."""
        key = self._key(user, password)
        with self._lock:
            if key not in self._good:
                return False
            self._good.move_to_end(key)
            return True

    def verify(self, user: str, password: bytes) -> bool:
        """Check with bcrypt (slow: call it off the event loop) and remember a success."""
        hashed = self._users.get(user)
        with self._bcrypt_lock:
            ok = _checkpw(password, hashed if hashed is not None else self._decoy)
        ok = ok and hashed is not None
        if ok:
            key = self._key(user, password)
            with self._lock:
                self._good[key] = user
                self._good.move_to_end(key)
                while len(self._good) > self._max:
                    self._good.popitem(last=False)
        return ok


def _bcrypt_cost(hashed: bytes) -> int:
    """The cost of a `$2b$10$...` hash; 4 (the least) for none."""
    return int(hashed[4:6]) if len(hashed) > 6 and hashed[4:6].isdigit() else 4


def _checkpw(password: bytes, hashed: bytes) -> bool:
    """bcrypt reads at most 72 bytes of password; the bcrypt package refuses longer ones
    rather than truncate, so truncate as htpasswd and Go's bcrypt do."""
    import bcrypt

    try:
        return bcrypt.checkpw(password[:72], hashed)
    except ValueError:
        return False

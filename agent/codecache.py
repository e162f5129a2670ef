"""Dataclass methods compiled once and kept between runs, as Python keeps .pyc files.

`dataclasses` writes the source of every dataclass's `__init__`, `__repr__`, `__eq__`,
`__hash__` and, for frozen ones, `__setattr__` and `__delattr__`, and compiles it with
`exec()` each time the class is created: .pyc files do not cover it. A GPU-only agent creates
about a hundred dataclasses before its first GPU series, and compiling their ~600 small
functions was about a third of its start (issue #24, docs/performance.md).

The text of each function is a pure function of its class, so its code object can be kept.
`install()` gives the `dataclasses` module an `exec` of its own (a module global shadows the
builtin) that compiles each text once and looks it up by the whole text afterwards; `save()`
writes what was compiled into the package's `__pycache__`, under the interpreter's cache
tag and bytecode magic number, beside the package's .pyc files. The code run is exactly what
`compile()` makes of the same text; a missing, stale, unreadable or unwritable cache only
means compiling as Python would. Like .pyc files it is not written under
PYTHONDONTWRITEBYTECODE, and the image writes it at build time
(`warm()`, which imports every module of the agent).
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib
import importlib.util
import marshal
import os
import sys
import threading
import zlib
from pathlib import Path
from typing import Any

MAX_ENTRIES = 4096  # the agent has ~200 dataclasses (~1,200 functions); a bound on growth
_lock = threading.Lock()
# On disk: key -> marshal.dumps((text, code)). Entries are unmarshalled one by one when asked
# for, and the key is a CRC of the text, so a start pays neither for the entries it does not
# use nor for hashing with a cryptographic digest; the text kept in each entry is compared
# before its code is used, so two texts sharing a key only mean compiling one of them.
_entries: dict[int, bytes] = {}
_added: dict[int, bytes] = {}  # compiled by this process, not on disk yet
_used: set[int] = set()
_installed = False
hits = 0  # methods this process took from the cache, and compiled itself
compiled = 0


def cache_path() -> Path:
    """`gpuscope/__pycache__/dataclass-methods.<cache tag>.marshal`, beside the .pyc files."""
    import gpuscope

    tag = sys.implementation.cache_tag or "python"
    return Path(gpuscope.__file__).parent / "__pycache__" / f"dataclass-methods.{tag}.marshal"


def _key(text: str) -> int:
    return zlib.crc32(text.encode()) | len(text) << 32


def _code(text: str) -> Any:
    """The code object compile() makes of `text`, from the cache when it holds it."""
    global hits, compiled
    key = _key(text)
    _used.add(key)
    raw = _entries.get(key) or _added.get(key)
    if raw is not None:
        kept, code = marshal.loads(raw)
        if kept == text:
            hits += 1
            return code
    compiled += 1
    code = compile(text, "<string>", "exec")  # what exec() compiles from a string
    if raw is None:
        _added[key] = marshal.dumps((text, code))
    return code


def _exec(source: Any, globals: Any = None, locals: Any = None, /) -> None:  # noqa: A002
    """`exec` as `dataclasses` calls it: a source text is compiled at most once."""
    builtins.exec(_code(source) if type(source) is str else source, globals, locals)


def _load(path: Path) -> dict[int, bytes]:
    try:
        magic, entries = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if magic != importlib.util.MAGIC_NUMBER or not isinstance(entries, dict):
        return {}  # another interpreter's bytecode
    return entries


def install() -> bool:
    """Route `dataclasses`' exec through the cache, loaded from disk once. False where the
    module already has an `exec` of its own (not the CPython implementation this expects)."""
    global _installed
    with _lock:
        if _installed:
            return True
        if "exec" in vars(dataclasses):
            return False
        _entries.update(_load(cache_path()))
        dataclasses.exec = _exec  # type: ignore[attr-defined]
        _installed = True
        return True


def save(*, force: bool = False) -> bool:
    """Write the cache if this process compiled something new; best effort, as Python
    writes .pyc files, and not under PYTHONDONTWRITEBYTECODE unless `force`d (as
    `compileall` writes them anyway): False when nothing was written."""
    if not _installed or not _added or (sys.dont_write_bytecode and not force):
        return False
    with _lock:
        entries = {**_entries, **_added}
        if len(entries) > MAX_ENTRIES:  # edited code left texts nobody asks for: keep ours
            entries = {key: raw for key, raw in entries.items() if key in _used}
    path = cache_path()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(exist_ok=True)
        tmp.write_bytes(marshal.dumps((importlib.util.MAGIC_NUMBER, entries)))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    with _lock:
        _entries.update(_added)
        _added.clear()
    return True


def release() -> None:
    """The start is over: save what it compiled and give `dataclasses` its builtin `exec`
    back, freeing the entries (about 1 MB) a running agent has no use for."""
    global _installed
    save()
    with _lock:
        if _installed and vars(dataclasses).get("exec") is _exec:
            del dataclasses.exec  # type: ignore[attr-defined]
        _installed = False
        _entries.clear()
        _added.clear()
        _used.clear()


def warm() -> int:
    """Import every module of the agent and the exporters (those whose optional
    dependencies are missing are skipped) and save: the image's build step."""
    import pkgutil

    import gpuscope

    install()
    found = 0
    for info in pkgutil.walk_packages(gpuscope.__path__, "gpuscope.", onerror=lambda _name: None):
        if info.name.endswith(".__main__"):
            continue  # runs the command line
        try:
            importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - an optional dependency (bcc, amdsmi) is absent
            continue
        found += 1
    save(force=True)
    return found

"""Dataclass methods compiled once and kept between runs (agent/codecache.py, issue #24)."""

from __future__ import annotations

import dataclasses
import importlib.util
import marshal
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuscope.agent import codecache


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache of this test's own, in a file under tmp_path."""
    path = tmp_path / "__pycache__" / "dataclass-methods.test.marshal"
    monkeypatch.setattr(codecache, "cache_path", lambda: path)
    monkeypatch.setattr(codecache, "_entries", {})
    monkeypatch.setattr(codecache, "_added", {})
    monkeypatch.setattr(codecache, "_used", set())
    return path


def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the cache compiles from here on."""
    seen: list[str] = []

    def counting(text: str, filename: str, mode: str) -> Any:
        seen.append(text)
        return compile(text, filename, mode)

    monkeypatch.setattr(codecache, "compile", counting, raising=False)
    return seen


def make_record() -> type:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Reading:
        gpu: int
        watts: float = 0.0
        tags: tuple[str, ...] = ()

    return Reading


def test_the_package_installs_it_for_every_dataclass() -> None:
    assert codecache._installed
    assert vars(dataclasses)["exec"] is codecache._exec


def test_a_second_process_compiles_nothing_it_kept(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = compiles(monkeypatch)
    make_record()
    assert len(seen) >= 5  # __init__, __repr__, __eq__, __hash__, __setattr__, __delattr__
    assert codecache.save(force=True)
    # A new process: what this one kept is all it has.
    monkeypatch.setattr(codecache, "_entries", codecache._load(cache))
    monkeypatch.setattr(codecache, "_added", {})
    seen.clear()
    make_record()
    assert seen == []
    assert not codecache.save(force=True)  # nothing new: nothing written


def test_a_cached_class_behaves_as_a_compiled_one(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = make_record()
    codecache.save(force=True)
    monkeypatch.setattr(codecache, "_entries", codecache._load(cache))
    monkeypatch.setattr(codecache, "_added", {})
    cached = make_record()
    a, b = fresh(1, 2.5, ("x",)), cached(1, 2.5, ("x",))
    assert repr(a) == repr(b)
    assert repr(b).endswith("Reading(gpu=1, watts=2.5, tags=('x',))")
    assert hash(a) == hash(b) and cached(1, 2.5, ("x",)) == b != cached(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.gpu = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        cached()  # type: ignore[call-arg]


def test_a_text_sharing_another_texts_key_is_compiled(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "def __create_fn__():\n def f(): return 1\n return f"
    other = "def __create_fn__():\n def f(): return 2\n return f"
    key = codecache._key(text)
    codecache._entries[key] = marshal.dumps((other, compile(other, "<string>", "exec")))
    seen = compiles(monkeypatch)
    ns: dict[str, Any] = {}
    codecache._exec(text, {}, ns)
    assert seen == [text] and ns["__create_fn__"]()() == 1


def test_another_interpreters_or_a_damaged_cache_is_ignored(cache: Path) -> None:
    cache.parent.mkdir()
    cache.write_bytes(marshal.dumps((b"\x00\x00\r\n", {1: b"x"})))
    assert codecache._load(cache) == {}
    cache.write_bytes(b"not marshal")
    assert codecache._load(cache) == {}
    cache.write_bytes(marshal.dumps((importlib.util.MAGIC_NUMBER, {})))
    assert codecache._load(cache) == {}


def test_it_is_written_as_pyc_files_are(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_record()
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert not codecache.save()  # PYTHONDONTWRITEBYTECODE
    assert not cache.exists()
    cache.parent.mkdir()
    cache.parent.chmod(0o500)
    try:
        writable = _writable(cache.parent)  # root writes anyway
        assert codecache.save(force=True) is writable
    finally:
        cache.parent.chmod(0o700)
    assert not list(cache.parent.glob("*.tmp"))


def _writable(folder: Path) -> bool:
    try:
        (folder / "probe").touch()
    except OSError:
        return False
    (folder / "probe").unlink()
    return True

"""Where tests pin eBPF probes: under one directory per test session on bpffs, removed when
the session ends, so a test run leaves no program attached to the machine and never touches
the pins of an agent running outside the tests (/sys/fs/bpf/gpuscope)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

BPFFS = Path("/sys/fs/bpf")
SESSION_PIN_ROOT = BPFFS / f"gpuscope-test-{os.getpid()}"


def pin_root(name: str) -> Path:
    """A pin root of its own for one agent or one test (a configuration of the probes)."""
    return SESSION_PIN_ROOT / name


def remove_pins(root: Path) -> None:
    """Unpin everything under `root`: the programs detach and their maps go."""
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def fresh_pin_root(name: str) -> Iterator[Path]:
    """`pin_root(name)`, empty on entry and removed on exit (for a test's fixture)."""
    root = pin_root(name)
    remove_pins(root)
    try:
        yield root
    finally:
        remove_pins(root)


def remove_session_pins() -> None:
    remove_pins(SESSION_PIN_ROOT)

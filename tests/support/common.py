"""Paths, constants and small helpers every tier uses."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPUSCOPE = [sys.executable, "-m", "gpuscope"]
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: frozen fake time for deterministic tests
GOLDEN_DIR = REPO / "tests" / "golden"  # golden files; GPUSCOPE_UPDATE_GOLDEN=1 rewrites them
UPDATE_GOLDEN = os.environ.get("GPUSCOPE_UPDATE_GOLDEN") == "1"
HEADERS = REPO / "build" / "kernel-headers" / "debian"  # `make kernel` builds this tree

# Root-only tests skip when not root, unless this is "1": then they fail (CI sets it, so a
# CI run can never pass by skipping them).
REQUIRE_ROOT_ENV = "GPUSCOPE_REQUIRE_ROOT"


def require_root(reason: str) -> None:
    """Skip the calling test when not running as uid 0, or fail it when $GPUSCOPE_REQUIRE_ROOT
    is 1. The `root` marker calls this before the test's fixtures are set up."""
    if os.geteuid() == 0:
        return
    message = f"needs root: {reason}"
    if os.environ.get(REQUIRE_ROOT_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_ROOT_ENV}=1 forbids skipping it)", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def assert_golden(path: Path, text: str, what: str = "/metrics") -> None:
    """`text` is the golden file `path`, byte for byte; with GPUSCOPE_UPDATE_GOLDEN=1 it
    becomes it first (review the diff like code). A difference fails with a unified diff."""
    if UPDATE_GOLDEN:
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run `make golden-update`"
    expected = path.read_text()
    if text != expected:
        import difflib

        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(True), text.splitlines(True), "golden", "actual", n=1
            )
        )
        pytest.fail(f"{what} differs from {path.name} (make golden-update if intended):\n{diff}")

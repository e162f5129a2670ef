"""Verdicts, statistics, timing and scraping that every check of `gpuscope check` uses."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from gpuscope.agent.app.agent import Agent

MIB = 1024 * 1024


PASS, FAIL, NOT_CHECKED = "pass", "fail", "not_checked"


TOLERANCE = 0.05  # busy and idle seconds: 5% of the expected value


# ... but never finer than this: a window's edges are read between sampler ticks (1 s), so
# a loaded machine can shift an edge by a fraction of a tick. Matters only for the short
# windows of --quick; in the default 60 s windows 5% is 3 s.
EDGE_SECONDS = 0.5


TICK_SHARE = 0.30  # a sampler tick may take 30% of its interval


COLLECT_BUDGET = 0.250  # seconds one collection (scrape) may take


FIELD_BUDGET = COLLECT_BUDGET / 5  # one device's batched field read


MIN_REPS = 3  # timed repetitions even when an item runs over its time budget


INSUFFICIENT_SIZE = 7


INVALID_ARGUMENT = 2


@dataclass
class Check:
    """One check's verdict. A failure's message names the problem and the numbers behind it;
    `details` holds everything measured, for the JSON report."""

    name: str
    status: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


def verdict(name: str, problems: Sequence[str], ok: str, details: dict[str, Any]) -> Check:
    """Fail with every problem found, else pass with the key numbers."""
    if problems:
        return Check(name, FAIL, "; ".join(problems), details)
    return Check(name, PASS, ok, details)


def not_checked(name: str, why: str, details: dict[str, Any] | None = None) -> Check:
    return Check(name, NOT_CHECKED, why, details or {})


def stats(values: Sequence[float]) -> dict[str, float | int | None]:
    """min/median/p90/max of a series (None when empty), for timings and spacings."""
    if not values:
        return {"n": 0, "min": None, "median": None, "p90": None, "max": None}
    s = sorted(values)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return {"n": len(s), "min": s[0], "median": statistics.median(s), "p90": p90, "max": s[-1]}


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    v = seconds * 1e3
    return f"{v:.0f} ms" if v >= 100 else f"{v:.1f} ms" if v >= 1 else f"{v:.3f} ms"


def num(x: float | None, unit: str = "", digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}{unit}"


def clocks_us() -> dict[str, float]:
    """Now on every clock an NVML timestamp could follow, in microseconds."""
    return {
        "realtime": time.time() * 1e6,
        "monotonic": time.monotonic() * 1e6,
        "boottime": time.clock_gettime(time.CLOCK_BOOTTIME) * 1e6,
    }


def error_names(lib: Any) -> dict[int, str]:
    """NVML return codes by name, from the bindings' own constants."""
    names = {0: "SUCCESS"}
    for key, val in vars(lib).items():
        if key.startswith("NVML_ERROR_") and isinstance(val, int):
            names.setdefault(val, key.removeprefix("NVML_ERROR_"))
    return names


def timed(fn: Callable[[], Any], reps: int, budget: float) -> tuple[list[float], Any]:
    """Up to `reps` timed calls, stopping early (after MIN_REPS) once `budget` seconds are
    spent: one pathologically slow call must not eat the whole run's time."""
    times: list[float] = []
    result: Any = None
    start = time.perf_counter()
    for i in range(reps):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
        if i + 1 >= MIN_REPS and time.perf_counter() - start > budget:
            break
    return times, result


Metrics = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(agent: Agent) -> Metrics:
    text_out = generate_latest(agent.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text_out)
        for s in family.samples
    }


def value(m: Metrics, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    for (n, ls), v in m.items():
        if n == name and want <= ls:
            return v
    return None


def label(m: Metrics, name: str, key: str, **labels: str) -> str | None:
    want = set(labels.items())
    for (n, ls), _ in m.items():
        if n == name and want <= ls:
            return dict(ls).get(key)
    return None


def say(line: str) -> None:
    print(line, flush=True)


def myself() -> list[str]:
    """This check as a child process: this interpreter (with its -S, where it has one) running
    the package, which `child_env()` puts on the child's path."""
    return [sys.executable, *(["-S"] if sys.flags.no_site else []), "-m", "gpuscope.agent.check"]


def child_env() -> dict[str, str]:
    """This environment, with the folder that holds the `gpuscope` package first on
    PYTHONPATH: a checkout (scripts/gpu-check) as well as an installed wheel."""
    import gpuscope

    root = str(Path(gpuscope.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{root}:{path}" if path else root}

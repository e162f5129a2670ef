"""Drive the fake AMD SMI library (fakeamdsmi.c) from tests (issue #23).

A :class:`FakeAmdSmi` owns one JSON state file.  It loads a profile (``profiles/``), keeps
the changes made through its setters, and rewrites the whole file atomically after every
change; the library reads it at ``amdsmi_init`` and re-reads it whenever it changes, so a
process running the real ``amdsmi`` bindings (started with :meth:`FakeAmdSmi.env`) sees a
change on its next call.

The ``amdsmi`` bindings load ``libamd_smi.so`` when imported, and only once per process, so
tests run them in a subprocess with :meth:`FakeAmdSmi.env`; never import ``amdsmi`` in the
pytest process.

Time is a fake clock in epoch seconds that only moves with :meth:`advance`, which also
accumulates each GPU's energy at its current power.
"""

from __future__ import annotations

import copy
import json
import os
import threading
from pathlib import Path
from typing import Any

from tests.doubles import fakelib

REPO_ROOT: Path = Path(__file__).resolve().parents[3]
ROCM_DIR: Path = REPO_ROOT / "build" / "fakeamdsmi"  # what ROCM_PATH points at
LIB_PATH: Path = ROCM_DIR / "lib" / "libamd_smi.so"
FAKEAMDSMI_DIR: Path = Path(__file__).resolve().parent
SOURCE_PATH: Path = FAKEAMDSMI_DIR / "fakeamdsmi.c"
PROFILES_DIR: Path = FAKEAMDSMI_DIR / "profiles"
STATE_ENV = "FAKEAMDSMI_STATE"
STATE_VERSION = 1

NA16 = 0xFFFF  # what the Python bindings show as "N/A" in activity and power_info
# amdsmi_temperature_type_t and amdsmi_clk_type_t: the state file's list positions.
TEMPERATURE_TYPES = ("edge", "junction", "vram", "hbm_0", "hbm_1", "hbm_2", "hbm_3")
CLOCK_TYPES = ("gfx", "df", "dcef", "soc", "mem", "pcie", "vclk0", "vclk1", "dclk0", "dclk1")


def ensure_built() -> Path:
    """Build the library with ``make -s fakeamdsmi`` if it is missing or stale; its path."""
    return fakelib.ensure_built("fakeamdsmi", LIB_PATH, SOURCE_PATH)


def list_profiles() -> list[str]:
    """Names of the profiles in ``profiles/`` (without ``.json``)."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def load_profile(name: str) -> dict[str, Any]:
    """The profile ``name`` with its ``model`` merged into each GPU (GPU keys win)."""
    profile: dict[str, Any] = json.loads((PROFILES_DIR / f"{name}.json").read_text())
    model = profile.get("model", {})
    profile["gpus"] = [{**model, **gpu} for gpu in profile["gpus"]]
    return profile


def _temperatures(spec: dict[str, Any]) -> list[int | None]:
    """The profile's ``{"junction": 42, "hbm": [..4]}`` as the 7 sensor types; None = absent."""
    hbm = list(spec.get("hbm", []))
    values = [spec.get("edge"), spec.get("junction"), spec.get("vram"), *hbm]
    values += [None] * (len(TEMPERATURE_TYPES) - len(values))
    return values[: len(TEMPERATURE_TYPES)]


class FakeAmdSmi:
    """One fake AMD SMI node: a profile plus runtime changes, written to ``state_path``."""

    def __init__(self, profile: str, state_path: str | os.PathLike[str], now: float = 1.7e9):
        self.profile = load_profile(profile)
        self.state_path = Path(state_path)
        self._now_ns = round(now * 1e9)  # integer ns: timestamps differ exactly
        self._lock = threading.RLock()
        self._state_file = fakelib.StateFile(self.state_path)
        self._gpus: list[dict[str, Any]] = []
        for index, g in enumerate(self.profile["gpus"]):
            temps = _temperatures(g.get("temperatures", {}))
            clocks = g.get("clocks", {})
            self._gpus.append(
                {
                    **{k: v for k, v in g.items() if k not in ("temperatures", "clocks")},
                    "socket": int(g.get("socket", index)),
                    "power_w": float(g.get("power_idle_w", 0)),
                    # Counters start at boot: the idle power over the uptime so far.
                    "energy_j": float(g.get("power_idle_w", 0)) * float(g.get("uptime_s", 0)),
                    "temps": temps,
                    "clocks": [clocks.get(name) for name in CLOCK_TYPES],
                }
            )
        self._write()

    # ---- process environment -------------------------------------------------

    def env(self) -> dict[str, str]:
        """Variables that make the real ``amdsmi`` (in a subprocess) load this fake.

        The wrapper tries ``$ROCM_HOME/lib`` before ``$ROCM_PATH/lib``: both are set.
        """
        ensure_built()
        return {
            "ROCM_PATH": str(ROCM_DIR),
            "ROCM_HOME": str(ROCM_DIR),
            STATE_ENV: str(self.state_path),
        }

    # ---- what tests change ---------------------------------------------------

    @property
    def now(self) -> float:
        """The fake clock, epoch seconds."""
        return self._now_ns / 1e9

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    def gpu(self, index: int) -> dict[str, Any]:
        """A copy of GPU ``index``'s current attributes (profile keys plus runtime ones)."""
        with self._lock:
            return copy.deepcopy(self._gpus[index])

    def set_activity(
        self, gpu: int, gfx: int, umc: int | None = None, mm: int | None = None
    ) -> None:
        """Busy percentages (0-100) of amdsmi_get_gpu_activity; ``mm`` None keeps it."""
        with self._lock:
            g = self._gpus[gpu]
            g["gfx_activity"] = _percent(gfx)
            if umc is not None:
                g["umc_activity"] = _percent(umc)
            if mm is not None:
                g["mm_activity"] = _percent(mm)
            self._write()

    def set_power(self, gpu: int, watts: float) -> None:
        """The socket power from now on; :meth:`advance` integrates it into the energy."""
        if watts < 0:
            raise ValueError(f"power must be >= 0 W, not {watts}")
        with self._lock:
            self._gpus[gpu]["power_w"] = float(watts)
            self._write()

    def set_vram_used(self, gpu: int, mb: int) -> None:
        with self._lock:
            g = self._gpus[gpu]
            if not 0 <= mb <= int(g["vram_total_mb"]):
                raise ValueError(f"vram used {mb} MB outside 0..{g['vram_total_mb']}")
            g["vram_used_mb"] = int(mb)
            self._write()

    def set_temperature(self, gpu: int, sensor: str, celsius: int | None) -> None:
        """A sensor of TEMPERATURE_TYPES; None makes it absent (NOT_SUPPORTED)."""
        with self._lock:
            self._gpus[gpu]["temps"][TEMPERATURE_TYPES.index(sensor)] = celsius
            self._write()

    def add_energy(self, gpu: int, joules: float) -> None:
        """Energy on top of what :meth:`advance` accumulates (never negative)."""
        if joules < 0:
            raise ValueError("the energy counter only grows")
        with self._lock:
            self._gpus[gpu]["energy_j"] += joules
            self._write()

    def advance(self, seconds: float) -> None:
        """Move the fake clock; each GPU's energy grows by its current power x ``seconds``."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        with self._lock:
            self._now_ns += round(seconds * 1e9)
            for g in self._gpus:
                g["energy_j"] += g["power_w"] * seconds
            self._write()

    def energy_counts(self, gpu: int) -> int:
        """What amdsmi_get_energy_count reports as the accumulator now."""
        with self._lock:
            g = self._gpus[gpu]
            return int(g["energy_j"] * 1e6 / float(g["energy_resolution"]))

    # ---- the state file --------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The state file's content (version 1; see tests/doubles/README.md)."""
        with self._lock:
            procs = []
            for index, g in enumerate(self._gpus):
                watts = round(g["power_w"])
                proc: dict[str, Any] = {
                    k: g[k]
                    for k in (
                        "socket", "market_name", "vendor_name", "asic_serial", "uuid", "bdf",
                        "vendor_id", "subvendor_id", "device_id", "rev_id", "oam_id",
                        "num_compute_units", "target_graphics_version", "subsystem_id",
                        "vram_total_mb", "vram_used_mb", "gfx_activity", "umc_activity",
                        "mm_activity", "average_socket_power", "gfx_voltage", "soc_voltage",
                        "mem_voltage", "power_limit", "energy_resolution",
                    )
                    if k in g
                }  # fmt: skip
                proc["socket_power"] = watts
                proc["current_socket_power"] = watts
                proc["energy_count"] = self.energy_counts(index)
                proc["energy_timestamp_ns"] = self._now_ns
                proc["temperatures"] = g["temps"]
                proc["clocks"] = g["clocks"]
                procs.append(proc)
            return {"version": STATE_VERSION, "processors": procs}

    def _write(self) -> None:
        """Replace the state file (`fakelib.StateFile`: atomically, the mtime increasing)."""
        with self._lock:
            self._state_file.write(json.dumps(self.state(), indent=1))


def _percent(value: int) -> int:
    if value != NA16 and not 0 <= value <= 100:
        raise ValueError(f"activity {value} is not a percentage (or 0xFFFF for N/A)")
    return int(value)

"""Drive the fake NVML library (fakenvml.c) from tests and the demo.

A :class:`FakeNvml` owns one state file.  It loads a JSON profile (``profiles/``,
GPU models from ``models.json``), keeps the runtime changes made through its
methods, and rewrites the whole state file atomically after every change.  The C
library re-reads that file whenever it changes, so a running process that uses
pynvml (in this process after :meth:`FakeNvml.activate`, or a subprocess started
with :meth:`FakeNvml.env`) sees every change on its next call.

Time is in epoch seconds in this API and in epoch microseconds in the state file.
With ``now=...`` the fake clock is frozen and only moves with :meth:`set_time` /
:meth:`advance`; otherwise the library uses the real clock.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.doubles import fakelib

REPO_ROOT: Path = Path(__file__).resolve().parents[3]
LIB_DIR: Path = REPO_ROOT / "build" / "fakenvml"
LIB_PATH: Path = LIB_DIR / "libnvidia-ml.so.1"
FAKENVML_DIR: Path = Path(__file__).resolve().parent
SOURCE_PATH: Path = FAKENVML_DIR / "fakenvml.c"
PROFILES_DIR: Path = FAKENVML_DIR / "profiles"
MODELS_PATH: Path = FAKENVML_DIR / "models.json"
STATE_ENV = "FAKENVML_STATE"
STATE_VERSION = 1

NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of non-MIG processes and events
MAX_EVENTS_KEPT = 4096  # older injected events are dropped from the state file

_ARCHITECTURES = {"kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6,
                  "ampere": 7, "ada": 8, "hopper": 9, "blackwell": 10}  # fmt: skip
_BRANDS = {"unknown": 0, "quadro": 1, "tesla": 2, "nvs": 3, "geforce": 5, "titan": 6,
           "quadro_rtx": 12, "nvidia_rtx": 13, "nvidia": 14}  # fmt: skip
_NVLINK_ERROR_KINDS = ("crc_flit", "crc_data", "replay", "recovery")
# nvmlNvLinkCapability_t bit positions; the default is what NVLink GPUs on x86 hosts report.
_NVLINK_CAPABILITIES = {"p2p_supported": 0, "sysmem_access": 1, "p2p_atomics": 2,
                        "sysmem_atomics": 3, "sli_bridge": 4, "valid": 5}  # fmt: skip
_DEFAULT_NVLINK_CAPABILITIES = ("p2p_supported", "p2p_atomics", "valid")
NVLINK_DEVICE_TYPE_GPU = 0
NVLINK_DEVICE_TYPE_SWITCH = 2
_FABRIC_STATES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
_FABRIC_HEALTH_SUMMARIES = {"not_supported": 0, "healthy": 1, "unhealthy": 2,
                            "limited_capacity": 3}  # fmt: skip

# GPM activity (nvmlGpmMetricsGet): each modelled metric is one of these fractions of the GPU's
# utilization timeline, in the order of the state file's "gpm" lines.  "graphics" is
# GRAPHICS_UTIL, "sm_active" SM_UTIL, "tensor" ANY_TENSOR_UTIL, "dram" DRAM_BW_UTIL.
GPM_ACTIVITY_KEYS = ("graphics", "sm_active", "sm_occupancy", "tensor", "dram",
                     "fp64", "fp32", "fp16", "integer")  # fmt: skip
# What a Hopper-or-later GPU (and each MIG GPU instance) does while busy unless the profile's
# "gpm_activity" or set_gpm_activity() says otherwise: a dense bf16 training step, whose
# kernels keep most SMs but far from every warp slot busy.
DEFAULT_GPM_ACTIVITY: dict[str, float] = {
    "graphics": 1.0, "sm_active": 0.85, "sm_occupancy": 0.45, "tensor": 0.55, "dram": 0.4,
    "fp64": 0.0, "fp32": 0.2, "fp16": 0.1, "integer": 0.15,
}  # fmt: skip
MIG_COMPUTE_SLICES = 7  # a whole MIG-capable GPU, as fakenvml.c's FAKE_MIG_SLICES

# Realistic-timing mode: process utilization samples every this many seconds (see README).
DEFAULT_PROCESS_SAMPLE_PERIOD = 5.0

# The error codes nvml.h defines (nvmlReturn_t but NVML_SUCCESS): what error_storm() accepts.
NVML_ERROR_CODES: dict[int, str] = {
    1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED", 4: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED", 6: "NOT_FOUND", 7: "INSUFFICIENT_SIZE", 8: "INSUFFICIENT_POWER",
    9: "DRIVER_NOT_LOADED", 10: "TIMEOUT", 11: "IRQ_ISSUE", 12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND", 14: "CORRUPTED_INFOROM", 15: "GPU_IS_LOST", 16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM", 18: "LIB_RM_VERSION_MISMATCH", 19: "IN_USE", 20: "MEMORY",
    21: "NO_DATA", 22: "VGPU_ECC_NOT_SUPPORTED", 23: "INSUFFICIENT_RESOURCES",
    24: "FREQ_NOT_SUPPORTED", 25: "ARGUMENT_VERSION_MISMATCH", 26: "DEPRECATED",
    27: "NOT_READY", 28: "GPU_NOT_FOUND", 29: "INVALID_STATE", 30: "RESET_TYPE_NOT_SUPPORTED",
    999: "UNKNOWN",
}  # fmt: skip

_build_lock = threading.Lock()
_loaded_lib: ctypes.CDLL | None = None


def ensure_built() -> Path:
    """Build the library with ``make -s fakenvml`` if it is missing or stale; return its path."""
    return fakelib.ensure_built("fakenvml", LIB_PATH, SOURCE_PATH)


def list_profiles() -> list[str]:
    """Names of the profiles in ``profiles/`` (without ``.json``)."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def load_profile(name: str) -> dict[str, Any]:
    """The profile ``name`` with each GPU's model attributes merged in (GPU keys win).

    The profile-level ``fabric`` and ``nvlink_remote`` are defaults for every GPU
    (``nvlink_remote`` only for GPUs whose model has NVLink).  A profile with
    ``"extends": "<profile>"`` is that profile with its own top-level keys replacing the base's.
    """
    profile = _read_profile(name)
    models: dict[str, Any] = json.loads(MODELS_PATH.read_text())
    models.update(profile.get("models", {}))
    gpus = []
    defaults: dict[str, Any] = {}
    if "fabric" in profile:
        defaults["fabric"] = profile["fabric"]
    for entry in profile["gpus"]:
        model = models[entry["model"]]
        gpu = {**defaults, **model, **entry}
        if "nvlink_remote" in profile and gpu.get("nvlink") and "nvlink_remote" not in entry:
            gpu["nvlink_remote"] = profile["nvlink_remote"]
        gpus.append(gpu)
    profile["gpus"] = gpus
    return profile


def _read_profile(name: str, depth: int = 0) -> dict[str, Any]:
    path = PROFILES_DIR / f"{name}.json"
    if not path.exists():
        raise ValueError(f"unknown fakenvml profile {name!r}; known: {list_profiles()}")
    profile: dict[str, Any] = json.loads(path.read_text())
    base = profile.pop("extends", None)
    if base is None:
        return profile
    if depth > 8:
        raise ValueError(f"fakenvml profile {name!r}: 'extends' chain too long")
    return {**_read_profile(str(base), depth + 1), **profile}


def _to_us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _num(value: float) -> str:
    """A number as the C parser reads it (integers without a fraction)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _check_pct(value: float, what: str) -> float:
    if not 0.0 <= value <= 100.0:
        raise ValueError(f"{what} must be within [0, 100], got {value}")
    return float(value)


def _check_fraction(value: float, what: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be within [0, 1], got {value}")
    return float(value)


def _check_function(function: str | None) -> None:
    if function is not None and (not function.startswith("nvml") or " " in function):
        raise ValueError(f"not an NVML entry point name: {function!r}")


@dataclass(frozen=True)
class _Hang:
    """A "hang" rule: matching calls block until it is removed or real time passes until_us."""

    seq: int
    until_us: int  # 0: until released
    function: str  # "*": every call
    gpu: int  # -1: every GPU and device-less calls


@dataclass(frozen=True)
class _Storm:
    """A "storm" rule: the next `count` matching calls (per process; -1: all) fail with `code`."""

    seq: int
    code: int
    count: int
    function: str
    gpu: int


@dataclass(frozen=True)
class BlockedCall:
    """A call that the library holds in a hang right now (see FakeNvml.hang_call)."""

    pid: int  # the process making the call
    function: str  # its entry point, e.g. "nvmlDeviceGetPowerUsage"
    gpu: int | None  # the GPU whose handle it was called on; None for a device-less call
    since: float  # when it started waiting, epoch seconds


@dataclass(frozen=True)
class _UtilEntry:
    """A utilization pattern starting at ``start_us``: (duration_us, gpu_pct, mem_pct) segments."""

    start_us: int
    repeat: bool
    segments: tuple[tuple[int, float, float], ...]

    @property
    def length(self) -> int:
        return sum(s[0] for s in self.segments)

    def _partial(self, which: int, x: int) -> float:
        total = 0.0
        for seg in self.segments:
            if x <= 0:
                break
            d = min(seg[0], x)
            total += d * seg[1 + which]
            x -= d
        return total

    def integral(self, which: int, x: int) -> float:
        """Integral of the pattern over [0, x) in pct * us (same algorithm as the C library)."""
        if x <= 0:
            return 0.0
        length = self.length
        if x < length:
            return self._partial(which, x)
        cycle = self._partial(which, length)
        if not self.repeat:
            return cycle + (x - length) * self.segments[-1][1 + which]
        n, r = divmod(x, length)
        return n * cycle + self._partial(which, r)

    def line(self, gpu: int) -> str:
        segs = " ".join(f"{d} {_num(g)} {_num(m)}" for d, g, m in self.segments)
        return f"u {gpu} {self.start_us} {int(self.repeat)} {len(self.segments)} {segs}"


@dataclass
class _Mig:
    profile: str
    gi: int
    ci: int
    slices: int
    memory_bytes: int
    uuid: str


@dataclass
class _Process:
    pid: int
    used_memory_bytes: int
    sm_util: float
    mem_util: float
    gi: int = NO_INSTANCE
    ci: int = NO_INSTANCE


@dataclass
class _Gpu:
    attrs: dict[str, int | float | str]
    util: list[_UtilEntry] = field(default_factory=list)
    power: list[tuple[int, float]] = field(default_factory=list)  # (start_us, watts; -1 = model)
    link_states: list[tuple[int, int, bool]] = field(default_factory=list)  # (start_us, link, up)
    link_errors: dict[int, list[int]] = field(default_factory=dict)
    migs: list[_Mig] = field(default_factory=list)
    procs: dict[int, _Process] = field(default_factory=dict)
    fabric_script: list[tuple[int, int, int]] = field(default_factory=list)  # start_us, state, st
    # GPM activity: (start_us, gpu instance id or -1 for the whole GPU, GPM_ACTIVITY_KEYS values)
    gpm: list[tuple[int, int, tuple[float, ...]]] = field(default_factory=list)


def _hex_or_int(value: str | int) -> int:
    return int(value, 0) if isinstance(value, str) else int(value)


def _identity_attrs(index: int, g: dict[str, Any]) -> dict[str, int | float | str]:
    """What names the GPU and where it sits: identity, PCI ids, architecture, NUMA node."""
    cc = g["cuda_compute_capability"]
    return {
        "name": g["name"],
        "uuid": g["uuid"],
        "serial": g["serial"],
        "part_number": g["board_part_number"],
        "pci_bus_id": g["pci_bus_id"],
        "pci_device_id": _hex_or_int(g["pci_device_id"]),
        "pci_subsystem_id": _hex_or_int(g["pci_subsystem_id"]),
        "arch": _ARCHITECTURES[g["architecture"]],
        "cc_major": int(cc[0]),
        "cc_minor": int(cc[1]),
        "numa_node": int(g["numa_node"]) if g.get("numa_node") is not None else -1,
        "minor": int(g.get("minor_number", index)),
        "brand": _BRANDS[g.get("brand", "nvidia")],
        "persistence": int(bool(g.get("persistence_mode", True))),
    }


def _memory_power_attrs(g: dict[str, Any]) -> dict[str, int | float | str]:
    """Memory sizes, power limits and the temperature model the fake derives readings from."""
    mib = 1024 * 1024
    temp = g["temperature"]
    mem_temp = g.get("memory_temperature")
    return {
        "mem_total": int(g["memory_total_mib"]) * mib,
        "mem_reserved": int(g["memory_reserved_mib"]) * mib,
        "mem_used": int(g.get("memory_used_mib", 0)) * mib,
        "power_limit_mw": round(float(g["power_limit_w"]) * 1000),
        "power_idle_w": float(g["power_idle_w"]),
        "power_max_w": float(g["power_max_draw_w"]),
        "temp_base": float(temp["base_c"]),
        "temp_slope": float(temp["slope_c_per_pct"]),
        "mem_temp_supported": int(mem_temp is not None),
        "mem_temp_base": float(mem_temp["base_c"]) if mem_temp else 0.0,
        "mem_temp_slope": float(mem_temp["slope_c_per_pct"]) if mem_temp else 0.0,
    }


def _clock_attrs(clocks: dict[str, Any]) -> dict[str, int | float | str]:
    """Clock ranges (MHz); readings move between idle and max with utilization."""
    return {
        "clk_graphics_max": clocks["graphics_max"],
        "clk_graphics_idle": clocks["graphics_idle"],
        "clk_sm_max": clocks["sm_max"],
        "clk_sm_idle": clocks["sm_idle"],
        "clk_mem": clocks["memory"],
        "clk_video_max": clocks["video_max"],
        "clk_video_idle": clocks["video_idle"],
        "throttle_mask": 0,
    }


def _pcie_attrs(pcie: dict[str, Any]) -> dict[str, int | float | str]:
    """PCIe link: the current link starts at its maximum, the counters at zero."""
    return {
        "pcie_gen_max": pcie["max_generation"],
        "pcie_gen_gpu_max": pcie.get("gpu_max_generation", pcie["max_generation"]),
        "pcie_width_max": pcie["max_width"],
        "pcie_gen": pcie["max_generation"],
        "pcie_width": pcie["max_width"],
        "pcie_tx_kibps": float(pcie["max_tx_kib_per_s"]),
        "pcie_rx_kibps": float(pcie["max_rx_kib_per_s"]),
        "pcie_byte_counters": int(bool(pcie.get("byte_counters", False))),
        "pcie_replay": 0,
    }


def _nvlink_attrs(nvlink: dict[str, Any] | None) -> dict[str, int | float | str]:
    """NVLink links and speed; all zero on a GPU without NVLink."""
    return {
        "nvlink_count": int(nvlink["links"]) if nvlink else 0,
        "nvlink_version": int(nvlink["version"]) if nvlink else 0,
        "nvlink_kibps": float(nvlink["max_kib_per_s_per_link"]) if nvlink else 0.0,
    }


def _error_attrs(g: dict[str, Any]) -> dict[str, int | float | str]:
    """ECC and row-remapping: volatile counters start at zero, aggregate ones from the profile."""
    return {
        "ecc": int(bool(g.get("ecc", True))),
        "ecc_corr_vol": 0,
        "ecc_unc_vol": 0,
        "ecc_corr_agg": int(g.get("ecc_corrected_aggregate", 0)),
        "ecc_unc_agg": int(g.get("ecc_uncorrected_aggregate", 0)),
        "row_remap": int(bool(g.get("row_remapping", False))),
        "rr_corr": 0,
        "rr_unc": 0,
        "rr_pending": 0,
        "rr_failure": 0,
        "recovery_action": 0,  # NVML_GPU_RECOVERY_ACTION_NONE
    }


def _mig_attrs(mig: dict[str, Any] | None, g: dict[str, Any]) -> dict[str, int | float | str]:
    """MIG capability and mode; a mode set on a non-capable GPU is rejected by the caller."""
    return {
        "mig_capable": int(mig is not None),
        "mig_mode": int(bool(g.get("mig_enabled", False))),
        "mig_pending": int(bool(g.get("mig_enabled", False))),
        "mig_max": int(mig["max_devices"]) if mig else 0,
    }


def _gpu_attrs(index: int, g: dict[str, Any]) -> dict[str, int | float | str]:
    """Profile/model keys -> the C library's per-GPU state keys."""
    mig = g.get("mig")
    attrs: dict[str, int | float | str] = {
        **_identity_attrs(index, g),
        **_memory_power_attrs(g),
        **_clock_attrs(g["clocks_mhz"]),
        **_pcie_attrs(g["pcie"]),
        **_nvlink_attrs(g.get("nvlink")),
        **_error_attrs(g),
        **_mig_attrs(mig, g),
        "event_types": int(g.get("supported_event_types", 0x1F)),
        "lost": 0,
    }
    attrs.update(_topology_attrs(g))
    attrs.update(_fabric_attrs(g.get("fabric")))
    if attrs["mig_mode"] and not mig:
        raise ValueError(f"GPU {index} ({g['name']}) is not MIG-capable")
    return attrs


def _topology_attrs(g: dict[str, Any]) -> dict[str, int | float | str]:
    """PCIe topology (host bridge, switch chain) and NVLink capabilities as state keys."""
    attrs: dict[str, int | float | str] = {}
    topo = g.get("topology")
    if topo:
        switches = list(topo.get("switches", ()))
        for name in (topo["host_bridge"], *switches):
            if not name or any(c.isspace() for c in name) or name == "-" or len(name) > 63:
                raise ValueError(f"bad topology name {name!r} on {g['uuid']}")
        if len(switches) > 8 or len(" ".join(switches)) > 255:  # the C library's limits
            raise ValueError(f"too many PCIe switches above {g['uuid']}")
        attrs["topo_host_bridge"] = topo["host_bridge"]
        attrs["topo_switches"] = " ".join(switches) or "-"
    caps = (g.get("nvlink") or {}).get("capabilities", _DEFAULT_NVLINK_CAPABILITIES)
    attrs["nvlink_caps"] = sum(1 << _NVLINK_CAPABILITIES[c] for c in set(caps))
    return attrs


def _fabric_uuid_hex(uuid: str) -> str:
    digits = uuid.replace("-", "").lower()
    if len(digits) != 32 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"fabric cluster_uuid must be 16 bytes of hex, got {uuid!r}")
    return digits


def _fabric_attrs(fabric: dict[str, Any] | None) -> dict[str, int | float | str]:
    """GPU fabric (multi-node NVLink) info as state keys; None = NOT_SUPPORTED."""
    if not fabric:
        return {"fabric": 0}
    return {
        "fabric": 1,
        "fabric_cluster_uuid": _fabric_uuid_hex(fabric["cluster_uuid"]),
        "fabric_clique": int(fabric["clique_id"]),
        "fabric_state": _FABRIC_STATES[fabric.get("state", "completed")],
        "fabric_status": int(fabric.get("status", 0)),
        "fabric_health_mask": int(fabric.get("health_mask", 0)),
        "fabric_health_summary": _FABRIC_HEALTH_SUMMARIES[fabric.get("health_summary", "healthy")],
    }


def _parse_cpulist(text: str) -> list[tuple[int, int]]:
    """Parse a CPU list such as 0-55,112-167 into ranges (the C library parses the text)."""
    ranges = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if not 0 <= a <= b:
            raise ValueError(f"bad CPU list {text!r}")
        ranges.append((a, b))
    return ranges


@dataclass(frozen=True)
class _Remote:
    """The far end of one NVLink: an NVSwitch or a GPU (pci_bus_id None: not a PCI device)."""

    device_type: int
    pci_bus_id: str | None
    pci_device_id: int
    pci_subsystem_id: int
    name: str

    def line(self, gpu: int, link: int) -> str:
        return (
            f"nvr {gpu} {link} {self.device_type} {self.pci_bus_id or '-'}"
            f" {self.pci_device_id} {self.pci_subsystem_id}"
        )


def _nvlink_remotes(profile: dict[str, Any]) -> list[list[_Remote]]:
    """Per GPU, the remote end of each link, from ``nvlink_remote`` and ``nvswitches``."""
    switches = profile.get("nvswitches", [])
    result: list[list[_Remote]] = []
    for i, g in enumerate(profile["gpus"]):
        remotes: list[_Remote] = []
        for entry in g.get("nvlink_remote", []) if g.get("nvlink") else []:
            if "nvswitch" in entry:
                sw = switches[int(entry["nvswitch"])]
                remote = _Remote(
                    NVLINK_DEVICE_TYPE_SWITCH,
                    sw.get("pci_bus_id"),
                    _hex_or_int(sw.get("pci_device_id", 0)),
                    _hex_or_int(sw.get("pci_subsystem_id", 0)),
                    sw.get("name", f"nvswitch{entry['nvswitch']}"),
                )
            else:
                peer_index = int(entry["gpu"])
                if peer_index == i:
                    raise ValueError(f"GPU {i}: an NVLink cannot loop back to its own GPU")
                peer = profile["gpus"][peer_index]
                remote = _Remote(
                    NVLINK_DEVICE_TYPE_GPU,
                    peer["pci_bus_id"],
                    _hex_or_int(peer["pci_device_id"]),
                    _hex_or_int(peer["pci_subsystem_id"]),
                    f"gpu{peer_index}",
                )
            remotes.extend([remote] * int(entry["links"]))
        if remotes and len(remotes) != int(g["nvlink"]["links"]):
            raise ValueError(
                f"GPU {i}: nvlink_remote covers {len(remotes)} links, the model has "
                f"{g['nvlink']['links']}"
            )
        result.append(remotes)
    return result


class FakeNvml:
    """One fake node: a profile plus runtime changes, mirrored into ``state_path``."""

    def __init__(self, profile: str, state_path: Path, *, now: float | None = None) -> None:
        self.profile_name = profile
        self.profile: dict[str, Any] = load_profile(profile)
        self.state_path = Path(state_path)
        self._lock = threading.RLock()
        self._frozen_us: int | None = None if now is None else _to_us(now)
        self._boot_us = self._now_us() - _to_us(float(self.profile.get("uptime_s", 3600)))
        self._period_us = int(self.profile.get("sample_period_us", 166667))
        realistic = self.profile.get("realistic_timing")
        self._realistic = bool(realistic)
        self._proc_period_us = _to_us(
            float((realistic or {}).get("process_sample_period_s", DEFAULT_PROCESS_SAMPLE_PERIOD))
        )
        self._latency: dict[tuple[str, int], int] = {}  # (function or "*", gpu or -1) -> us
        self._hangs: list[_Hang] = []
        self._storms: list[_Storm] = []
        self._fault_seq = 0  # last hang/storm rule number (see _next_fault_seq)
        self._batch_owner: int | None = None  # thread inside batch(), if any
        self._seq = 0
        self._events: list[tuple[int, int, int, int, int]] = []  # seq, gpu, xid, gi, ci
        self._batch_depth = 0
        self._dirty = False
        self._state_file = fakelib.StateFile(self.state_path)
        self._gpus: list[_Gpu] = []
        for i, g in enumerate(self.profile["gpus"]):
            gpu = _Gpu(attrs=_gpu_attrs(i, g))
            gpu.util.append(_UtilEntry(self._boot_us, False, ((1, 0.0, 0.0),)))
            mig_profiles = (g.get("mig") or {}).get("profiles", {})
            for m in g.get("mig_devices", []):
                spec = mig_profiles[m["profile"]]
                gpu.migs.append(
                    _Mig(
                        profile=m["profile"],
                        gi=int(m["gpu_instance_id"]),
                        ci=int(m.get("compute_instance_id", 0)),
                        slices=int(spec["slices"]),
                        memory_bytes=int(spec["memory_mib"]) * 1024 * 1024,
                        uuid=m["uuid"],
                    )
                )
            if int(gpu.attrs["arch"]) >= _ARCHITECTURES["hopper"]:
                activity = {**DEFAULT_GPM_ACTIVITY, **self.profile.get("gpm_activity", {})}
                values = tuple(_check_fraction(activity[k], k) for k in GPM_ACTIVITY_KEYS)
                for gi in [-1, *sorted({m.gi for m in gpu.migs})]:
                    gpu.gpm.append((self._boot_us, gi, values))
            self._gpus.append(gpu)
        self._nvlink_remotes = _nvlink_remotes(self.profile)
        self._numa_cpus = {
            int(node): str(cpus) for node, cpus in self.profile.get("numa_cpus", {}).items()
        }
        for cpus in self._numa_cpus.values():
            _parse_cpulist(cpus)
        self._write()

    # ---- process environment -------------------------------------------------

    def env(self) -> dict[str, str]:
        """Environment variables that point a subprocess's NVML at this fake."""
        ensure_built()
        existing = os.environ.get("LD_LIBRARY_PATH", "")
        ld_path = f"{LIB_DIR}:{existing}" if existing else str(LIB_DIR)
        return {STATE_ENV: str(self.state_path), "LD_LIBRARY_PATH": ld_path}

    def activate(self) -> None:
        """Use this fake in this process: set $FAKENVML_STATE and preload the library.

        The library is dlopen()ed by full path with RTLD_GLOBAL, so pynvml's
        ``CDLL("libnvidia-ml.so.1")`` resolves to it by soname.  The library reads
        $FAKENVML_STATE at nvmlInit when it is not initialized, so switch fakes
        between a full nvmlShutdown and the next nvmlInit.
        """
        global _loaded_lib
        path = ensure_built()
        os.environ[STATE_ENV] = str(self.state_path)
        if _loaded_lib is None:
            _loaded_lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)

    # ---- time -----------------------------------------------------------------

    def _now_us(self) -> int:
        return self._frozen_us if self._frozen_us is not None else time.time_ns() // 1000

    @property
    def now(self) -> float:
        """Current fake time in epoch seconds (the real time when the clock is not frozen)."""
        return self._now_us() / 1e6

    @property
    def boot_time(self) -> float:
        """When the fake driver was loaded (counters start there), epoch seconds."""
        return self._boot_us / 1e6

    @property
    def sample_period(self) -> float:
        """Utilization sample period in seconds."""
        return self._period_us / 1e6

    def set_time(self, t: float) -> None:
        """Freeze the fake clock at ``t`` (epoch seconds).  Time should only move forward."""
        with self._lock:
            self._frozen_us = _to_us(t)
            self._commit()

    def advance(self, seconds: float) -> None:
        """Move the frozen clock forward (freezes it at now + seconds if it was real)."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        with self._lock:
            self._frozen_us = self._now_us() + _to_us(seconds)
            self._commit()

    # ---- batching and writing ------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group changes: the state file is written once, when the outermost block exits."""
        with self._lock:
            self._batch_depth += 1
            self._batch_owner = threading.get_ident()
            try:
                yield
            finally:
                self._batch_depth -= 1
                if self._batch_depth == 0:
                    self._batch_owner = None
                    if self._dirty:
                        self._write()

    def in_batch(self) -> bool:
        """Whether the calling thread is inside :meth:`batch` (and so holds this fake's lock).

        The only way user code runs under the fake's lock; ``SimNode`` checks it to keep the
        one lock order of the test tooling (the node's lock before the fake's)."""
        return self._batch_owner == threading.get_ident()

    def _commit(self) -> None:
        if self._batch_depth > 0:
            self._dirty = True
        else:
            self._write()

    def state_text(self) -> str:
        """The state file's content for the current state."""
        with self._lock:
            return "".join(line + "\n" for line in self._state_lines())

    def _state_lines(self) -> Iterator[str]:
        p = self.profile
        yield f"fakenvml-state {STATE_VERSION}"
        yield f"# profile {self.profile_name}"
        if self._frozen_us is not None:
            yield f"now {self._frozen_us}"
        yield f"boot {self._boot_us}"
        yield f"period {self._period_us}"
        yield f"driver {p['driver_version']}"
        yield f"nvml {p['nvml_version']}"
        yield f"cuda {int(p['cuda_driver_version'])}"
        yield f"seq {self._seq}"
        if self._realistic:
            yield "realistic 1"
            yield f"proc_period {self._proc_period_us}"
        for (function, gpu_index), us in sorted(self._latency.items()):
            yield f"lat {us} {function} {gpu_index}"
        for hg in self._hangs:
            yield f"hang {hg.seq} {hg.until_us} {hg.function} {hg.gpu}"
        for st in self._storms:
            yield f"storm {st.seq} {st.code} {st.count} {st.function} {st.gpu}"
        for node, cpus in sorted(self._numa_cpus.items()):
            yield f"numa {node} {cpus}"
        yield f"gpus {len(self._gpus)}"
        for i, gpu in enumerate(self._gpus):
            for key, value in gpu.attrs.items():
                text = value if isinstance(value, str) else _num(value)
                yield f"g {i} {key} {text}"
            for link, counts in sorted(gpu.link_errors.items()):
                yield f"link {i} {link} {' '.join(str(c) for c in counts)}"
            for link, remote in enumerate(self._nvlink_remotes[i]):
                yield remote.line(i, link)
            for entry in gpu.util:
                yield entry.line(i)
            for start, watts in gpu.power:
                yield f"p {i} {start} {_num(watts)}"
            for start, link, up in gpu.link_states:
                yield f"ls {i} {link} {start} {int(up)}"
            for start, state, status in gpu.fabric_script:
                yield f"fs {i} {start} {state} {status}"
            for start, gi, values in gpu.gpm:
                yield f"gpm {i} {gi} {start} {' '.join(_num(v) for v in values)}"
            for m in gpu.migs:
                used = sum(
                    pr.used_memory_bytes
                    for pr in gpu.procs.values()
                    if (pr.gi, pr.ci) == (m.gi, m.ci)
                )
                yield (
                    f"mig {i} {m.gi} {m.ci} {m.slices} {m.memory_bytes} {used} {m.uuid} {m.profile}"
                )
            for pr in gpu.procs.values():
                yield (
                    f"proc {i} {pr.pid} {pr.used_memory_bytes} {round(pr.sm_util)}"
                    f" {round(pr.mem_util)} {pr.gi} {pr.ci}"
                )
        for seq, gpu_index, xid, gi, ci in self._events:
            yield f"ev {seq} {gpu_index} {xid} {gi} {ci}"
        yield "end"

    def _write(self) -> None:
        """Replace the state file (`fakelib.StateFile`: atomically, the mtime increasing)."""
        with self._lock:
            self._state_file.write(self.state_text())
            self._dirty = False

    # ---- queries ----------------------------------------------------------------

    def _gpu(self, gpu: int) -> _Gpu:
        if not 0 <= gpu < len(self._gpus):
            raise IndexError(f"GPU {gpu} does not exist (profile has {len(self._gpus)})")
        return self._gpus[gpu]

    def gpu_count(self) -> int:
        return len(self._gpus)

    def gpu_info(self, gpu: int) -> dict[str, int | float | str]:
        """The GPU's current state-file attributes (name, uuid, mem_total, nvlink_count, ...)."""
        return dict(self._gpu(gpu).attrs)

    def gpu_uuid(self, gpu: int) -> str:
        return str(self._gpu(gpu).attrs["uuid"])

    def topology(self, gpu: int) -> dict[str, Any] | None:
        """The GPU's PCIe placement from the profile (host_bridge, root_port, switches, nics)."""
        self._gpu(gpu)
        topo = self.profile["gpus"][gpu].get("topology")
        return dict(topo) if topo else None

    def nvlink_remote(self, gpu: int) -> list[dict[str, Any]]:
        """Per link, the far end: device_type (0 GPU, 2 NVSwitch), pci_bus_id (None when
        it is not a PCI device of this node), pci_device_id, pci_subsystem_id, name."""
        self._gpu(gpu)
        return [
            {
                "device_type": r.device_type,
                "pci_bus_id": r.pci_bus_id,
                "pci_device_id": r.pci_device_id,
                "pci_subsystem_id": r.pci_subsystem_id,
                "name": r.name,
            }
            for r in self._nvlink_remotes[gpu]
        ]

    def numa_cpus(self) -> dict[int, list[int]]:
        """CPUs of each NUMA node (from the profile's ``numa_cpus``)."""
        return {
            node: [c for a, b in _parse_cpulist(text) for c in range(a, b + 1)]
            for node, text in sorted(self._numa_cpus.items())
        }

    def mig_devices(self, gpu: int) -> list[dict[str, Any]]:
        """MIG devices of a GPU in NVML index order."""
        return [
            {
                "uuid": m.uuid,
                "profile": m.profile,
                "gpu_instance_id": m.gi,
                "compute_instance_id": m.ci,
                "memory_bytes": m.memory_bytes,
            }
            for m in self._gpu(gpu).migs
        ]

    def true_busy_seconds(self, gpu: int, start: float, end: float) -> float:
        """Exact integral of GPU utilization / 100 over [start, end] (epoch seconds)."""
        return self._util_integral(self._gpu(gpu), 0, _to_us(start), _to_us(end)) / 100.0 / 1e6

    def gpm_activity(self, gpu: int, mig_instance: int | None = None) -> dict[str, float]:
        """The GPM activity fractions in force now for the GPU or one of its GPU instances."""
        with self._lock:
            g = self._gpu(gpu)
            gi = -1 if mig_instance is None else int(mig_instance)
            current = [v for _, scope, v in g.gpm if scope == gi]
            values = (
                current[-1]
                if current
                else tuple(1.0 if k == "graphics" else 0.0 for k in GPM_ACTIVITY_KEYS)
            )
            return dict(zip(GPM_ACTIVITY_KEYS, values, strict=True))

    def true_gpm_seconds(
        self, gpu: int, key: str, start: float, end: float, mig_instance: int | None = None
    ) -> float:
        """Exact integral of one GPM metric (a GPM_ACTIVITY_KEYS name, as a ratio) over
        [start, end]: what nvmlGpmMetricsGet's percentage x the window / 100 comes to.  A
        MIG-enabled GPU as a whole is its GPU instances weighted by their compute slices."""
        k = GPM_ACTIVITY_KEYS.index(key)
        a, b = _to_us(start), _to_us(end)
        with self._lock:
            g = self._gpu(gpu)
            if mig_instance is None and int(g.attrs["mig_mode"]):
                slices: dict[int, int] = {}
                for m in g.migs:
                    slices.setdefault(m.gi, m.slices)
                total = sum(n * self._gpm_integral(g, gi, k, a, b) for gi, n in slices.items())
                return total / MIG_COMPUTE_SLICES / 100.0 / 1e6
            gi = -1 if mig_instance is None else int(mig_instance)
            return self._gpm_integral(g, gi, k, a, b) / 100.0 / 1e6

    def _gpm_integral(self, g: _Gpu, gi: int, k: int, a: int, b: int) -> float:
        """fraction x utilization integrated over [a, b) (pct x us), as gpm_scope_percent()."""
        total, f, cur = 0.0, 1.0 if k == 0 else 0.0, a
        for start, scope, values in g.gpm:
            if scope != gi or cur >= b:
                continue
            if start > cur:
                end = min(start, b)
                total += f * self._util_integral(g, 0, cur, end)
                cur = end
            f = values[k]
        if b > cur:
            total += f * self._util_integral(g, 0, cur, b)
        return total

    @staticmethod
    def _util_integral(gpu: _Gpu, which: int, a: int, b: int) -> float:
        total = 0.0
        entries = gpu.util
        for i, entry in enumerate(entries):
            end = entries[i + 1].start_us if i + 1 < len(entries) else None
            lo = max(a, entry.start_us)
            hi = b if end is None else min(b, end)
            if hi > lo:
                total += entry.integral(which, hi - entry.start_us) - entry.integral(
                    which, lo - entry.start_us
                )
        return total

    # ---- mutators -----------------------------------------------------------------

    def _append_timeline(self, timeline: list[Any], item: tuple[Any, ...] | _UtilEntry) -> None:
        start = item.start_us if isinstance(item, _UtilEntry) else item[0]

        def start_of(x: Any) -> int:
            return int(x.start_us if isinstance(x, _UtilEntry) else x[0])

        # Keep the timeline append-only in time: a change "now" replaces anything
        # that was scheduled at or after now (only happens if the clock went back).
        while timeline and start_of(timeline[-1]) >= start:
            timeline.pop()
        timeline.append(item)

    def set_utilization(
        self, gpu: int, percent: float, memory_percent: float | None = None
    ) -> None:
        """Constant utilization from now on; memory utilization defaults to half of ``percent``."""
        mem = percent / 2.0 if memory_percent is None else memory_percent
        self.set_utilization_pattern(gpu, [(1e-6, percent, mem)], repeat=False)

    def set_utilization_pattern(
        self, gpu: int, segments: Sequence[tuple[float, float, float]], *, repeat: bool = True
    ) -> None:
        """From now on: ``(duration_s, gpu_pct, mem_pct)`` segments, repeated or last one held."""
        if not segments:
            raise ValueError("a pattern needs at least one segment")
        segs = []
        for duration, gpu_pct, mem_pct in segments:
            d = _to_us(duration)
            if d <= 0:
                raise ValueError(f"segment duration must be >= 1 us, got {duration}")
            segs.append((d, _check_pct(gpu_pct, "gpu_pct"), _check_pct(mem_pct, "mem_pct")))
        with self._lock:
            g = self._gpu(gpu)
            self._append_timeline(g.util, _UtilEntry(self._now_us(), repeat, tuple(segs)))
            self._commit()

    def set_gpm_activity(
        self,
        gpu: int,
        *,
        sm_active: float | None = None,
        sm_occupancy: float | None = None,
        graphics: float | None = None,
        tensor: float | None = None,
        dram: float | None = None,
        fp64: float | None = None,
        fp32: float | None = None,
        fp16: float | None = None,
        integer: float | None = None,
        mig_instance: int | None = None,
    ) -> None:
        """From now on, what the GPU (or its MIG GPU instance ``mig_instance``, by GPU instance
        id) does while busy: each GPM metric is its fraction (0-1) x the utilization timeline.
        Fractions not given keep their current value."""
        given = {
            "graphics": graphics, "sm_active": sm_active, "sm_occupancy": sm_occupancy,
            "tensor": tensor, "dram": dram, "fp64": fp64, "fp32": fp32, "fp16": fp16,
            "integer": integer,
        }  # fmt: skip
        with self._lock:
            g = self._gpu(gpu)
            gi = -1
            if mig_instance is not None:
                gi = int(mig_instance)
                if gi not in {m.gi for m in g.migs}:
                    raise ValueError(f"GPU {gpu} has no GPU instance {gi}")
            values = self.gpm_activity(gpu, mig_instance)
            for key, value in given.items():
                if value is not None:
                    values[key] = _check_fraction(value, key)
            now = self._now_us()
            others = [e for e in g.gpm if e[1] != gi]
            mine = [e for e in g.gpm if e[1] == gi and e[0] < now]
            g.gpm = sorted(
                [*others, *mine, (now, gi, tuple(values[k] for k in GPM_ACTIVITY_KEYS))],
                key=lambda e: e[0],
            )
            self._commit()

    def set_memory_used(self, gpu: int, used_bytes: int) -> None:
        with self._lock:
            g = self._gpu(gpu)
            free = int(g.attrs["mem_total"]) - int(g.attrs["mem_reserved"])
            if not 0 <= used_bytes <= free:
                raise ValueError(f"used_bytes must be within [0, {free}]")
            g.attrs["mem_used"] = int(used_bytes)
            self._commit()

    def set_driver(self, driver_version: str, nvml_version: str | None = None) -> None:
        """Run another driver release than the profile names (before the agent's nvmlInit:
        the library reads it at init). Its branch and minor release decide which entry
        points, fields and struct layouts the fake answers with (tests/doubles/README.md)."""
        with self._lock:
            self.profile["driver_version"] = driver_version
            self.profile["nvml_version"] = nvml_version or f"12.{driver_version}"
            self._commit()

    def set_power(self, gpu: int, watts: float | None) -> None:
        """Override the power draw from now on (None: back to the utilization model)."""
        if watts is not None and watts < 0:
            raise ValueError("watts must be >= 0")
        with self._lock:
            g = self._gpu(gpu)
            self._append_timeline(g.power, (self._now_us(), -1.0 if watts is None else watts))
            self._commit()

    def set_temperature(self, gpu: int, celsius: float | None) -> None:
        """Override the GPU temperature (None: back to base + slope * utilization)."""
        with self._lock:
            g = self._gpu(gpu)
            if celsius is None:
                g.attrs.pop("temp_override", None)
            else:
                g.attrs["temp_override"] = float(celsius)
            self._commit()

    def set_throttle_reasons(self, gpu: int, mask: int) -> None:
        """Clocks-event reasons reported besides GpuIdle (which follows utilization)."""
        with self._lock:
            self._gpu(gpu).attrs["throttle_mask"] = int(mask)
            self._commit()

    def inject_xid(
        self,
        gpu: int,
        xid: int,
        *,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        """Append an XID critical-error event (delivered to event sets created before it)."""
        with self._lock:
            self._gpu(gpu)
            self._seq += 1
            gi = NO_INSTANCE if gpu_instance_id is None else gpu_instance_id
            ci = NO_INSTANCE if compute_instance_id is None else compute_instance_id
            self._events.append((self._seq, gpu, int(xid), gi, ci))
            del self._events[:-MAX_EVENTS_KEPT]
            self._commit()

    def lose_gpu(self, gpu: int) -> None:
        """Every call on this GPU's handles returns NVML_ERROR_GPU_IS_LOST from now on."""
        with self._lock:
            self._gpu(gpu).attrs["lost"] = 1
            self._commit()

    def restore_gpu(self, gpu: int) -> None:
        with self._lock:
            self._gpu(gpu).attrs["lost"] = 0
            self._commit()

    def set_fabric(
        self,
        gpu: int,
        *,
        state: str | None = None,
        status: int | None = None,
        health_mask: int | None = None,
        health_summary: str | None = None,
    ) -> None:
        """Change a fabric-attached GPU's fabric state (``not_started|in_progress|completed``),
        status (an NVML return code), health mask or summary; None leaves a value unchanged."""
        with self._lock:
            a = self._gpu(gpu).attrs
            if not a["fabric"]:
                raise ValueError(f"GPU {gpu} ({a['name']}) has no GPU fabric in this profile")
            if state is not None:
                a["fabric_state"] = _FABRIC_STATES[state]
            if status is not None:
                a["fabric_status"] = int(status)
            if health_mask is not None:
                a["fabric_health_mask"] = int(health_mask)
            if health_summary is not None:
                a["fabric_health_summary"] = _FABRIC_HEALTH_SUMMARIES[health_summary]
            self._commit()

    def script_fabric(self, gpu: int, steps: Sequence[tuple[float, str, int]]) -> None:
        """Schedule fabric states on the fake clock: ``(t_offset_s, state, status)`` from now.

        Each step takes effect when the fake time reaches now + offset (offsets non-decreasing,
        >= 0; state as for :meth:`set_fabric`, status an NVML return code), e.g. registration
        ``[(0, "not_started", 0), (5, "in_progress", 0), (20, "completed", 0)]``.  Replaces an
        earlier script; an empty one cancels it.  Before the first step, and without a script,
        the state of :meth:`set_fabric` / the profile applies.
        """
        with self._lock:
            g = self._gpu(gpu)
            if not g.attrs["fabric"]:
                raise ValueError(f"GPU {gpu} ({g.attrs['name']}) has no GPU fabric in this profile")
            now = self._now_us()
            script: list[tuple[int, int, int]] = []
            for offset, state, status in steps:
                start = now + _to_us(offset)
                if offset < 0 or (script and start < script[-1][0]):
                    raise ValueError("fabric script offsets must be >= 0 and non-decreasing")
                script.append((start, _FABRIC_STATES[state], int(status)))
            g.fabric_script = script
            self._commit()

    # ---- realistic timing and latency ------------------------------------------------

    def set_realistic_timing(
        self, on: bool = True, *, process_sample_period: float | None = None
    ) -> None:
        """Realistic-timing mode (see README): utilization samples only while the GPU is busy,
        per-process samples every ``process_sample_period`` s (default 5), and
        nvmlDeviceGetPcieThroughput blocking for its 20 ms measuring interval."""
        with self._lock:
            self._realistic = bool(on)
            if process_sample_period is not None:
                if process_sample_period <= 0:
                    raise ValueError("process_sample_period must be > 0")
                self._proc_period_us = _to_us(process_sample_period)
            self._commit()

    @property
    def realistic_timing(self) -> bool:
        return self._realistic

    @property
    def process_sample_period(self) -> float:
        """Realistic mode: seconds between per-process utilization samples."""
        return self._proc_period_us / 1e6

    def set_call_latency(
        self, seconds: float, function: str | None = None, gpu: int | None = None
    ) -> None:
        """Make calls take ``seconds`` longer (0 removes the rule): every call, or the NVML
        entry point named ``function`` (e.g. ``"nvmlDeviceGetPowerUsage"``), optionally only on
        ``gpu``'s handles.  The most specific rule applies (function and GPU, function, GPU,
        every call).  Initialisation, shutdown and nvmlErrorString are never delayed."""
        if seconds < 0:
            raise ValueError("latency must be >= 0")
        _check_function(function)
        with self._lock:
            if gpu is not None:
                self._gpu(gpu)
            key = (function or "*", -1 if gpu is None else int(gpu))
            if seconds == 0:
                self._latency.pop(key, None)
            else:
                self._latency[key] = max(1, _to_us(seconds))
            self._commit()

    # ---- faults: hung calls and error storms (test controls; see README) --------------

    def _next_fault_seq(self) -> int:
        """A rule number never used before on this state file, even by an earlier FakeNvml
        on the same path: the library counts storms per rule number across re-reads."""
        self._fault_seq = max(self._fault_seq + 1, time.time_ns() // 1000)
        return self._fault_seq

    def hang_call(
        self, function: str | None = None, gpu: int | None = None, seconds: float | None = None
    ) -> None:
        """From now on, calls to ``function`` (None: every call but nvmlInit*, nvmlShutdown
        and nvmlErrorString) on ``gpu``'s handles (None: every GPU, and device-less calls)
        block until :meth:`release_calls`, or for ``seconds`` of real time from now (None:
        until released), in any process; calls already blocked return as soon as the rule
        goes.  The hung call then answers as if it had just been made.  It holds no lock
        meanwhile, so other GPUs' calls go on; further matching calls hang too.  Stands for
        a GPU whose firmware stopped answering (XID 119/120, GSP timeout)."""
        _check_function(function)
        if seconds is not None and not 0 < seconds < float("inf"):
            raise ValueError(f"seconds must be > 0 and finite, got {seconds}")
        with self._lock:
            if gpu is not None:
                self._gpu(gpu)
            now_us = time.time_ns() // 1000
            until = 0 if seconds is None else now_us + max(1, _to_us(seconds))
            self._hangs = [h for h in self._hangs if h.until_us == 0 or h.until_us > now_us]
            self._hangs.append(
                _Hang(self._next_fault_seq(), until, function or "*", -1 if gpu is None else gpu)
            )
            self._commit()

    def release_calls(self, function: str | None = None, gpu: int | None = None) -> None:
        """Remove the hang rules set for ``function`` and ``gpu`` (None: any), so the calls
        they hold return; no arguments: every rule.  A rule for every GPU is removed only by
        ``gpu=None``."""
        _check_function(function)
        with self._lock:
            self._hangs = [
                h
                for h in self._hangs
                if not (
                    (function is None or h.function == function) and (gpu is None or h.gpu == gpu)
                )
            ]
            self._commit()

    def error_storm(
        self,
        code: int,
        function: str | None = None,
        gpu: int | None = None,
        count: int | None = None,
    ) -> None:
        """The next ``count`` calls (None: every one until :meth:`clear_error_storm`) to
        ``function`` (None: every call but init, shutdown and nvmlErrorString) on ``gpu``'s
        handles (None: every GPU, and device-less calls) return the NVML error ``code``
        (e.g. 999 UNKNOWN, 15 GPU_IS_LOST, 10 TIMEOUT), outputs untouched.  ``count`` is per
        process: each process using the fake fails that many calls.  Where several storms
        match a call, the newest with calls left applies.  A driver in trouble answers like
        this call after call."""
        if isinstance(code, bool) or not isinstance(code, int) or code not in NVML_ERROR_CODES:
            raise ValueError(f"not an NVML error code (nvml.h): {code!r}")
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 1
        ):
            raise ValueError(f"count must be a positive int or None, got {count!r}")
        _check_function(function)
        with self._lock:
            if gpu is not None:
                self._gpu(gpu)
            self._storms.append(
                _Storm(
                    self._next_fault_seq(),
                    code,
                    -1 if count is None else count,
                    function or "*",
                    -1 if gpu is None else gpu,
                )
            )
            self._commit()

    def clear_error_storm(self) -> None:
        """Remove every error storm: calls answer normally again."""
        with self._lock:
            self._storms = []
            self._commit()

    @property
    def blocked_dir(self) -> Path:
        """Where the library lists the calls it holds in a hang: one file per blocked call."""
        return self.state_path.with_name(self.state_path.name + ".blocked")

    def blocked_calls(self) -> list[BlockedCall]:
        """The calls blocked in a hang right now, in any process, oldest first.  (The library
        writes ``<state file>.blocked/<pid>-<n>`` while a call waits and removes it when the
        call goes on; files of processes that died meanwhile are ignored and removed.)"""
        try:
            names = sorted(os.listdir(self.blocked_dir))
        except FileNotFoundError:
            return []
        calls = []
        for name in names:
            if name.startswith("."):
                continue  # being written
            path = self.blocked_dir / name
            try:
                pid, function, gpu, _rule, since_us = path.read_text().split()
            except (FileNotFoundError, ValueError):
                continue  # the call went on meanwhile
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            except PermissionError:
                pass  # alive, another user's
            calls.append(
                BlockedCall(
                    int(pid), function, None if int(gpu) < 0 else int(gpu), int(since_us) / 1e6
                )
            )
        return sorted(calls, key=lambda c: c.since)

    def wait_blocked(
        self,
        count: int = 1,
        *,
        function: str | None = None,
        gpu: int | None = None,
        pid: int | None = None,
        timeout: float = 10.0,
    ) -> list[BlockedCall]:
        """Wait until at least ``count`` calls matching ``function``, ``gpu`` and ``pid``
        (None: any) are blocked in a hang, and return those; TimeoutError after ``timeout`` s.
        Lets a test wait for "the agent is stuck in the call" instead of sleeping."""
        deadline = time.monotonic() + timeout
        while True:
            found = [
                c
                for c in self.blocked_calls()
                if (function is None or c.function == function)
                and (gpu is None or c.gpu == gpu)
                and (pid is None or c.pid == pid)
            ]
            if len(found) >= count:
                return found
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{len(found)} of {count} calls blocked after {timeout} s; "
                    f"blocked now: {self.blocked_calls()}"
                )
            time.sleep(0.005)

    def set_process_util_scale(self, gpu: int, factor: float) -> None:
        """Multiply ``gpu``'s per-process utilization samples by ``factor``, unclamped, so a
        factor > 1 gives values above 100 (suspected on real hardware; default 1)."""
        if factor < 0:
            raise ValueError("factor must be >= 0")
        with self._lock:
            self._gpu(gpu).attrs["proc_util_scale"] = float(factor)
            self._commit()

    def _check_link(self, g: _Gpu, link: int) -> None:
        count = int(g.attrs["nvlink_count"])
        if count == 0:
            raise ValueError(f"{g.attrs['name']} has no NVLink")
        if not 0 <= link < count:
            raise IndexError(f"link {link} does not exist ({count} links)")

    def set_nvlink_up(self, gpu: int, link: int, up: bool) -> None:
        """Take a link down (its throughput counters stop) or bring it back up."""
        with self._lock:
            g = self._gpu(gpu)
            self._check_link(g, link)
            now = self._now_us()
            # Replace a change of the same link at the same instant; keep time order.
            g.link_states = [s for s in g.link_states if not (s[1] == link and s[0] >= now)]
            g.link_states.append((now, link, bool(up)))
            g.link_states.sort(key=lambda s: s[0])
            self._commit()

    def add_nvlink_errors(self, gpu: int, link: int, kind: str, n: int) -> None:
        """Increment a link's error counter; kind: crc_flit | crc_data | replay | recovery."""
        if kind not in _NVLINK_ERROR_KINDS:
            raise ValueError(f"kind must be one of {_NVLINK_ERROR_KINDS}")
        with self._lock:
            g = self._gpu(gpu)
            self._check_link(g, link)
            counts = g.link_errors.setdefault(link, [0, 0, 0, 0])
            counts[_NVLINK_ERROR_KINDS.index(kind)] += int(n)
            self._commit()

    def set_pcie_link(
        self, gpu: int, generation: int | None = None, width: int | None = None
    ) -> None:
        """Set the current PCIe link generation and/or width (None: leave unchanged)."""
        with self._lock:
            g = self._gpu(gpu)
            if generation is not None:
                if not 1 <= generation <= int(g.attrs["pcie_gen_max"]):
                    raise ValueError(f"generation must be within [1, {g.attrs['pcie_gen_max']}]")
                g.attrs["pcie_gen"] = int(generation)
            if width is not None:
                if not 1 <= width <= int(g.attrs["pcie_width_max"]):
                    raise ValueError(f"width must be within [1, {g.attrs['pcie_width_max']}]")
                g.attrs["pcie_width"] = int(width)
            self._commit()

    def add_pcie_replays(self, gpu: int, n: int) -> None:
        with self._lock:
            g = self._gpu(gpu)
            g.attrs["pcie_replay"] = int(g.attrs["pcie_replay"]) + int(n)
            self._commit()

    def add_ecc_errors(self, gpu: int, corrected: int = 0, uncorrected: int = 0) -> None:
        """Add to both the volatile and the aggregate ECC counters."""
        with self._lock:
            a = self._gpu(gpu).attrs
            for key, n in (
                ("ecc_corr_vol", corrected),
                ("ecc_corr_agg", corrected),
                ("ecc_unc_vol", uncorrected),
                ("ecc_unc_agg", uncorrected),
            ):
                a[key] = int(a[key]) + int(n)
            self._commit()

    def set_remapped_rows(
        self, gpu: int, correctable: int, uncorrectable: int, pending: bool, failure: bool
    ) -> None:
        with self._lock:
            a = self._gpu(gpu).attrs
            a.update(
                rr_corr=int(correctable),
                rr_unc=int(uncorrectable),
                rr_pending=int(pending),
                rr_failure=int(failure),
            )
            self._commit()

    def set_recovery_action(self, gpu: int, action: int) -> None:
        """What the driver requires to recover the GPU (field 230, NVML_GPU_RECOVERY_ACTION_*:
        0 none ... 4 drain and reset), announced as the driver does with XID 154. The field
        exists from R570: on an older driver branch this is an error, not a silent no-op."""
        with self._lock:
            branch = int(str(self.profile["driver_version"]).split(".")[0])
            if branch < 570:
                raise ValueError(f"driver {self.profile['driver_version']} has no recovery action")
            self._gpu(gpu).attrs["recovery_action"] = int(action)
            self.inject_xid(gpu, 154)

    def add_process(
        self,
        gpu: int,
        pid: int,
        used_memory_bytes: int,
        sm_util: float = 0,
        mem_util: float = 0,
        mig_uuid: str | None = None,
    ) -> None:
        """Register (or replace) a compute process; on a MIG GPU name its instance by UUID."""
        with self._lock:
            g = self._gpu(gpu)
            proc = _Process(
                pid=int(pid),
                used_memory_bytes=int(used_memory_bytes),
                sm_util=_check_pct(sm_util, "sm_util"),
                mem_util=_check_pct(mem_util, "mem_util"),
            )
            if mig_uuid is not None:
                for m in g.migs:
                    if m.uuid == mig_uuid:
                        proc.gi, proc.ci = m.gi, m.ci
                        break
                else:
                    raise ValueError(f"GPU {gpu} has no MIG device {mig_uuid}")
            g.procs[proc.pid] = proc
            self._commit()

    def remove_process(self, gpu: int, pid: int) -> None:
        with self._lock:
            self._gpu(gpu).procs.pop(int(pid), None)
            self._commit()

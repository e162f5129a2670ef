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
integrates every accumulator: energy at the current power; gpu_metrics' activity accumulators,
``accumulation_counter`` and per-XCC busy accumulators at the firmware's (assumed) 1 ms tick;
XGMI read/write KB at each link's throughput; PCIe bandwidth; processes' engine ns.

Processor indexes (``gpu`` arguments) are positions in the state file: in a partitioned
profile (CPX) each socket's XCPs are consecutive processors, XCP 0 first.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import threading
from collections.abc import Iterator
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
STATE_VERSION = 2

NA16 = 0xFFFF  # what the Python bindings show as "N/A" in activity and power_info
U32_WRAP = 1 << 32  # gfx_activity_acc and mem_activity_acc are uint32 in gpu_metrics
TICKS_PER_S = 1000  # accumulation_counter: one count per 1 ms firmware sample (assumed)

# amdsmi_status_t values tests use
SUCCESS, INVAL, NOT_SUPPORTED, NOT_YET_IMPLEMENTED = 0, 1, 2, 3
API_FAILED, TIMEOUT, RETRY, NO_PERM, BUSY, NOT_FOUND = 7, 8, 9, 10, 30, 31
OUT_OF_RESOURCES, NO_DATA, INSUFFICIENT_SIZE, UNKNOWN_ERROR = 15, 40, 41, 0xFFFFFFFF
# A lost GPU: its sysfs files gone (ENOENT) or refused while in reset (EPERM) both map to
# NOT_SUPPORTED in rocm_smi's ErrnoToRsmiStatus; see tests/doubles/README.md.
LOST_STATUS = NOT_SUPPORTED

# amdsmi_gpu_block_t bit positions: the state file's "ecc" list positions.
ECC_BLOCKS = ("umc", "sdma", "gfx", "mmhub", "athub", "pcie_bif", "hdp", "xgmi_wafl", "df",
              "smn", "sem", "mp0", "mp1", "fuse", "mca", "vcn", "jpeg", "ih", "mpio")  # fmt: skip
# amdsmi_evt_notification_type_t
EVENTS = {"vmfault": 1, "thermal_throttle": 2, "gpu_pre_reset": 3, "gpu_post_reset": 4,
          "migrate_start": 5, "migrate_end": 6, "page_fault_start": 7, "page_fault_end": 8,
          "queue_eviction": 9, "queue_restore": 10, "unmap_from_gpu": 11, "process_start": 12,
          "process_end": 13}  # fmt: skip
LINK_TYPES = {"internal": 0, "pcie": 1, "xgmi": 2, "not_applicable": 3, "unknown": 4}
XGMI_LINK = {"down": 0, "up": 1, "disable": 2}
PAGE_STATUS = {"reserved": 0, "pending": 1, "unreservable": 2}
MAX_EVENTS_KEPT = 200  # the C side reads up to 256
XGMI_LINK_IDLE = {
    "status": "up",
    "read_kbps": 0.0,
    "write_kbps": 0.0,
    "read_kb": 0.0,
    "write_kb": 0.0,
}
# amdsmi_temperature_type_t and amdsmi_clk_type_t: the state file's list positions.
TEMPERATURE_TYPES = ("edge", "junction", "vram", "hbm_0", "hbm_1", "hbm_2", "hbm_3")
CLOCK_TYPES = ("gfx", "df", "dcef", "soc", "mem", "pcie", "vclk0", "vclk1", "dclk0", "dclk1")
# The library release whose ABI the fake speaks, by the profile's lib_version major (as
# fakeamdsmi.c's release_of): lib 25.x is ROCm 6.4 (6.4.0 reports 25.3.0), else 7.0's.
LIB_MAJOR_RELEASES = {25: "6.4", 26: "7.0"}
# amdsmi_vram_vendor_type_t of the 6.4 ABI, where vram_info's vendor is a number (7.0: text).
VRAM_VENDORS_64 = {"SAMSUNG": 0, "INFINEON": 1, "ELPIDA": 2, "ETRON": 3, "NANYA": 4,
                   "HYNIX": 5, "MOSEL": 6, "WINBOND": 7, "ESMT": 8, "MICRON": 9,
                   "UNKNOWN": 10}  # fmt: skip


def ensure_built() -> Path:
    """Build the library with ``make -s fakeamdsmi`` if it is missing or stale; its path."""
    return fakelib.ensure_built("fakeamdsmi", LIB_PATH, SOURCE_PATH)


def list_profiles() -> list[str]:
    """Names of the profiles in ``profiles/`` (without ``.json``)."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def _raw_profile(name: str) -> dict[str, Any]:
    """A profile file on top of the one it ``extends``: its keys win, ``model`` is merged,
    and ``gpus`` is inherited when it has none."""
    profile: dict[str, Any] = json.loads((PROFILES_DIR / f"{name}.json").read_text())
    base_name = profile.pop("extends", None)
    if base_name is None:
        return profile
    base = _raw_profile(base_name)
    model = {**base.get("model", {}), **profile.get("model", {})}
    return {**base, **profile, "model": model}


def load_profile(name: str) -> dict[str, Any]:
    """The profile ``name`` with its ``model`` merged into each GPU (GPU keys win)."""
    profile = _raw_profile(name)
    model = profile.get("model", {})
    profile["gpus"] = [{**model, **gpu} for gpu in profile["gpus"]]
    return profile


def abi_release(profile: dict[str, Any]) -> str:
    """The release whose struct layouts the fake writes for ``profile``: "6.4" or "7.0"."""
    major = (profile.get("lib_version") or {}).get("major")
    return LIB_MAJOR_RELEASES.get(major, "7.0") if isinstance(major, int) else "7.0"


# The default node of the AMD tests ("mi300x") as a run serves it: `make oldest-amdsmi` sets
# mi300x-rocm64, so the same tests run on the 6.4.0 bindings over the 6.4 ABI.
TEST_PROFILE_ENV = "GPUSCOPE_TEST_AMD_PROFILE"
DEFAULT_TEST_PROFILE = "mi300x"


def run_profile(name: str) -> str:
    """``name``, or $GPUSCOPE_TEST_AMD_PROFILE in its place when ``name`` is the default."""
    if name == DEFAULT_TEST_PROFILE:
        return os.environ.get(TEST_PROFILE_ENV) or name
    return name


def bindings_release() -> str:
    """The ABI the installed ``amdsmi`` bindings read ("6.4" for 6.x, else "7.0"), from the
    package's metadata: never imports it (it would load a library into this process)."""
    from importlib.metadata import version

    return "6.4" if version("amdsmi").split(".")[0] == "6" else "7.0"


def unreadable_reason(name: str) -> str | None:
    """Why the installed bindings cannot read profile ``name`` (its structs are another
    release's: reading them would corrupt memory), or None when they can."""
    abi, installed = abi_release(load_profile(name)), bindings_release()
    if abi == installed:
        return None
    return f"profile {name} speaks the {abi} ABI; the installed amdsmi reads {installed}'s"


def _temperatures(spec: dict[str, Any]) -> list[int | None]:
    """The profile's ``{"junction": 42, "hbm": [..4]}`` as the 7 sensor types; None = absent."""
    hbm = list(spec.get("hbm", []))
    values = [spec.get("edge"), spec.get("junction"), spec.get("vram"), *hbm]
    values += [None] * (len(TEMPERATURE_TYPES) - len(values))
    return values[: len(TEMPERATURE_TYPES)]


# Calls whose data a secondary partition (XCP 1..n of a socket) lacks: they read the
# socket's device-wide gpu_metrics, which only XCP 0 has (AMD's partition docs); a missing
# sysfs file is ENOENT, NOT_SUPPORTED in rocm_smi's ErrnoToRsmiStatus.
SECONDARY_UNSUPPORTED = (
    "amdsmi_get_gpu_metrics_info", "amdsmi_get_gpu_activity", "amdsmi_get_power_info",
    "amdsmi_get_energy_count", "amdsmi_get_temp_metric", "amdsmi_get_pcie_info",
    "amdsmi_get_link_metrics", "amdsmi_get_gpu_xgmi_link_status", "amdsmi_get_power_cap_info",
    "amdsmi_get_gpu_total_ecc_count", "amdsmi_get_gpu_ecc_count",
)  # fmt: skip


class FakeAmdSmi:
    """One fake AMD SMI node: a profile plus runtime changes, written to ``state_path``."""

    def __init__(self, profile: str, state_path: str | os.PathLike[str], now: float = 1.7e9):
        self.profile = load_profile(profile)
        self.name = profile
        self.abi = abi_release(self.profile)  # the bindings that can read it: see env()
        self.state_path = Path(state_path)
        self._now_ns = round(now * 1e9)  # integer ns: timestamps differ exactly
        self._lock = threading.RLock()
        self._batch_depth = 0  # inside batch(): writes wait for its end
        self._dirty = False
        self._state_file = fakelib.StateFile(self.state_path)
        self._events: list[dict[str, Any]] = []
        self._event_seq = 0
        part = self.profile.get("partition", {})
        self.partitions = int(part.get("count", 1))
        self._gpus: list[dict[str, Any]] = []
        for sock, g in enumerate(self.profile["gpus"]):
            for xcp in range(self.partitions):
                self._gpus.append(self._processor(sock, xcp, g))
        self._write()

    def _processor(self, sock: int, xcp: int, g: dict[str, Any]) -> dict[str, Any]:
        temps = _temperatures(g.get("temperatures", {}))
        clocks = g.get("clocks", {})
        uptime = float(g.get("uptime_s", 0))
        idle = float(g.get("power_idle_w", 0))
        bdf = g["bdf"]
        if self.partitions > 1:  # the partition id in the BDF's function bits (CPX .0-.7)
            bdf = f"{bdf.rsplit('.', 1)[0]}.{xcp}"
        uuid = g.get("uuid")
        if self.partitions > 1 and uuid and not self.profile.get("shared_partition_uuid"):
            # ROCm 7: one UUID per partition (AMD's partition docs); derived from the GPU's.
            uuid = f"{uuid[:9]}{xcp:x}{uuid[10:]}"
        links = int(g.get("xgmi_links", 0))
        return {
            **{k: v for k, v in g.items() if k not in ("temperatures", "clocks")},
            "socket": sock,
            "xcp": xcp,
            "bdf": bdf,
            "uuid": uuid,
            "power_w": idle,
            # Counters start at boot: idle over the uptime so far.
            "energy_j": idle * uptime,
            "ticks": round(uptime * TICKS_PER_S),
            "gfx_acc": 0,
            "mem_acc": 0,
            "xcc_busy_acc": [0] * 8,
            "xcc_low_acc": [0] * 8,
            "residency": dict.fromkeys(("prochot", "ppt", "socket_thm", "vr_thm", "hbm_thm"), 0.0),
            "throttle": dict.fromkeys(("prochot", "ppt", "socket_thm", "vr_thm", "hbm_thm"), 0.0),
            "pcie_acc": 0.0,
            "pcie_gbps": 0,
            "xgmi": [dict(XGMI_LINK_IDLE) for _ in range(links)],
            "processes": [],
            "engine_ns": {},
            "ecc": {b: [0, 0, 0] for b in g.get("ecc_blocks", [])},
            "bad_pages": [],
            "reserved_pages": [],
            "forced": dict(g.get("unsupported", {})),
            "hang": [],
            "lost": None,
            "temps": temps,
            "clocks": [clocks.get(name) for name in CLOCK_TYPES],
        }

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
        """Processors (partitions) in the state file."""
        return len(self._gpus)

    def gpu(self, index: int) -> dict[str, Any]:
        """A copy of processor ``index``'s current attributes (profile keys plus runtime)."""
        with self._lock:
            return copy.deepcopy(self._gpus[index])

    def _change(self, gpu: int, **values: Any) -> None:
        with self._lock:
            self._gpus[gpu].update(values)
            self._write()

    def set_activity(
        self, gpu: int, gfx: int, umc: int | None = None, mm: int | None = None
    ) -> None:
        """Busy percentages (0-100) of amdsmi_get_gpu_activity and gpu_metrics; None keeps."""
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
        self._change(gpu, power_w=float(watts))

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

    def set_throttle(self, gpu: int, **fractions: float) -> None:
        """The share of time (0-1) a socket spends in prochot, ppt, socket_thm, vr_thm or
        hbm_thm throttling; :meth:`advance` adds it to the ``*_residency_acc`` counters."""
        with self._lock:
            throttle = self._gpus[gpu]["throttle"]
            for name, value in fractions.items():
                if name not in throttle or not 0 <= value <= 1:
                    raise ValueError(f"throttle {name}={value}")
                throttle[name] = float(value)
            self._write()

    def set_pcie_bandwidth(self, gpu: int, gb_per_s: int) -> None:
        """gpu_metrics' pcie_bandwidth_inst (GB/s), accumulated into pcie_bandwidth_acc."""
        self._change(gpu, pcie_gbps=int(gb_per_s))

    def set_xgmi_link(
        self,
        gpu: int,
        link: int,
        status: str | None = None,
        read_kbps: float | None = None,
        write_kbps: float | None = None,
    ) -> None:
        """One XGMI link: ``status`` up/down/disable, its read/write throughput in KB/s (a
        link that is not up moves nothing)."""
        with self._lock:
            entry = self._gpus[gpu]["xgmi"][link]
            if status is not None:
                if status not in XGMI_LINK:
                    raise ValueError(f"xgmi link status {status!r}")
                entry["status"] = status
            if read_kbps is not None:
                entry["read_kbps"] = float(read_kbps)
            if write_kbps is not None:
                entry["write_kbps"] = float(write_kbps)
            self._write()

    def set_processes(self, gpu: int, processes: list[dict[str, Any]]) -> None:
        """The processes of amdsmi_get_gpu_process_list: each ``{"pid", "name", "vram",
        "gtt", "cpu", "mem", "gfx_busy" (0-1), "enc_busy" (0-1), "cu_occupancy",
        "container_name"}`` (pid required). Engine ns accumulate with :meth:`advance` and are
        kept per pid while the pid stays listed."""
        with self._lock:
            g = self._gpus[gpu]
            pids = set()
            for proc in processes:
                pid = int(proc["pid"])
                pids.add(pid)
                g["engine_ns"].setdefault(pid, [0, 0])
            g["engine_ns"] = {pid: ns for pid, ns in g["engine_ns"].items() if pid in pids}
            g["processes"] = [dict(p) for p in processes]
            self._write()

    def set_ecc(
        self, gpu: int, block: str, correctable: int, uncorrectable: int, deferred: int = 0
    ) -> None:
        """A RAS block's counts (ECC_BLOCKS); a block the profile lacks becomes supported."""
        if block not in ECC_BLOCKS:
            raise ValueError(f"unknown RAS block {block!r}")
        with self._lock:
            self._gpus[gpu]["ecc"][block] = [int(correctable), int(uncorrectable), int(deferred)]
            self._write()

    def set_bad_pages(self, gpu: int, pages: list[tuple[int, int, str]]) -> None:
        """amdsmi_get_gpu_bad_page_info's records: (address, size, PAGE_STATUS name)."""
        self._change(gpu, bad_pages=[_page(p) for p in pages])

    def set_reserved_pages(self, gpu: int, pages: list[tuple[int, int, str]]) -> None:
        """amdsmi_get_gpu_memory_reserved_pages' records, as set_bad_pages."""
        self._change(gpu, reserved_pages=[_page(p) for p in pages])

    def post_event(self, gpu: int, kind: str | int, message: str = "") -> int:
        """Queue an event (EVENTS name or number) on processor ``gpu``; its sequence number.
        The library delivers it once, if the GPU's event notification is on and its mask has
        the event's bit when the library first sees it."""
        event = EVENTS[kind] if isinstance(kind, str) else int(kind)
        with self._lock:
            self._event_seq += 1
            self._events.append(
                {"seq": self._event_seq, "processor": gpu, "event": event, "message": message}
            )
            del self._events[:-MAX_EVENTS_KEPT]
            self._write()
            return self._event_seq

    # ---- faults --------------------------------------------------------------

    def fail(self, gpu: int, call: str, status: int) -> None:
        """``call`` (the C name, e.g. "amdsmi_get_gpu_metrics_info") on processor ``gpu``
        returns ``status`` until :meth:`clear_fail`."""
        with self._lock:
            self._gpus[gpu]["forced"][call] = int(status)
            self._write()

    def clear_fail(self, gpu: int, call: str | None = None) -> None:
        """Undo :meth:`fail` for one call or all (a release's unsupported calls stay)."""
        with self._lock:
            g = self._gpus[gpu]
            base = dict(self.profile["gpus"][g["socket"]].get("unsupported", {}))
            if call is None:
                g["forced"] = base
            elif call in base:
                g["forced"][call] = base[call]
            else:
                g["forced"].pop(call, None)
            self._write()

    def hang(self, gpu: int, call: str = "*") -> None:
        """``call`` ("*": every per-processor call) on ``gpu`` blocks until :meth:`release`;
        the library's lock is not held meanwhile, so other processors still answer."""
        with self._lock:
            self._gpus[gpu]["hang"].append(call)
            self._write()

    def release(self, gpu: int) -> None:
        with self._lock:
            self._gpus[gpu]["hang"] = []
            self._write()

    def lose(self, gpu: int, status: int = LOST_STATUS) -> None:
        """The GPU fell off the bus: every call on its handle returns ``status`` and the next
        ``amdsmi_init`` (after the last shutdown) no longer enumerates it."""
        self._change(gpu, lost=int(status))

    # ---- time ----------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the fake clock and integrate every accumulator over ``seconds``."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        with self._lock:
            self._now_ns += round(seconds * 1e9)
            ticks = round(seconds * TICKS_PER_S)
            for g in self._gpus:
                g["energy_j"] += g["power_w"] * seconds
                g["ticks"] += ticks
                gfx = _pct_or_zero(g.get("gfx_activity"))
                umc = _pct_or_zero(g.get("umc_activity"))
                g["gfx_acc"] = (g["gfx_acc"] + gfx * ticks) % U32_WRAP
                g["mem_acc"] = (g["mem_acc"] + umc * ticks) % U32_WRAP
                for i in range(8):
                    g["xcc_busy_acc"][i] += gfx * ticks
                    g["xcc_low_acc"][i] += ticks if gfx < LOW_UTILIZATION_PCT else 0
                for name, share in g["throttle"].items():
                    g["residency"][name] += share * ticks
                g["pcie_acc"] += g["pcie_gbps"] * ticks
                for link in g["xgmi"]:
                    if link["status"] == "up":
                        link["read_kb"] += link["read_kbps"] * seconds
                        link["write_kb"] += link["write_kbps"] * seconds
                for proc in g["processes"]:
                    ns = g["engine_ns"][int(proc["pid"])]
                    ns[0] += round(float(proc.get("gfx_busy", 0)) * seconds * 1e9)
                    ns[1] += round(float(proc.get("enc_busy", 0)) * seconds * 1e9)
            self._write()

    def energy_counts(self, gpu: int) -> int:
        """What amdsmi_get_energy_count reports as the accumulator now."""
        with self._lock:
            g = self._gpus[gpu]
            return int(g["energy_j"] * 1e6 / float(g["energy_resolution"]))

    # ---- the state file --------------------------------------------------------

    def _socket_procs(self, sock: int) -> list[dict[str, Any]]:
        return [g for g in self._gpus if g["socket"] == sock]

    def _metrics(self, index: int) -> dict[str, Any] | None:
        """gpu_metrics of processor ``index`` (XCP 0 of its socket only), as its ASIC's table
        revision fills it: fields the revision lacks are left out (all-ones)."""
        g = self._gpus[index]
        rev = g.get("metrics_revision")
        if rev is None or g["xcp"] != 0:
            return None
        temps = g["temps"]
        clocks = g["clocks"]
        watts = round(g["power_w"])

        def clk(name: str) -> int | None:
            c = clocks[CLOCK_TYPES.index(name)]
            return None if c is None else int(c["clk"])

        m: dict[str, Any] = {
            "structure_size": {3: 264, 5: 1040, 7: 2368}.get(rev[1], 4544),
            "format_revision": rev[0],
            "content_revision": rev[1],
            "temperature_edge": temps[0],
            "temperature_hotspot": temps[1],
            "temperature_mem": temps[2],
            "temperature_hbm": temps[3:7],
            "average_gfx_activity": g.get("gfx_activity"),
            "average_umc_activity": g.get("umc_activity"),
            "energy_accumulator": self.energy_counts(index),
            "system_clock_counter": self._now_ns,
            "firmware_timestamp": self._now_ns // 10,  # 10 ns units (assumed)
            "gfx_activity_acc": g["gfx_acc"],
            "mem_activity_acc": g["mem_acc"],
            "current_uclk": clk("mem"),
            "pcie_link_width": g.get("pcie_info", {}).get("pcie_width"),
            "pcie_link_speed": _tenths_gts(g.get("pcie_info", {}).get("pcie_speed")),
        }
        if rev[1] < 4:  # MI200's v1.3: average power and clocks, no MI300 accumulators
            m.update(
                average_socket_power=watts if g.get("power_reading") == "average" else None,
                current_gfxclk=clk("gfx"),
                current_socclk=clk("soc"),
                average_gfxclk_frequency=clk("gfx"),
                throttle_status=0,
            )
            return m
        procs = self._socket_procs(g["socket"])
        xgmi = g["xgmi"]
        m.update(
            current_socket_power=watts,
            current_gfxclks=[clk("gfx")] * 8,
            current_socclks=[clk("soc")] * 4,
            current_vclk0s=[clk("vclk0")] * 4,
            current_dclk0s=[clk("dclk0")] * 4,
            xgmi_link_width=g.get("xgmi_width"),
            xgmi_link_speed=g.get("xgmi_speed"),
            pcie_bandwidth_acc=round(g["pcie_acc"]),
            pcie_bandwidth_inst=g["pcie_gbps"],
            pcie_l0_to_recov_count_acc=g.get("pcie_info", {}).get("pcie_l0_to_recovery_count"),
            pcie_replay_count_acc=g.get("pcie_info", {}).get("pcie_replay_count"),
            pcie_replay_rover_count_acc=g.get("pcie_info", {}).get("pcie_replay_roll_over_count"),
            pcie_nak_sent_count_acc=g.get("pcie_info", {}).get("pcie_nak_sent_count"),
            pcie_nak_rcvd_count_acc=g.get("pcie_info", {}).get("pcie_nak_received_count"),
            xgmi_read_data_acc=[round(link["read_kb"]) for link in xgmi],
            xgmi_write_data_acc=[round(link["write_kb"]) for link in xgmi],
        )
        if rev[1] < 6:  # v1.5 (ROCm 6.2's library): no violation or partition accumulators
            return m
        m.update(
            xgmi_link_status=[XGMI_LINK[link["status"]] for link in xgmi],
            accumulation_counter=g["ticks"],
            num_partition=len(procs),
            **{f"{k}_residency_acc": round(v) for k, v in g["residency"].items()},
        )
        xccs = 8 // len(procs)  # XCCs per partition
        m["xcp_stats"] = [
            {
                "gfx_busy_inst": [_pct_or_zero(p.get("gfx_activity"))] * xccs,
                "gfx_busy_acc": [round(v) for v in p["xcc_busy_acc"][:xccs]],
                "gfx_low_utilization_acc": p["xcc_low_acc"][:xccs],
            }
            for p in procs
        ]
        return m

    def _link_metrics(self, g: dict[str, Any]) -> dict[str, Any] | None:
        if not g["xgmi"]:
            return None
        peers = [p for p in self._gpus if p["socket"] != g["socket"] and p["xcp"] == 0]
        links = []
        for peer, link in zip(peers, g["xgmi"], strict=False):
            links.append(
                {
                    "bdf": _bdf_int(peer["bdf"]),
                    "bit_rate": g.get("xgmi_speed"),
                    "max_bandwidth": g.get("xgmi_max_bandwidth"),
                    "link_type": LINK_TYPES["xgmi"],
                    "read": round(link["read_kb"]),
                    "write": round(link["write_kb"]),
                }
            )
        return {"num_links": len(links), "links": links}

    def _link_types(self, g: dict[str, Any]) -> list[list[int] | None]:
        out: list[list[int] | None] = []
        for other in self._gpus:
            if other is g:
                out.append(None)  # no link to itself (NOT_SUPPORTED here; a guess)
            elif other["socket"] == g["socket"]:
                out.append([1, LINK_TYPES["xgmi"]])  # partitions of one socket (inferred)
            elif g.get("xgmi_links"):
                same_package = g.get("package") is not None and g.get("package") == other.get(
                    "package"
                )
                hops = 1 if same_package or not g.get("xgmi_far_hops") else g["xgmi_far_hops"]
                out.append([hops, LINK_TYPES["xgmi"]])
            else:
                out.append([2, LINK_TYPES["pcie"]])
        return out

    def state(self) -> dict[str, Any]:
        """The state file's content (version 2; see tests/doubles/README.md)."""
        with self._lock:
            procs = []
            for index, g in enumerate(self._gpus):
                watts = round(g["power_w"])
                reading = g.get("power_reading", "current")
                proc: dict[str, Any] = {
                    k: g[k]
                    for k in (
                        "socket", "market_name", "vendor_name", "asic_serial", "uuid", "bdf",
                        "vendor_id", "subvendor_id", "device_id", "rev_id", "oam_id",
                        "num_compute_units", "target_graphics_version", "subsystem_id",
                        "vram_total_mb", "vram_used_mb", "gfx_activity", "umc_activity",
                        "mm_activity", "average_socket_power", "gfx_voltage", "soc_voltage",
                        "mem_voltage", "power_limit", "energy_resolution", "driver_info",
                        "vram_info", "power_cap_info", "numa_node", "compute_partition",
                        "memory_partition",
                    )
                    if k in g
                }  # fmt: skip
                # MI300 reports the current socket power, MI200 the average; MI250X's second
                # GCD neither (N/A).
                proc["socket_power"] = watts if reading != "none" else NA16
                proc["current_socket_power"] = watts if reading == "current" else NA16
                proc["average_socket_power"] = watts if reading == "average" else NA16
                proc["energy_count"] = self.energy_counts(index)
                proc["energy_timestamp_ns"] = self._now_ns
                proc["temperatures"] = g["temps"]
                proc["clocks"] = g["clocks"]
                proc["gpu_metrics"] = self._metrics(index)
                if self.abi == "6.4" and "vram_info" in g:
                    vendor = g["vram_info"].get("vram_vendor")
                    proc["vram_info"] = {
                        **g["vram_info"],
                        "vram_vendor": VRAM_VENDORS_64.get(vendor, VRAM_VENDORS_64["UNKNOWN"])
                        if isinstance(vendor, str)
                        else vendor,
                    }
                if "pcie_info" in g:
                    proc["pcie_info"] = {**g["pcie_info"], "pcie_bandwidth": g["pcie_gbps"] * 8000}
                if g["xgmi"]:
                    statuses = [XGMI_LINK[link["status"]] for link in g["xgmi"]]
                    proc["xgmi_link_status"] = {
                        "total_links": g.get("xgmi_total_links", len(statuses)),
                        "status": statuses + [XGMI_LINK["disable"]] * (8 - len(statuses)),
                    }
                proc["link_metrics"] = self._link_metrics(g)
                if "kfd_id" in g:
                    proc["kfd_info"] = {
                        "kfd_id": g["kfd_id"] + g["xcp"],
                        "node_id": g["node_id"] + g["xcp"],
                        "current_partition_id": g["xcp"],
                    }
                if "drm_render" in g:
                    n = self.partitions
                    # A partitioned node's DRM minors are numbered node-wide, each XCP its
                    # own (GPU s's XCP k: base + s x n + k), as amdgpu registers them; the
                    # profile gives each GPU's own (s = 0: the base).
                    first = g["drm_render"] - g["socket"] if n > 1 else g["drm_render"]
                    card = g["drm_card"] - g["socket"] if n > 1 else g["drm_card"]
                    proc["enumeration_info"] = {
                        "drm_render": first + g["socket"] * n + g["xcp"] if n > 1 else first,
                        "drm_card": card + g["socket"] * n + g["xcp"] if n > 1 else card,
                        "hsa_id": g["hsa_id"] * n + g["xcp"],
                        "hip_id": g["hip_id"] * n + g["xcp"],
                        "hip_uuid": f"GPU-{g['uuid'].replace('-', '')[:16]}",
                    }
                proc["processes"] = [
                    {
                        "name": p.get("name", ""),
                        "pid": int(p["pid"]),
                        "mem": p.get("mem", p.get("vram", 0)),
                        "gfx": g["engine_ns"][int(p["pid"])][0],
                        "enc": g["engine_ns"][int(p["pid"])][1],
                        "gtt_mem": p.get("gtt", 0),
                        "cpu_mem": p.get("cpu", 0),
                        "vram_mem": p.get("vram", 0),
                        "container_name": p.get("container_name", ""),
                        "cu_occupancy": p.get("cu_occupancy"),
                    }
                    for p in g["processes"]
                ]
                ecc = g["ecc"]
                proc["ecc"] = [
                    dict(zip(("correctable_count", "uncorrectable_count", "deferred_count"),
                             ecc[b], strict=True)) if b in ecc else None
                    for b in ECC_BLOCKS
                ]  # fmt: skip
                if ecc:  # RAS enabled: the bad-page tables exist
                    proc["bad_pages"] = g["bad_pages"]
                    proc["reserved_pages"] = g["reserved_pages"]
                proc["link_types"] = self._link_types(g)
                forced = dict(g["forced"])
                if g["xcp"] != 0:
                    for call in SECONDARY_UNSUPPORTED:
                        forced.setdefault(call, NOT_SUPPORTED)
                proc["status"] = forced
                proc["hang"] = list(g["hang"])
                proc["lost"] = g["lost"]
                procs.append(proc)
            return {
                "version": STATE_VERSION,
                "lib_version": self.profile.get("lib_version"),
                "events": list(self._events),
                "processors": procs,
            }

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Changes made inside reach the library together, in one write of the state file
        at the end of the outermost batch (the library never reads half a change). Holds
        the fake's lock meanwhile, as every method does."""
        with self._lock:
            self._batch_depth += 1
            try:
                yield
            finally:
                self._batch_depth -= 1
                if self._batch_depth == 0 and self._dirty:
                    self._dirty = False
                    self._write()

    def in_batch(self) -> bool:
        """Whether this thread is inside `batch()` (the lock is reentrant: ask, not guess)."""
        return self._batch_depth > 0 and self._lock._is_owned()  # type: ignore[attr-defined]

    def _write(self) -> None:
        """Replace the state file (`fakelib.StateFile`: atomically, the mtime increasing);
        inside a batch, at its end."""
        with self._lock:
            if self._batch_depth:
                self._dirty = True
                return
            self._state_file.write(json.dumps(self.state(), indent=1))


LOW_UTILIZATION_PCT = 5  # gfx_low_utilization_acc counts ticks below this (invented threshold)


def _pct_or_zero(value: int | None) -> int:
    return 0 if value is None or value == NA16 else int(value)


def _tenths_gts(mts: int | None) -> int | None:
    """gpu_metrics' pcie_link_speed is in 0.1 GT/s; pcie_info's pcie_speed in MT/s."""
    return None if mts is None else mts // 100


def _bdf_int(text: str) -> int:
    domain, bus, rest = text.split(":")
    device, function = rest.split(".")
    return (int(domain, 16) << 16) | (int(bus, 16) << 8) | (int(device, 16) << 3) | int(function)


def _page(page: tuple[int, int, str]) -> dict[str, int]:
    address, size, status = page
    return {"page_address": int(address), "page_size": int(size),
            "status": PAGE_STATUS[status]}  # fmt: skip


def _percent(value: int) -> int:
    if value != NA16 and not 0 <= value <= 100:
        raise ValueError(f"activity {value} is not a percentage (or 0xFFFF for N/A)")
    return int(value)

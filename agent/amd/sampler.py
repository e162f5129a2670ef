"""Busy seconds, idle seconds and throttle time of AMD GPUs, integrated each sampler tick.

Where the firmware keeps activity accumulators (gpu_metrics v1.4 and later: MI300), busy
time over a window is exact, whatever the tick: `gfx_activity_acc` adds the activity (%)
at each firmware sample and `accumulation_counter` counts the samples, so the window's
mean activity is delta(acc) / (100 x delta(counter)). The per-XCP `gfx_busy_acc` give each
compute partition its own, and the `*_residency_acc` give the share of samples spent
throttled by each reason, as AMD's own tools compute violation percentages. Where they are
absent (MI200 and older, a guest) the activity the library reports is sampled each tick,
as for NVIDIA: the tick's activity stands for the whole tick.

Every read runs on the GPU's gate (agent/accelerators/gate.py); only the tick thread changes
the integrals, and `integrals()` hands out immutable copies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from gpuscope.agent.accelerators.gate import Blocked, GpuGates, Job
from gpuscope.agent.amd.device import Device, Integrals
from gpuscope.agent.amd.library import UNAVAILABLE, AmdSmi, AmdSmiCallError, number

if TYPE_CHECKING:
    from gpuscope.agent.clock import Clock

log = logging.getLogger("gpuscope.amd.sampler")

# gpu_metrics residency accumulators -> the throttle reason they measure.
RESIDENCY: Mapping[str, str] = {
    "prochot_residency_acc": "prochot",
    "ppt_residency_acc": "power",
    "socket_thm_residency_acc": "socket_thermal",
    "vr_thm_residency_acc": "vr_thermal",
    "hbm_thm_residency_acc": "hbm_thermal",
}


@dataclass(frozen=True, slots=True)
class _Sample:
    """One tick's read of one GPU, plain numbers."""

    activity: float | None  # gfx activity now, 0-100
    counter: float | None  # accumulation_counter
    gfx_acc: float | None
    residency: Mapping[str, float]
    xcp_busy: Mapping[int, float]  # XCP -> summed gfx_busy_acc of its XCCs
    xcp_width: Mapping[int, int]  # XCP -> XCCs summed


@dataclass
class _State:
    """What the sampler keeps of one GPU between ticks: the integrals so far, and the last tick's
    sample (None where it went unanswered: the next window starts afresh)."""

    at: float | None = None  # agent clock (monotonic) of the last sample
    last: _Sample | None = None
    integrals: Integrals = field(default_factory=Integrals)


U32_NA, U64_NA = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF


def read_accumulators(lib: AmdSmi, handle: Any) -> dict[str, Any]:
    """The few gpu_metrics fields a tick needs, read from the wrapper's struct: the
    bindings' `amdsmi_get_gpu_metrics_info` converts all of its 4,544 bytes (about 80 entries,
    per-XCP lists included) into a dict, three quarters of a tick's cost. All-ones is "not
    available", as the bindings read it; a field the installed release's struct lacks is
    absent. {} where the GPU or release has no metrics table."""
    import ctypes

    wrapper = lib.module.amdsmi_wrapper
    table = wrapper.amdsmi_gpu_metrics_t()
    try:
        lib.raw("amdsmi_get_gpu_metrics_info", handle, ctypes.byref(table))
    except AmdSmiCallError as exc:
        if exc.status in UNAVAILABLE:
            return {}
        raise

    def field(name: str, na: int) -> int | None:
        value = getattr(table, name, None)
        return None if value is None or value == na else int(value)

    got: dict[str, Any] = {
        "accumulation_counter": field("accumulation_counter", U64_NA),
        "gfx_activity_acc": field("gfx_activity_acc", U32_NA),
    }
    for key in RESIDENCY:
        got[key] = field(key, U64_NA)
    stats = getattr(table, "xcp_stats", None)
    if stats is not None:
        got["xcp_stats.gfx_busy_acc"] = [
            [None if v == U64_NA else int(v) for v in getattr(xcp, "gfx_busy_acc", ())]
            for xcp in stats
        ]
    return got


def sample(lib: AmdSmi, device: Device) -> _Sample:
    """(On the GPU's worker.) The accumulators of XCP 0 (the only one with the device-wide
    gpu_metrics) or, without them, the activity now."""
    metrics: Mapping[str, Any] = {}
    try:
        metrics = read_accumulators(lib, device.primary)
    except AmdSmiCallError as exc:
        log.debug("%s: %s", device.identity.pci_bus_id, exc)
    counter, gfx_acc = number(metrics.get("accumulation_counter")), None
    if counter is not None:
        gfx_acc = number(metrics.get("gfx_activity_acc"))
    residency = {}
    if counter is not None:
        for key, reason in RESIDENCY.items():
            value = number(metrics.get(key))
            if value is not None:
                residency[reason] = value
    xcp_busy, xcp_width = _xcp(metrics.get("xcp_stats.gfx_busy_acc"), device)
    activity = None
    if gfx_acc is None:
        got = lib.call("amdsmi_get_gpu_activity", device.primary)
        activity = number(got.get("gfx_activity"))
        if activity is not None and activity > 100:
            activity = None
    return _Sample(activity, counter, gfx_acc, residency, xcp_busy, xcp_width)


def _xcp(rows: Any, device: Device) -> tuple[dict[int, float], dict[int, int]]:
    """Per XCP, the sum of its XCCs' busy accumulators (those that report one)."""
    busy: dict[int, float] = {}
    width: dict[int, int] = {}
    if not device.partitioned or not isinstance(rows, list):
        return busy, width
    for xcp, row in enumerate(rows[: len(device.processors)]):
        values = [v for v in (number(x) for x in (row or [])) if v is not None]
        if values:
            busy[xcp], width[xcp] = sum(values), len(values)
    return busy, width


class Sampler:
    """Ticks every `interval` seconds on its own thread (or by hand in tests)."""

    def __init__(
        self,
        lib: AmdSmi,
        devices: Sequence[Device],
        clock: Clock,
        gates: GpuGates,
        interval: float = 1.0,
        idle_threshold: float = 0.0,
    ) -> None:
        self.lib = lib
        self.clock = clock
        self.gates = gates
        self.interval = interval
        self.idle_threshold = idle_threshold
        self._devices = list(devices)
        self._states: dict[str, _State] = {d.identity.uuid: _State() for d in devices}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="amd-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.gates.deadline + 1)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception:
                log.exception("AMD sampler tick failed")

    def set_devices(self, devices: Sequence[Device]) -> None:
        """The GPUs to sample from the next tick (a GPU identified late joins here)."""
        with self._lock:
            self._devices = list(devices)
            for d in devices:
                self._states.setdefault(d.identity.uuid, _State())

    def integrals(self) -> dict[str, Integrals]:
        with self._lock:
            return {uuid: s.integrals for uuid, s in self._states.items()}

    def tick(self) -> None:
        """Sample every GPU through its gate, in parallel, and integrate the window."""
        deadline_at = self.gates.deadline_at()
        with self._lock:
            devices = list(self._devices)
        begun = [
            (d, self.gates.of(d).begin(partial(sample, self.lib, d), deadline_at)) for d in devices
        ]
        for device, job in begun:
            now = self.clock.monotonic()
            got: _Sample | Blocked | Exception
            try:
                got = job.wait(deadline_at) if isinstance(job, Job) else job
            except AmdSmiCallError as exc:
                got = exc
            with self._lock:
                state = self._states.setdefault(device.identity.uuid, _State())
                self._integrate(device, state, got, now)

    def _integrate(
        self, device: Device, state: _State, got: _Sample | Blocked | Exception, now: float
    ) -> None:
        previous, at = state.last, state.at
        state.at = now
        if not isinstance(got, _Sample):
            # Unanswered: the window is unsampled, and the next one starts afresh.
            if at is not None:
                state.integrals = _add_unsampled(state.integrals, now - at)
            state.last = None
            return
        state.last = got
        if at is None or previous is None:
            state.integrals = _started(state.integrals, got)
            return
        dt = max(0.0, now - at)
        ratio, source = _window_ratio(previous, got)
        i = state.integrals
        if ratio is None:
            state.integrals = _add_unsampled(i, dt)
            return
        active = ratio > self.idle_threshold
        throttle, throttling = _throttle(previous, got, dt, i.throttle_seconds)
        busy_p, idle_p, active_p = _partitions(device, previous, got, dt, i, self.idle_threshold)
        state.integrals = replace(
            i,
            busy_seconds=(i.busy_seconds or 0.0) + ratio * dt,
            idle_seconds=(i.idle_seconds or 0.0) + (0.0 if active else dt),
            unsampled_seconds=i.unsampled_seconds or 0.0,
            last_active_timestamp=self.clock.time() if active else i.last_active_timestamp,
            throttle_seconds=throttle,
            throttling=throttling,
            activity_source=source,
            partition_busy=busy_p,
            partition_idle=idle_p,
            partition_active=active_p,
        )


def _started(i: Integrals, s: _Sample) -> Integrals:
    """The first answer: counters start at 0, so rate() over them is right from here."""
    source = "accumulator" if s.gfx_acc is not None else "sampled"
    return replace(
        i,
        busy_seconds=i.busy_seconds or 0.0,
        idle_seconds=i.idle_seconds or 0.0,
        unsampled_seconds=i.unsampled_seconds or 0.0,
        activity_source=source,
        throttle_seconds=i.throttle_seconds or dict.fromkeys(s.residency, 0.0),
    )


def _add_unsampled(i: Integrals, dt: float) -> Integrals:
    return replace(i, unsampled_seconds=(i.unsampled_seconds or 0.0) + max(0.0, dt))


def _window_ratio(a: _Sample, b: _Sample) -> tuple[float | None, str]:
    """The window's mean activity (0-1) and how it was measured."""
    if a.gfx_acc is not None and b.gfx_acc is not None and a.counter is not None:
        ticks = (b.counter or 0) - a.counter
        if ticks > 0 and b.gfx_acc >= a.gfx_acc:
            return min(1.0, (b.gfx_acc - a.gfx_acc) / (100 * ticks)), "accumulator"
        if ticks < 0 or b.gfx_acc < a.gfx_acc:
            return None, "accumulator"  # the firmware restarted its counters (a reset)
    if b.activity is not None:
        return b.activity / 100, "sampled"
    return None, ""


def _throttle(
    a: _Sample, b: _Sample, dt: float, seconds: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, bool]]:
    total = dict(seconds)
    now: dict[str, bool] = {}
    ticks = (b.counter or 0) - (a.counter or 0)
    if a.counter is None or b.counter is None or ticks <= 0:
        return total, now
    for reason, value in b.residency.items():
        before = a.residency.get(reason)
        if before is None or value < before:
            continue
        share = min(1.0, (value - before) / ticks)
        total[reason] = total.get(reason, 0.0) + share * dt
        now[reason] = share > 0
    return total, now


def _partitions(
    device: Device, a: _Sample, b: _Sample, dt: float, i: Integrals, threshold: float
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    busy, idle = dict(i.partition_busy), dict(i.partition_idle)
    active: dict[str, float] = {}
    ticks = (b.counter or 0) - (a.counter or 0)
    if a.counter is None or b.counter is None or ticks <= 0:
        return busy, idle, active
    for xcp, value in b.xcp_busy.items():
        before, width = a.xcp_busy.get(xcp), b.xcp_width.get(xcp, 0)
        if before is None or value < before or not width or xcp >= len(device.processors):
            continue
        ratio = min(1.0, (value - before) / (100 * ticks * width))
        uuid = device.processors[xcp].uuid
        busy[uuid] = busy.get(uuid, 0.0) + ratio * dt
        idle[uuid] = idle.get(uuid, 0.0) + (0.0 if ratio > threshold else dt)
        active[uuid] = ratio
    return busy, idle, active

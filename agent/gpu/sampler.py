"""The GPU sampler: the part of the GPU source that needs continuity between scrapes.

A Prometheus gauge of "utilization now" tells you nothing about the 14 seconds between two
scrapes; `rate()` over a counter of busy seconds tells you the exact average over any
window. So a background thread integrates utilization into `busy_seconds` (and, where the
device has no hardware counter, PCIe bytes and energy), and remembers when each GPU was
last active. Where it integrates PCIe throughput it also publishes the latest reading
(bytes/s over NVML's 20 ms window, `GpuIntegrals.pcie_transmit_rate`) while it is held.
Everything else is read at scrape time, where it is freshest and costs nothing between
scrapes.

Utilization comes from `nvmlDeviceGetSamples`: NVML's own ring buffer of utilization
samples (one per 1/6 s to 1 s, depending on the product), each the busy share of the period
that ends at its timestamp. Integrating those samples is exact whatever the tick length,
and a stalled tick loses nothing as long as the ring buffer (about 20 s) has not wrapped.
Devices without samples fall back to `nvmlDeviceGetUtilizationRates` once per tick.

On GPUs with GPM (Hopper and later, agent/gpu/gpm.py) each tick also takes a GPM sample of
the GPU and of each MIG GPU instance: the window since the previous sample gives SM,
tensor and DRAM activity, kept as the latest ratios and integrated (ratio x window) into
seconds counters, exactly as busy time. The GPM calls run in the same per-GPU unit of work
as the utilization reads, so a hung GPM call holds that GPU alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpuscope.agent.accelerators.gate import Blocked, GpuGates, Job
from gpuscope.agent.gpu import fields
from gpuscope.agent.gpu.device import NVML_TEMPERATURE_GPU, Device
from gpuscope.agent.gpu.gpm import GpmReader, GpmScopeReading, GpmTick
from gpuscope.agent.gpu.nvml import (
    FUNCTION_NOT_FOUND,
    NOT_FOUND,
    NOT_SUPPORTED,
    GpuLost,
    Nvml,
    NvmlCallError,
    union_value,
)
from gpuscope.agent.gpu.records import GpuIntegrals

if TYPE_CHECKING:
    from gpuscope.agent.clock import Clock

log = logging.getLogger("gpuscope.gpu.sampler")

NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
KIB = 1024


MIN_PERIOD_US = 100_000  # NVML samples utilization every 1/6 s to 1 s by product
MAX_PERIOD_US = 1_000_000


class UtilizationIntegrator:
    """Integrates utilization into busy seconds and tracks the last active moment.

    Pure arithmetic, no NVML: it is fed either NVML samples (`add_samples`) or one rate per
    tick (`add_rate`), so its behaviour can be tested on literal numbers.

    A sample is the busy share of the sample period that ends at its timestamp, so it is
    credited with at most one period, never with the whole gap since the sample before:
    after a stall (the sampler starved, the ring buffer wrapped, or no sample while the
    GPU idled) one 100% sample must not turn 300 s into busy time. The period is the
    smallest gap seen between two samples (1 s until one is seen). Time that no sample or
    reading covers is neither busy nor idle: `unsampled_seconds`, so that per GPU
    `covered_seconds + unsampled_seconds` is the time since the first tick.
    """

    def __init__(self, idle_threshold: float, *, max_rate_gap: float = 2.0) -> None:
        self.idle_threshold = idle_threshold
        self.max_rate_gap = max_rate_gap  # seconds one rate reading may be held for
        self.busy_seconds = 0.0
        self.idle_seconds = 0.0  # time at or below the threshold: the reserved-but-idle clock
        self.covered_seconds = 0.0  # time some sample or reading covered
        self.dropped_samples = 0  # timestamp 0 or a value outside 0-100: not a sample
        self.last_active: float | None = None
        self.period_us = MAX_PERIOD_US
        self._last_sample_us: int | None = None
        self._last_rate_at: float | None = None
        self._first_tick: float | None = None
        self._last_tick: float | None = None

    @property
    def last_sample_us(self) -> int:
        return self._last_sample_us or 0

    @property
    def unsampled_seconds(self) -> float:
        """Time since the first tick that nothing covered (at most one period lags)."""
        if self._first_tick is None or self._last_tick is None:
            return 0.0
        return max(0.0, self._last_tick - self._first_tick - self.covered_seconds)

    def tick(self, monotonic: float) -> None:
        """Mark the time of a sampler tick: the wall-time base of `unsampled_seconds`."""
        if self._first_tick is None:
            self._first_tick = monotonic
        self._last_tick = monotonic

    def add_samples(self, samples: Iterable[tuple[int, float]]) -> None:
        """Add (timestamp µs, percent) samples; each covers at most one sample period.

        The first sample ever seen only sets the starting point: history from before the
        agent started is not counted, so the counter starts at zero.
        """
        for ts, percent in sorted(samples):
            if ts <= 0 or not 0.0 <= percent <= 100.0:
                self.dropped_samples += 1
                continue
            previous = self._last_sample_us
            if previous is not None and ts <= previous:
                continue
            self._last_sample_us = ts
            ratio = percent / 100.0
            if ratio > self.idle_threshold:
                self.last_active = ts / 1e6
            if previous is None:
                continue
            gap = ts - previous
            if gap < self.period_us:
                self.period_us = max(MIN_PERIOD_US, gap)
            self._credit(ratio, min(gap, self.period_us) / 1e6)

    def add_rate(self, monotonic: float, wall: float, percent: float) -> None:
        """Add one utilization reading, held since the previous one for at most
        `max_rate_gap` seconds (a stall is unsampled, not busy or idle).

        Durations come from the monotonic clock (an NTP step must not create or erase busy
        time); the last-active moment is a wall-clock timestamp.
        """
        if not 0.0 <= percent <= 100.0:
            self.dropped_samples += 1
            return
        ratio = percent / 100.0
        if self._last_rate_at is not None and monotonic > self._last_rate_at:
            self._credit(ratio, min(monotonic - self._last_rate_at, self.max_rate_gap))
        self._last_rate_at = monotonic
        if ratio > self.idle_threshold:
            self.last_active = wall

    def samples_cover_until(self, monotonic: float) -> None:
        """Samples covered the time up to this tick: a rate reading at a later tick (the
        ring ran dry) covers the time from here, so a busy -> idle edge is idle time at
        once, not unsampled time for the tick or two until a second reading."""
        self._last_rate_at = monotonic

    def _credit(self, ratio: float, seconds: float) -> None:
        self.busy_seconds += ratio * seconds
        self.covered_seconds += seconds
        if ratio <= self.idle_threshold:
            self.idle_seconds += seconds


class RateIntegrator:
    """Integrates a rate read now and then (bytes/s, watts) into a running total, each
    reading held until the next for at most `max_gap` seconds (a stall adds nothing)."""

    def __init__(self, max_gap: float = float("inf")) -> None:
        self.total = 0.0
        self.max_gap = max_gap
        self._last_at: float | None = None
        self._last_rate: float | None = None  # the latest reading, for `current`

    def start(self, monotonic: float) -> None:
        """The first reading will cover the time since `monotonic`."""
        self._last_at = monotonic

    def add(self, monotonic: float, rate: float) -> None:
        if self._last_at is not None and monotonic > self._last_at:
            self.total += rate * min(monotonic - self._last_at, self.max_gap)
        self._last_at = monotonic
        self._last_rate = rate

    def current(self, monotonic: float) -> float | None:
        """The latest reading while it is held (at most `max_gap` old); None before any
        reading or once it is older, as the total then stops adding it."""
        if self._last_rate is None or self._last_at is None:
            return None
        return self._last_rate if monotonic - self._last_at <= self.max_gap else None


class UtilMode(Enum):
    SAMPLES = "samples"
    RATES = "rates"
    UNSUPPORTED = "unsupported"


@dataclass
class _GpuState:
    """What the sampler keeps of one GPU between ticks: its integrators, set up from what its
    first tick found the GPU can report (`probed`), and its GPM reader and latest totals."""

    util: UtilizationIntegrator
    util_mode: UtilMode | None = None
    pcie_tx: RateIntegrator | None = None  # only where the device has no PCIe byte counters
    pcie_rx: RateIntegrator | None = None
    energy: RateIntegrator | None = None  # only where the device has no energy counter
    probed: bool = False
    gpm: GpmReader | None = None  # used on the GPU's worker only
    gpm_tick: GpmTick | None = None  # the latest GPM totals the worker returned


@dataclass(frozen=True, slots=True)
class UtilAccounting:
    """One GPU's utilization integrator as it stands, and how the sampler reads that GPU.

    For `gpuscope check`, which holds these against NVML's own answers on a real GPU: the
    agent exports the busy and unsampled seconds, while idle and covered time, the sample
    period and the read modes are the sampler's own view of the GPU."""

    busy_seconds: float
    idle_seconds: float
    covered_seconds: float
    unsampled_seconds: float
    last_sample_us: int  # the newest NVML sample integrated (0: none yet)
    period_us: float  # the sample period the integrator found
    dropped_samples: int  # samples with timestamp 0 or a value outside 0-100
    util_mode: str | None  # "samples", "rates" or "unsupported"; None before the first tick
    integrates_pcie: bool  # PCIe bytes integrated from throughput (no byte counters)
    integrates_energy: bool  # energy integrated from power (no energy counter)


@dataclass(frozen=True, slots=True)
class _Caps:
    """What one GPU can report, found on its first tick (see `_probe`)."""

    util_mode: UtilMode
    newest: tuple[int, float] | None  # the newest sample in NVML's ring at the first tick
    integrate_pcie: bool  # no PCIe byte counters, but the throughput call
    integrate_energy: bool  # no energy counter, but power


@dataclass(frozen=True, slots=True)
class _Sample:
    """What one tick read from one GPU, in plain numbers: NVML work runs on the GPU's own
    worker (agent/accelerators/gate.py) and returns this; only the tick thread changes
    `_GpuState`."""

    caps: _Caps | None  # on the GPU's first tick
    samples: tuple[tuple[int, float], ...] | None  # None: no sample since the last tick
    rate: float | None  # utilization %, where no sample was read (or no samples exist)
    milliwatts: float | None
    gpm: GpmTick | None = None  # None: the GPU has no GPM


class Sampler:
    """Ticks every `interval` seconds on its own thread; `integrals()` is safe from any thread.

    Each GPU is read through its gate (`gates`), all GPUs at once: a GPU that does not
    answer within the gates' deadline is skipped (its time is unsampled, as for any gap),
    with no new work queued for it, and the others are integrated as ever. Fenced GPUs
    (a fatal XID) get the gate's probe instead, when one is due."""

    def __init__(
        self,
        nvml: Nvml,
        devices: Sequence[Device],
        clock: Clock,
        *,
        interval: float = 1.0,
        idle_threshold: float = 0.0,
        gates: GpuGates | None = None,
    ) -> None:
        self._nvml = nvml
        self._devices = list(devices)
        self._clock = clock
        self.interval = interval
        self._idle_threshold = idle_threshold
        self._gates = gates if gates is not None else GpuGates(nvml, clock)
        self._states: dict[str, _GpuState] = {}
        self._published: Mapping[str, GpuIntegrals] = MappingProxyType({})
        self._lost: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick_lock = threading.Lock()
        self._pcie_next = 0  # round-robin position among GPUs whose PCIe bytes are integrated

    def set_devices(self, devices: Sequence[Device]) -> None:
        with self._tick_lock:
            self._devices = list(devices)

    def lost(self) -> frozenset[str]:
        """UUIDs of GPUs that stopped answering at the last tick (lost, stuck or fenced): a
        cheap change signal for consumers (node labels) that must react within a second,
        without an NVML call."""
        return self._lost

    def accounting(self) -> dict[str, UtilAccounting]:
        """Each GPU's integrator and read modes by UUID, taken between ticks."""
        with self._tick_lock:
            return {
                uuid: UtilAccounting(
                    busy_seconds=s.util.busy_seconds,
                    idle_seconds=s.util.idle_seconds,
                    covered_seconds=s.util.covered_seconds,
                    unsampled_seconds=s.util.unsampled_seconds,
                    last_sample_us=s.util.last_sample_us,
                    period_us=float(s.util.period_us),
                    dropped_samples=s.util.dropped_samples,
                    util_mode=s.util_mode.value if s.util_mode is not None else None,
                    integrates_pcie=s.pcie_tx is not None,
                    integrates_energy=s.energy is not None,
                )
                for uuid, s in self._states.items()
            }

    def integrals(self) -> Mapping[str, GpuIntegrals]:
        """The latest published integrals by GPU UUID (an immutable, atomically swapped map)."""
        return self._published

    def start(self) -> None:
        # Every GPU once, for the first reading's starting point; not the PCIe step, which
        # holds a GPU's gate for 40 ms (nvmlDeviceGetPcieThroughput measures 20 ms each way)
        # and so the agent's first collection, which reads that GPU through the same gate:
        # the sampler thread's first tick, an interval later, takes it.
        self._sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._free_gpm()

    def _free_gpm(self) -> None:
        """Free the GPM sample buffers, through the gates (a stuck GPU keeps its few)."""
        with self._tick_lock:
            deadline_at = self._gates.deadline_at()
            jobs = []
            for device in self._devices:
                state = self._states.get(device.identity.uuid)
                if state is not None and state.gpm is not None:
                    jobs.append(self._gates.of(device).begin(state.gpm.close, deadline_at))
                    state.gpm = None
            for job in jobs:
                if isinstance(job, Job):
                    try:
                        job.wait(deadline_at)
                    except Exception:  # best effort at shutdown
                        log.debug("freeing GPM samples failed", exc_info=True)

    def _run(self) -> None:
        next_at = self._clock.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - self._clock.monotonic())):
            self.tick()
            next_at += self.interval
            now = self._clock.monotonic()
            if next_at < now:  # fell behind (suspended, overloaded): do not burst to catch up
                next_at = now + self.interval

    def tick(self) -> None:
        """Sample every GPU once (in parallel, through the gates) and publish new integrals,
        then read one GPU's PCIe throughput (`_pcie_step`)."""
        self._sample()
        self._pcie_step()

    def _sample(self) -> None:
        with self._tick_lock:
            now = self._clock.monotonic()
            wall = self._clock.time()
            deadline_at = self._gates.deadline_at()
            begun: list[tuple[Device, _GpuState, Job[_Sample] | Blocked]] = []
            probes: list[Job[bool]] = []
            for device in self._devices:
                state = self._state(device)
                state.util.tick(now)
                gate = self._gates.of(device)
                probe = gate.begin_probe(partial(probe_gpu, self._nvml, device), deadline_at)
                if isinstance(probe, Job):
                    probes.append(probe)
                begun.append((device, state, self._begin_sample(device, state, deadline_at)))
            published: dict[str, GpuIntegrals] = {}
            lost = set(self._lost)
            for device, state, job in begun:
                uuid = device.identity.uuid
                try:
                    got = job.wait(deadline_at) if isinstance(job, Job) else job
                    if isinstance(got, Blocked):
                        lost.add(uuid)  # the scrape says why; integrals keep their values
                    else:
                        self._apply(device, state, got, now, wall)
                        lost.discard(uuid)
                except GpuLost:
                    lost.add(uuid)  # the scrape reports it; integrals keep their last values
                except Exception:
                    log.exception("sampling GPU %d failed", device.identity.index)
                published[uuid] = self._integrals(state, now)
            for probe in probes:
                try:
                    probe.wait(deadline_at)  # an answered probe lifts the fence (gate.py)
                except Exception:
                    log.exception("probing a fenced GPU failed")
            self._published = MappingProxyType(published)
            self._lost = frozenset(lost)

    def _state(self, device: Device) -> _GpuState:
        uuid = device.identity.uuid
        state = self._states.get(uuid)
        if state is None:
            state = self._states[uuid] = _GpuState(
                util=UtilizationIntegrator(
                    self._idle_threshold, max_rate_gap=max(1.0, 2 * self.interval)
                ),
                gpm=GpmReader(
                    self._nvml, device.handle, self._clock.monotonic, self._idle_threshold
                ),
            )
        return state

    def _integrals(self, state: _GpuState, now: float) -> GpuIntegrals:
        integrals = _integrals(state, now)
        tick = state.gpm_tick
        if tick is None:
            return integrals
        max_age = max(2.0, 2.5 * self.interval)  # the last window, not one from long ago
        if tick.gpu is not None:
            g = _gpm_integrals(tick.gpu, now, max_age)
            integrals = replace(
                integrals,
                sm_active_seconds=g.sm_active_seconds,
                tensor_active_seconds=g.tensor_active_seconds,
                dram_active_seconds=g.dram_active_seconds,
                gpm=g.gpm,
            )
        if tick.instances:
            instances = {  # with GPM's busy and idle time: MIG has no utilization samples
                gi: replace(
                    _gpm_integrals(r, now, max_age),
                    busy_seconds=r.busy_seconds,
                    idle_seconds=r.idle_seconds,
                )
                for gi, r in tick.instances.items()
            }
            integrals = replace(integrals, gpu_instances=MappingProxyType(instances))
        return integrals

    def _begin_sample(
        self, device: Device, state: _GpuState, deadline_at: float
    ) -> Job[_Sample] | Blocked:
        """Hand this tick's reads of one GPU to its gate, with what they depend on copied."""
        work = partial(
            _read_sample,
            self._nvml,
            device.handle,
            probe=not state.probed,
            util_mode=state.util_mode,
            since_us=state.util.last_sample_us,
            power=state.energy is not None,
            gpm=state.gpm,
        )
        return self._gates.of(device).begin(work, deadline_at)

    def _pcie_step(self) -> None:
        """Read one GPU's PCIe throughput, round-robin, outside the tick lock.

        Only GPUs without PCIe byte counters (fields 197/198 are R555+) need this, and
        nvmlDeviceGetPcieThroughput measures over 20 ms per call (nvml.h): reading TX and RX
        of 8 GPUs every tick under the lock held it for at least 320 ms a second. One GPU
        per tick reads each of N GPUs every N ticks; each reading (a 20 ms window) is held
        until that GPU's next, at most twice that long, so the counter is an estimate
        from samples, unbiased but not exact (docs/metrics.md says so). A GPU that does
        not answer within the deadline loses its turn."""
        with self._tick_lock:
            due = [
                (d, s)
                for d in self._devices
                if (s := self._states.get(d.identity.uuid)) is not None and s.pcie_tx is not None
            ]
            if not due:
                return
            self._pcie_next %= len(due)
            device, state = due[self._pcie_next]
            self._pcie_next += 1
        try:
            got = self._gates.run(device, partial(_read_pcie, self._nvml, device.handle))
        except GpuLost:
            return
        if isinstance(got, Blocked):
            return
        if got is None:  # the GPU has no throughput call either: no PCIe bytes at all
            with self._tick_lock:
                state.pcie_tx = state.pcie_rx = None
            log.debug("GPU %d: no PCIe throughput", device.identity.index)
            return
        tx, rx = got
        now = self._clock.monotonic()
        with self._tick_lock:
            if state.pcie_tx is not None and tx is not None:
                state.pcie_tx.add(now, float(tx) * KIB)
            if state.pcie_rx is not None and rx is not None:
                state.pcie_rx.add(now, float(rx) * KIB)
            uuid = device.identity.uuid
            if uuid in self._published:  # publish now, not a tick later
                fresh = self._integrals(state, now)
                self._published = MappingProxyType({**self._published, uuid: fresh})

    def _apply(
        self, device: Device, state: _GpuState, got: _Sample, now: float, wall: float
    ) -> None:
        """Fold one tick's reading of a GPU into its integrators (tick thread, under the lock)."""
        if got.caps is not None:
            self._apply_caps(device, state, got.caps)
        if got.samples is not None:
            dropped = state.util.dropped_samples
            state.util.add_samples(got.samples)
            state.util.samples_cover_until(now)
            if not dropped and state.util.dropped_samples:  # once per GPU: a driver quirk
                log.warning(
                    "GPU %d: utilization samples stamped 0 or outside 0-100%% are dropped",
                    device.identity.index,
                )
        elif got.rate is not None:
            # No new sample since the last tick (NVML's ring runs dry while a GPU idles), or
            # a GPU without samples: the current reading covers this tick (capped), so an
            # idle GPU accrues idle time rather than unsampled time.
            state.util.add_rate(now, wall, got.rate)
        if state.energy is not None and got.milliwatts is not None:
            state.energy.add(now, got.milliwatts / 1000.0)
        if got.gpm is not None:
            state.gpm_tick = got.gpm  # totals: a dropped late result is covered by this one

    def _apply_caps(self, device: Device, state: _GpuState, caps: _Caps) -> None:
        """Set up a GPU's integrators from what its first tick found it can report."""
        state.util_mode = caps.util_mode
        state.probed = True
        if caps.newest is not None:  # start from now: history before the agent is not ours
            state.util.add_samples([caps.newest])
        if caps.integrate_pcie:
            # Each GPU is read every N ticks (N GPUs without counters): hold up to 2N.
            hold = 2 * self.interval * max(1, len(self._devices))
            state.pcie_tx, state.pcie_rx = RateIntegrator(hold), RateIntegrator(hold)
            # A reading covers the time back to the previous one: the first, back to now.
            state.pcie_tx.start(self._clock.monotonic())
            state.pcie_rx.start(self._clock.monotonic())
        if caps.integrate_energy:
            state.energy = RateIntegrator(max(1.0, 2 * self.interval))
        log.debug(
            "GPU %d: utilization from %s, PCIe bytes %s, energy %s",
            device.identity.index,
            caps.util_mode.value,
            "integrated" if state.pcie_tx else "from counters",
            "integrated" if state.energy else "from counter",
        )


# --- NVML work, run on a GPU's own worker: reads and returns, never touches sampler state ---


def _read_sample(
    nvml: Nvml,
    h: Any,
    *,
    probe: bool,
    util_mode: UtilMode | None,
    since_us: int,
    power: bool,
    gpm: GpmReader | None = None,
) -> _Sample:
    """One tick's reads of one GPU (with its capabilities on the first tick)."""
    caps = _probe(nvml, h) if probe else None
    if caps is not None:
        util_mode = caps.util_mode
        since_us = caps.newest[0] if caps.newest is not None else since_us
        power = caps.integrate_energy
    samples: tuple[tuple[int, float], ...] | None = None
    rate: float | None = None
    if util_mode is UtilMode.SAMPLES:
        got = nvml.query(
            "nvmlDeviceGetSamples",
            h,
            NVML_GPU_UTILIZATION_SAMPLES,
            since_us,
            absent=frozenset({NOT_FOUND}),
        )
        if got is not None:
            value_type, raw = got
            samples = tuple(
                (int(s.timeStamp), float(union_value(value_type, s.sampleValue))) for s in raw
            )
        else:
            rate = _rate(nvml, h)
    elif util_mode is UtilMode.RATES:
        rate = _rate(nvml, h)
    milliwatts = nvml.query("nvmlDeviceGetPowerUsage", h) if power else None
    return _Sample(
        caps=caps,
        samples=samples,
        rate=rate,
        milliwatts=float(milliwatts) if milliwatts is not None else None,
        gpm=gpm.read() if gpm is not None else None,
    )


def _rate(nvml: Nvml, h: Any) -> float | None:
    rates = nvml.query("nvmlDeviceGetUtilizationRates", h)
    return float(rates.gpu) if rates is not None else None


def _probe(nvml: Nvml, h: Any) -> _Caps:
    """Decide once per GPU which readings need integrating here."""
    first = nvml.query(
        "nvmlDeviceGetSamples",
        h,
        NVML_GPU_UTILIZATION_SAMPLES,
        0,
        absent=frozenset({NOT_FOUND}),
    )
    newest: tuple[int, float] | None = None
    if first is not None or nvml.supports(
        "nvmlDeviceGetSamples", h, NVML_GPU_UTILIZATION_SAMPLES, 0
    ):
        mode = UtilMode.SAMPLES
        if first is not None:
            value_type, samples = first
            last = max(samples, key=lambda s: int(s.timeStamp), default=None)
            if last is not None:
                newest = (int(last.timeStamp), float(union_value(value_type, last.sampleValue)))
    elif nvml.supports("nvmlDeviceGetUtilizationRates", h):
        mode = UtilMode.RATES
    else:
        mode = UtilMode.UNSUPPORTED  # MIG-enabled GPUs, for one

    tx, rx = nvml.field_values(
        h, [(fields.PCIE_COUNT_TX_BYTES, 0), (fields.PCIE_COUNT_RX_BYTES, 0)]
    )
    # Without counters, throughput is integrated. Whether the GPU has the call is left to
    # its first PCIe step (`_pcie_step`): asking costs the 20 ms the call measures over.
    integrate_pcie = tx is None or rx is None
    integrate_energy = not nvml.supports(
        "nvmlDeviceGetTotalEnergyConsumption", h
    ) and nvml.supports("nvmlDeviceGetPowerUsage", h)
    return _Caps(mode, newest, integrate_pcie, integrate_energy)


def _read_pcie(nvml: Nvml, h: Any) -> tuple[Any, Any] | None:
    """Throughput both ways, KiB/s; None where the GPU does not have the call."""
    try:
        tx = nvml.call("nvmlDeviceGetPcieThroughput", h, NVML_PCIE_UTIL_TX_BYTES)
    except NvmlCallError as exc:
        if exc.code in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
            return None
        tx = None  # counted as an error by the call; a later step tries again
    rx = nvml.query("nvmlDeviceGetPcieThroughput", h, NVML_PCIE_UTIL_RX_BYTES)
    return tx, rx


def probe_gpu(nvml: Nvml, device: Device) -> bool:
    """The cheap call that tells whether a fenced GPU answers again: its temperature, which
    the driver must ask the GPU for (unlike the PCI info or the UUID, which it answers from
    what it cached at boot, even for a GPU that fell off the bus). NOT_SUPPORTED is an
    answer too; a lost GPU or any other error is not."""
    try:
        nvml.call("nvmlDeviceGetTemperature", device.handle, NVML_TEMPERATURE_GPU)
    except GpuLost:
        return False
    except NvmlCallError as exc:
        return exc.code in (NOT_SUPPORTED, FUNCTION_NOT_FOUND)
    return True


def _gpm_integrals(r: GpmScopeReading, now: float, max_age: float) -> GpuIntegrals:
    """A GPM scope's counters, and its ratios while no older than `max_age` (a GPM call
    failing tick after tick leaves the counters standing, but no stale gauge)."""
    fresh = r.activity is not None and now - r.activity_at <= max_age
    return GpuIntegrals(
        sm_active_seconds=r.sm_active_seconds,
        tensor_active_seconds=r.tensor_active_seconds,
        dram_active_seconds=r.dram_active_seconds,
        gpm=r.activity if fresh else None,
    )


def _integrals(state: _GpuState, now: float) -> GpuIntegrals:
    supported = state.util_mode in (UtilMode.SAMPLES, UtilMode.RATES)
    return GpuIntegrals(
        busy_seconds=state.util.busy_seconds if supported else None,
        idle_seconds=state.util.idle_seconds if supported else None,
        unsampled_seconds=state.util.unsampled_seconds if supported else None,
        last_active_timestamp=state.util.last_active if supported else None,
        pcie_transmit_bytes=state.pcie_tx.total if state.pcie_tx else None,
        pcie_receive_bytes=state.pcie_rx.total if state.pcie_rx else None,
        energy_joules=state.energy.total if state.energy else None,
        pcie_transmit_rate=state.pcie_tx.current(now) if state.pcie_tx else None,
        pcie_receive_rate=state.pcie_rx.current(now) if state.pcie_rx else None,
    )

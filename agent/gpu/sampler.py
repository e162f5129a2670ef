"""The GPU sampler: the part of the GPU source that needs continuity between scrapes.

A Prometheus gauge of "utilization now" tells you nothing about the 14 seconds between two
scrapes; `rate()` over a counter of busy seconds tells you the exact average over any
window. So a background thread integrates utilization into `busy_seconds` (and, where the
device has no hardware counter, PCIe bytes and energy), and remembers when each GPU was
last active. Everything else is read at scrape time, where it is freshest and costs nothing
between scrapes.

Utilization comes from `nvmlDeviceGetSamples`: NVML's own ring buffer of utilization
samples (one per 1/6 s to 1 s, depending on the product), each the busy share of the period
that ends at its timestamp. Integrating those samples is exact whatever the tick length,
and a stalled tick loses nothing as long as the ring buffer (about 20 s) has not wrapped.
Devices without samples fall back to `nvmlDeviceGetUtilizationRates` once per tick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from gpuscope.agent.clock import Clock
from gpuscope.agent.gpu import fields
from gpuscope.agent.gpu.device import Device
from gpuscope.agent.gpu.nvml import NOT_FOUND, GpuLost, Nvml, union_value
from gpuscope.agent.gpu.records import GpuIntegrals

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

    def start(self, monotonic: float) -> None:
        """The first reading will cover the time since `monotonic`."""
        self._last_at = monotonic

    def add(self, monotonic: float, rate: float) -> None:
        if self._last_at is not None and monotonic > self._last_at:
            self.total += rate * min(monotonic - self._last_at, self.max_gap)
        self._last_at = monotonic


class UtilMode(Enum):
    SAMPLES = "samples"
    RATES = "rates"
    UNSUPPORTED = "unsupported"


@dataclass
class _GpuState:
    util: UtilizationIntegrator
    util_mode: UtilMode | None = None
    pcie_tx: RateIntegrator | None = None  # only where the device has no PCIe byte counters
    pcie_rx: RateIntegrator | None = None
    energy: RateIntegrator | None = None  # only where the device has no energy counter
    probed: bool = False


class Sampler:
    """Ticks every `interval` seconds on its own thread; `integrals()` is safe from any thread."""

    def __init__(
        self,
        nvml: Nvml,
        devices: Sequence[Device],
        clock: Clock,
        *,
        interval: float = 1.0,
        idle_threshold: float = 0.0,
    ) -> None:
        self._nvml = nvml
        self._devices = list(devices)
        self._clock = clock
        self.interval = interval
        self._idle_threshold = idle_threshold
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
        """UUIDs of GPUs that stopped answering at the last tick: a cheap change signal for
        consumers (node labels) that must react within a second, without an NVML call."""
        return self._lost

    def integrals(self) -> Mapping[str, GpuIntegrals]:
        """The latest published integrals by GPU UUID (an immutable, atomically swapped map)."""
        return self._published

    def start(self) -> None:
        self.tick()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        next_at = self._clock.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - self._clock.monotonic())):
            self.tick()
            next_at += self.interval
            now = self._clock.monotonic()
            if next_at < now:  # fell behind (suspended, overloaded): do not burst to catch up
                next_at = now + self.interval

    def tick(self) -> None:
        """Sample every GPU once and publish new integrals."""
        with self._tick_lock:
            now = self._clock.monotonic()
            wall = self._clock.time()
            published: dict[str, GpuIntegrals] = {}
            lost = set(self._lost)
            for device in self._devices:
                uuid = device.identity.uuid
                state = self._states.get(uuid)
                if state is None:
                    state = self._states[uuid] = _GpuState(
                        util=UtilizationIntegrator(
                            self._idle_threshold, max_rate_gap=max(1.0, 2 * self.interval)
                        )
                    )
                state.util.tick(now)
                try:
                    self._sample(device, state, now, wall)
                    lost.discard(uuid)
                except GpuLost:
                    lost.add(uuid)  # the scrape reports it; integrals keep their last values
                except Exception:
                    log.exception("sampling GPU %d failed", device.identity.index)
                published[uuid] = _integrals(state)
            self._published = MappingProxyType(published)
            self._lost = frozenset(lost)
        self._pcie_step()

    def _pcie_step(self) -> None:
        """Read one GPU's PCIe throughput, round-robin, outside the tick lock.

        Only GPUs without PCIe byte counters (fields 197/198 are R555+) need this, and
        nvmlDeviceGetPcieThroughput measures over 20 ms per call (nvml.h): reading TX and RX
        of 8 GPUs every tick under the lock held it for at least 320 ms a second. One GPU
        per tick reads each of N GPUs every N ticks; each reading (a 20 ms window) is held
        until that GPU's next, at most twice that long, so the counter is an estimate
        from samples, unbiased but not exact (docs/metrics.md says so)."""
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
        nvml, h = self._nvml, device.handle
        try:
            tx = nvml.query("nvmlDeviceGetPcieThroughput", h, NVML_PCIE_UTIL_TX_BYTES)
            rx = nvml.query("nvmlDeviceGetPcieThroughput", h, NVML_PCIE_UTIL_RX_BYTES)
        except GpuLost:
            return
        now = self._clock.monotonic()
        with self._tick_lock:
            if state.pcie_tx is not None and tx is not None:
                state.pcie_tx.add(now, float(tx) * KIB)
            if state.pcie_rx is not None and rx is not None:
                state.pcie_rx.add(now, float(rx) * KIB)
            uuid = device.identity.uuid
            if uuid in self._published:  # publish now, not a tick later
                self._published = MappingProxyType({**self._published, uuid: _integrals(state)})

    def _sample(self, device: Device, state: _GpuState, now: float, wall: float) -> None:
        nvml, h = self._nvml, device.handle
        if not state.probed:
            self._probe(device, state)
            state.probed = True

        if state.util_mode is UtilMode.SAMPLES:
            got = nvml.query(
                "nvmlDeviceGetSamples",
                h,
                NVML_GPU_UTILIZATION_SAMPLES,
                state.util.last_sample_us,
                absent=frozenset({NOT_FOUND}),
            )
            if got is not None:
                value_type, samples = got
                dropped = state.util.dropped_samples
                state.util.add_samples(
                    (int(s.timeStamp), float(union_value(value_type, s.sampleValue)))
                    for s in samples
                )
                state.util.samples_cover_until(now)
                if not dropped and state.util.dropped_samples:  # once per GPU: a driver quirk
                    log.warning(
                        "GPU %d: utilization samples stamped 0 or outside 0-100%% are dropped",
                        device.identity.index,
                    )
            else:
                # No new sample since the last tick: NVML's ring runs dry while a GPU idles.
                # The current reading covers this tick (capped), so an idle GPU accrues idle
                # time rather than unsampled time.
                rates = nvml.query("nvmlDeviceGetUtilizationRates", h)
                if rates is not None:
                    state.util.add_rate(now, wall, float(rates.gpu))
        elif state.util_mode is UtilMode.RATES:
            rates = nvml.query("nvmlDeviceGetUtilizationRates", h)
            if rates is not None:
                state.util.add_rate(now, wall, float(rates.gpu))

        if state.energy is not None:
            milliwatts = nvml.query("nvmlDeviceGetPowerUsage", h)
            if milliwatts is not None:
                state.energy.add(now, float(milliwatts) / 1000.0)

    def _probe(self, device: Device, state: _GpuState) -> None:
        """Decide once per GPU which readings need integrating here."""
        nvml, h = self._nvml, device.handle
        first = nvml.query(
            "nvmlDeviceGetSamples",
            h,
            NVML_GPU_UTILIZATION_SAMPLES,
            0,
            absent=frozenset({NOT_FOUND}),
        )
        if first is not None or nvml.supports(
            "nvmlDeviceGetSamples", h, NVML_GPU_UTILIZATION_SAMPLES, 0
        ):
            state.util_mode = UtilMode.SAMPLES
            if first is not None:
                value_type, samples = first
                newest = max(samples, key=lambda s: int(s.timeStamp), default=None)
                if newest is not None:  # start from now: history before the agent is not ours
                    state.util.add_samples(
                        [
                            (
                                int(newest.timeStamp),
                                float(union_value(value_type, newest.sampleValue)),
                            )
                        ]
                    )
        elif nvml.supports("nvmlDeviceGetUtilizationRates", h):
            state.util_mode = UtilMode.RATES
        else:
            state.util_mode = UtilMode.UNSUPPORTED  # MIG-enabled GPUs, for one

        tx, rx = nvml.field_values(
            h, [(fields.PCIE_COUNT_TX_BYTES, 0), (fields.PCIE_COUNT_RX_BYTES, 0)]
        )
        if (tx is None or rx is None) and nvml.supports(
            "nvmlDeviceGetPcieThroughput", h, NVML_PCIE_UTIL_TX_BYTES
        ):
            # Each GPU is read every N ticks (N GPUs without counters): hold up to 2N.
            hold = 2 * self.interval * max(1, len(self._devices))
            state.pcie_tx, state.pcie_rx = RateIntegrator(hold), RateIntegrator(hold)
            # A reading covers the time back to the previous one: the first, back to now.
            state.pcie_tx.start(self._clock.monotonic())
            state.pcie_rx.start(self._clock.monotonic())
        if not nvml.supports("nvmlDeviceGetTotalEnergyConsumption", h) and nvml.supports(
            "nvmlDeviceGetPowerUsage", h
        ):
            state.energy = RateIntegrator(max(1.0, 2 * self.interval))
        log.debug(
            "GPU %d: utilization from %s, PCIe bytes %s, energy %s",
            device.identity.index,
            state.util_mode.value,
            "integrated" if state.pcie_tx else "from counters",
            "integrated" if state.energy else "from counter",
        )


def _integrals(state: _GpuState) -> GpuIntegrals:
    supported = state.util_mode in (UtilMode.SAMPLES, UtilMode.RATES)
    return GpuIntegrals(
        busy_seconds=state.util.busy_seconds if supported else None,
        idle_seconds=state.util.idle_seconds if supported else None,
        unsampled_seconds=state.util.unsampled_seconds if supported else None,
        last_active_timestamp=state.util.last_active if supported else None,
        pcie_transmit_bytes=state.pcie_tx.total if state.pcie_tx else None,
        pcie_receive_bytes=state.pcie_rx.total if state.pcie_rx else None,
        energy_joules=state.energy.total if state.energy else None,
    )

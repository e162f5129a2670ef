"""Why an allocated GPU sat idle: every idle GPU-second (and every low-activity GPU-second) a
workload is charged is also charged to exactly one cause, so that the cause counters of a
workload add up to its idle (low-activity) counter.

The cause of an interval comes from the kernel's signals of that workload's holder pods of
that device (agent/k8s/pod_cgroup_usage.py), as rates of the pod's cumulative counters:

- io = Δ io.pressure `some` seconds / Δt (a share of the interval: 0.3 = 30% stalled);
- cpu = max(Δ cpu.pressure `some` / Δt, Δ cpu.stat throttled seconds / Δt);
- memory = Δ memory.pressure `some` / Δt;
- network = the pod's TCP retransmits per second (the `net` collector's per-pod records,
  summed over its containers), between two evaluations.

The cgroup rates are taken between two of the reader's actual readings (it reads a pod at
most once per --pod-signals-interval): between readings the last rates stand, never a zero from a
cached reading. A pod's first reading has no rates yet. Over several holder pods of one
workload on one device (time-slicing), each rate is the largest pod's.

The rule (`idle_cause`), in order:

1. the largest of io, cpu and memory, if it is at least --idle-cause-pressure-threshold
   (default 0.10: a tenth of the interval stalled): `input_io`, `cpu` or `memory` (a tie
   goes in that order);
2. else `network`, if the retransmits per second reach --idle-cause-retransmit-threshold
   (default 1/s); never without the net collector;
3. else `none`, if io, cpu and memory were all measured for every holder pod: the signals
   were read and show no pressure (the GPU waits for something the kernel does not see:
   a peer, a lock, a human);
4. else `unknown`: some signal could not be read (a holder the Kubernetes API has not
   named, a pod without a cgroup here, a kernel without PSI, a pod's first reading, the
   reader off), so no cause is claimed without evidence and no "none" either.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.attribution.records import CauseKey, IdleKey
    from gpuscope.agent.k8s.pod_cgroup_usage import PodCgroupUsage, Pressure
    from gpuscope.agent.net.records import NetSnapshot

INPUT_IO, CPU, MEMORY, NETWORK, NONE, UNKNOWN = (
    "input_io",
    "cpu",
    "memory",
    "network",
    "none",
    "unknown",
)
CAUSES = (INPUT_IO, CPU, MEMORY, NETWORK, NONE, UNKNOWN)
DEFAULT_PRESSURE_THRESHOLD = 0.10  # share of the interval stalled
DEFAULT_RETRANSMIT_THRESHOLD = 1.0  # TCP retransmits per second


@dataclass(frozen=True, slots=True)
class Rates:
    """One pod's signals over its last interval; None where not measured."""

    io: float | None = None
    cpu: float | None = None
    memory: float | None = None
    network: float | None = None


def idle_cause(
    pods: Iterable[Rates],
    pressure_threshold: float = DEFAULT_PRESSURE_THRESHOLD,
    retransmit_threshold: float = DEFAULT_RETRANSMIT_THRESHOLD,
) -> str:
    """The cause of one interval of one workload on one device, from its holder pods' rates
    (the module docstring has the rule)."""
    rates = list(pods)
    if not rates:
        return UNKNOWN
    measured = True
    best, best_value = UNKNOWN, -1.0
    for cause, values in (
        (INPUT_IO, [r.io for r in rates]),
        (CPU, [r.cpu for r in rates]),
        (MEMORY, [r.memory for r in rates]),
    ):
        known = [v for v in values if v is not None]
        if len(known) < len(values):
            measured = False
        if known and max(known) > best_value:
            best, best_value = cause, max(known)
    if best_value >= pressure_threshold:
        return best
    network = [r.network for r in rates if r.network is not None]
    if network and max(network) >= retransmit_threshold:
        return NETWORK
    return NONE if measured else UNKNOWN


def _rate(now: float | None, before: float | None, dt: float) -> float | None:
    if now is None or before is None or now < before:
        return None  # not measured, or the counter started again (a new cgroup)
    return (now - before) / dt


def _some(p: Pressure | None) -> float | None:
    return p.some_seconds if p is not None else None


def _max(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return a if b is None else b
    return max(a, b)


@dataclass(slots=True)
class _Cgroup:
    """One pod's last cgroup reading, when it was read (monotonic), and the rates that ended at
    it; None where not measured, as on a pod's first reading."""

    usage: PodCgroupUsage  # the reading the rates end at
    at: float
    io: float | None = None
    cpu: float | None = None
    memory: float | None = None


@dataclass(slots=True)
class _Net:
    """One pod's TCP retransmits (summed over its containers) at an evaluation, and the rate
    since the one before; None on its first, and after its total went back."""

    retransmits: int
    at: float
    rate: float | None = None


class SignalRates:
    """Per-pod rates of the cgroup signals and TCP retransmits, for the pods asked for at
    each evaluation (the GPU holders); pods no longer asked for are forgotten."""

    def __init__(self) -> None:
        self._cgroups: dict[str, _Cgroup] = {}
        self._net: dict[str, _Net] = {}

    def update(
        self,
        uids: Collection[str],
        readings: Mapping[str, PodCgroupUsage],
        net: NetSnapshot | None,
        monotonic: float,
    ) -> None:
        cgroups: dict[str, _Cgroup] = {}
        for uid in uids:
            usage = readings.get(uid)
            if usage is None:
                continue  # no cgroup here (any more): nothing measured
            last = self._cgroups.get(uid)
            if last is None:
                cgroups[uid] = _Cgroup(usage, monotonic)
            elif usage is last.usage or monotonic <= last.at:
                cgroups[uid] = last  # the reader's cached reading: the last rates stand
            else:
                dt = monotonic - last.at
                before = last.usage
                cpu = _max(
                    _rate(_some(usage.cpu_pressure), _some(before.cpu_pressure), dt),
                    _rate(usage.cpu_throttled_seconds, before.cpu_throttled_seconds, dt),
                )
                cgroups[uid] = _Cgroup(
                    usage,
                    monotonic,
                    io=_rate(_some(usage.io_pressure), _some(before.io_pressure), dt),
                    cpu=cpu,
                    memory=_rate(_some(usage.memory_pressure), _some(before.memory_pressure), dt),
                )
        self._cgroups = cgroups
        self._net = self._net_rates(uids, net, monotonic)

    def _net_rates(
        self, uids: Collection[str], net: NetSnapshot | None, monotonic: float
    ) -> dict[str, _Net]:
        if net is None:
            return {}  # no net collector (or it failed): network is not measured
        totals = dict.fromkeys((u for u in uids), 0)
        seen: set[str] = set()
        for p in net.pods:
            if p.pod_uid in totals:
                totals[p.pod_uid] += p.tcp_retransmits
                seen.add(p.pod_uid)
        out: dict[str, _Net] = {}
        for uid in seen:
            last, total = self._net.get(uid), totals[uid]
            if last is None or total < last.retransmits:
                out[uid] = _Net(total, monotonic)
            elif monotonic <= last.at:
                out[uid] = last
            else:
                rate = (total - last.retransmits) / (monotonic - last.at)
                out[uid] = _Net(total, monotonic, rate)
        return out

    def of(self, uid: str) -> Rates:
        c, n = self._cgroups.get(uid), self._net.get(uid)
        network = n.rate if n is not None else None
        if c is None:
            return Rates(network=network)
        return Rates(c.io, c.cpu, c.memory, network)

    def __len__(self) -> int:
        return len(self._cgroups.keys() | self._net.keys())


class CauseTotals:
    """A workload's seconds by cause: every cause at 0 from the moment the workload's total
    is (so that rate() sees each cause series from its start), dropped with it."""

    def __init__(self) -> None:
        self._by: dict[IdleKey, dict[str, float]] = {}

    def hold(self, workload: IdleKey) -> None:
        if workload not in self._by:
            self._by[workload] = dict.fromkeys(CAUSES, 0.0)

    def charge(self, workload: IdleKey, cause: str, seconds: float) -> None:
        self.hold(workload)
        self._by[workload][cause] += seconds

    def drop(self, workload: IdleKey) -> None:
        self._by.pop(workload, None)

    def totals(self) -> dict[CauseKey, float]:
        return {(*w, c): s for w, causes in self._by.items() for c, s in causes.items()}

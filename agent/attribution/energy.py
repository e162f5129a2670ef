"""Energy per pod: each GPU's energy counter split between the pods on it.

Every evaluation (one per collection) takes the GPU's energy since the previous one
(`AcceleratorReading.energy_joules`: NVIDIA's total energy counter, or the sampler's
integral of power)
and credits it:

- a GPU one pod holds: all of it to that pod;
- a GPU several pods hold (time-slicing): by each pod's share of the per-process SM
  utilization on it over the same interval (NVML's per-process samples since the previous
  read, `PodGpuUsage.utilization_ratio`); equally between the holders when none of them
  ran a kernel or NVML gave no per-process figures;
- a partitioned GPU (MIG): each partition's share of the GPU (`Partition.share`; a MIG
  device's: its GPU instance's compute slices, agent/gpu/partitions.py) to the pods holding
  that partition, equally; energy of partitions nobody holds is credited to nobody.

The counter of a (GPU, pod) starts at 0 when the agent first sees the pod on the GPU (that
interval is credited to nobody: what the pod spent before is not known) and is
monotonic while it stays. A pod that leaves keeps nothing: its series ends (Prometheus keeps
what it scraped). While the kubelet is down nobody is known to hold a GPU, so that energy is
credited to nobody, and a falling energy counter (a driver reload) only resets the baseline.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gpuscope.agent.attribution.records import GpuHolding, PodEnergy, PodGpuUsage, PodRef
from gpuscope.agent.attribution.spec import StageContext, StageSpec
from gpuscope.agent.attribution.state import Joined, pod_ref

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyReading
    from gpuscope.agent.k8s.records import PodMeta
    from gpuscope.agent.runtime.sources import Collection

PodKey = tuple[str, str]  # namespace, pod


class EnergyAccountant:
    def __init__(self) -> None:
        self._baseline: dict[str, float] = {}  # GPU UUID -> energy at the last evaluation
        self._totals: dict[tuple[str, PodKey], float] = {}
        self._refs: dict[tuple[str, PodKey], tuple[int, PodRef]] = {}

    def forget_baselines(self) -> None:
        """Allocations are unknown: credit nobody until the kubelet answers again."""
        self._baseline.clear()

    def evaluate(
        self,
        readings: Sequence[AnyReading],
        holders: Mapping[str, list[GpuHolding]],
        usage: Sequence[PodGpuUsage],
        refs: Mapping[PodKey, PodRef],
    ) -> tuple[PodEnergy, ...]:
        """Credit the energy since the last evaluation; every (GPU, pod) counter now."""
        util: dict[tuple[str, PodKey], float | None] = {}
        for u in usage:
            if u.pod.name:
                key = (u.uuid, (u.pod.namespace, u.pod.name))
                prev = util.get(key, 0.0)
                ratio = u.utilization_ratio
                util[key] = None if prev is None or ratio is None else prev + ratio
        present: set[tuple[str, PodKey]] = set()
        for r in readings:
            uuid = r.identity.uuid
            split = _split(r, holders.get(uuid, []), util)
            new: set[PodKey] = set()
            for pod in split:
                key = (uuid, pod)
                present.add(key)
                if key not in self._totals:
                    new.add(pod)  # from 0 now: what it spent before it was seen is not known
                    self._totals[key] = 0.0
                self._refs[key] = (r.identity.index, refs[pod])
            energy = r.energy_joules
            if energy is None:
                self._baseline.pop(uuid, None)
                continue
            previous = self._baseline.get(uuid)
            self._baseline[uuid] = energy
            if previous is None or energy <= previous:
                continue
            delta = energy - previous
            for pod, share in split.items():
                if pod not in new:
                    self._totals[(uuid, pod)] += delta * share
        for key in [k for k in self._totals if k not in present]:
            del self._totals[key]
            del self._refs[key]
        return tuple(
            PodEnergy(self._refs[k][0], k[0], self._refs[k][1], joules)
            for k, joules in sorted(self._totals.items())
        )


def _split(
    reading: AnyReading,
    holders: Sequence[GpuHolding],
    util: Mapping[tuple[str, PodKey], float | None],
) -> dict[PodKey, float]:
    """Each holder pod's share of this GPU's energy (shares sum to 1, or less on MIG)."""
    by_mig: dict[str, list[PodKey]] = defaultdict(list)
    whole: list[PodKey] = []
    for h in holders:
        pod = (h.namespace, h.pod)
        target = by_mig[h.mig_uuid] if h.mig_uuid else whole
        if pod not in target:
            target.append(pod)
    out: dict[PodKey, float] = defaultdict(float)
    if reading.partitions and by_mig:
        device_share = {p.uuid: p.share for p in reading.partitions}
        for mig_uuid, pods in by_mig.items():
            for pod in pods:
                out[pod] += device_share.get(mig_uuid, 0.0) / len(pods)
        return dict(out)
    if len(whole) == 1:
        return {whole[0]: 1.0}
    # A holder with no process on the GPU ran nothing (0); None: NVML gave no figure.
    weights = [util.get((reading.identity.uuid, pod), 0.0) for pod in whole]
    known = [w for w in weights if w is not None]
    total = sum(known)
    if len(known) < len(weights) or total <= 0:
        return {pod: 1.0 / len(whole) for pod in whole}
    return {pod: (w or 0.0) / total for pod, w in zip(whole, weights, strict=True)}


class Energy:
    """Stage `energy`: the accountant fed with this collection's holders and usage; while
    the kubelet does not answer nobody is known to hold a GPU, so it credits nobody."""

    def __init__(self) -> None:
        self.accountant = EnergyAccountant()

    def __call__(self, collection: Collection, state: Joined) -> None:
        holdings = state.holdings
        if holdings is None:
            self.accountant.forget_baselines()
            state.energy = ()
            return
        refs = _refs(holdings, state.by_name)
        state.energy = self.accountant.evaluate(state.readings, state.holders, state.usage, refs)


def _refs(
    holdings: Sequence[GpuHolding], by_name: Mapping[tuple[str, str], PodMeta]
) -> dict[PodKey, PodRef]:
    """Each holder pod as users name it: the API's pod, else the kubelet's names alone."""
    out: dict[PodKey, PodRef] = {}
    for h in holdings:
        meta = by_name.get((h.namespace, h.pod))
        out[(h.namespace, h.pod)] = (
            pod_ref(meta) if meta is not None else PodRef("", h.namespace, h.pod, h.workload)
        )
    return out


def _build(_: StageContext) -> Energy:
    return Energy()


ENERGY = StageSpec(
    name="energy",
    summary="Each GPU's energy since the last collection, credited to the pods holding it.",
    sources=(),
    reads=("holdings", "readings", "holders", "usage", "by_name"),
    adds=("energy",),
    build=_build,
)

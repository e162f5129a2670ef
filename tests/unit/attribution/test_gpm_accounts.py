"""The GPM-era accounts of the attribution stage on hand-made records: MIG shares and ids,
a MIG device's last activity, energy per pod and low-activity seconds in the cases the
integration tests do not reach (unknown profiles, legacy MIG ids, counter resets, outages,
retention)."""

from __future__ import annotations

import pytest

from gpuscope.agent.accelerators.records import Partition
from gpuscope.agent.attribution import mig
from gpuscope.agent.attribution.activity import ActivityInput, LowActivityAccountant
from gpuscope.agent.attribution.energy import EnergyAccountant
from gpuscope.agent.attribution.records import GpuHolding, PodGpuUsage, PodRef
from gpuscope.agent.gpu import partitions
from gpuscope.agent.gpu.records import (
    GpmActivity,
    GpuIntegrals,
    GpuReading,
    MigInstance,
    NvidiaReading,
)
from gpuscope.agent.k8s.workloads import Workload
from tests.support import gpu_records

G0 = "GPU-00000000-0000-4000-8000-000000000000"


def reading(
    energy: float | None = None, migs: tuple[MigInstance, ...] = (), model: str = "H100"
) -> GpuReading:
    return GpuReading(
        gpu_records.identity(0, G0, model),
        True,
        extension=NvidiaReading(mig_instances=migs),
        energy_joules=energy,
        partitions=partitions.partitions(G0, model, migs),
    )


def shares(r: GpuReading) -> dict[str, float]:
    return {p.uuid: p.share for p in r.partitions}


def part(m: MigInstance) -> Partition:
    """A MIG device as attribution sees it."""
    (p,) = partitions.partitions(G0, "H100", (m,))
    return p


def device(uuid: str, profile: str, gi: int, ci: int = 0, **kw: object) -> MigInstance:
    return MigInstance(uuid, profile, gi, ci, None, None, **kw)  # type: ignore[arg-type]


def holding(pod: str, mig_uuid: str = "", namespace: str = "ns") -> GpuHolding:
    return GpuHolding(0, G0, namespace, pod, "main", Workload("Pod", pod), mig_uuid)


def refs(*pods: str) -> dict[tuple[str, str], PodRef]:
    return {("ns", p): PodRef("", "ns", p, Workload("Pod", p)) for p in pods}


def test_slices_come_from_the_gpu_instance_part_of_the_profile() -> None:
    profiles = ("1g.10gb", "3g.40gb", "1c.3g.40gb", "7g.80gb", "weird")
    assert [partitions.slices(p) for p in profiles] == [1, 3, 3, 7, None]


def test_shares_are_compute_slices_split_between_the_devices_of_a_gpu_instance() -> None:
    r = reading(migs=(device("A", "3g.40gb", 1), device("B1", "1c.2g.20gb", 2),
                      device("B2", "1c.2g.20gb", 2, 1), device("C", "1g.10gb", 3)))  # fmt: skip
    assert shares(r) == pytest.approx({"A": 3 / 7, "B1": 1 / 7, "B2": 1 / 7, "C": 1 / 7})
    a30 = reading(migs=(device("A", "2g.12gb", 1), device("B", "2g.12gb", 2)), model="A30")
    assert shares(a30) == {"A": 0.5, "B": 0.5}


def test_a_profile_without_slices_gets_what_the_named_ones_leave() -> None:
    r = reading(migs=(device("A", "4g.40gb", 1), device("X", "odd", 2), device("Y", "odd", 3)))
    assert shares(r) == pytest.approx({"A": 4 / 7, "X": 1.5 / 7, "Y": 1.5 / 7})
    assert sum(shares(r).values()) == pytest.approx(1.0)


def test_legacy_mig_ids_name_the_same_device() -> None:
    r = reading(migs=(device("MIG-new", "1g.10gb", 9, 0),))
    assert r.partitions[0].ids == ("MIG-new", f"MIG-{G0}/9/0")


def integrals(busy: float, idle: float) -> GpuIntegrals:
    return GpuIntegrals(busy_seconds=busy, idle_seconds=idle)


def test_last_active_is_now_minus_the_idle_tail_of_an_active_interval() -> None:
    seen = mig.LastActive()
    first = part(device("M", "1g.10gb", 1, integrals=integrals(0, 0), gpm=GpmActivity()))
    assert seen.update({"M": first}, 100.0) == {"M": None}  # nothing known yet
    # 10 s busy then 20 s idle: last active 20 s before now.
    busy = part(device("M", "1g.10gb", 1, integrals=integrals(10, 20)))
    assert seen.update({"M": busy}, 130.0) == {"M": 110.0}
    # 30 s all idle (the integral lagging a tick): unchanged.
    idle = part(device("M", "1g.10gb", 1, integrals=integrals(10, 49)))
    assert seen.update({"M": idle}, 160.0) == {"M": 110.0}
    assert seen.update({}, 170.0) == {}  # gone: forgotten
    back = part(device("M", "1g.10gb", 1, integrals=integrals(12, 49),
                       gpm=GpmActivity(graphics_engine_active=0.4)))  # fmt: skip
    assert seen.update({"M": back}, 180.0) == {"M": 180.0}  # first seen busy: active now


def test_energy_of_a_counter_that_falls_is_credited_to_nobody() -> None:
    acc = EnergyAccountant()
    holders = {G0: [holding("a")]}
    acc.evaluate([reading(1000.0)], holders, (), refs("a"))
    acc.evaluate([reading(1500.0)], holders, (), refs("a"))
    (e,) = acc.evaluate([reading(20.0)], holders, (), refs("a"))  # driver reloaded
    assert e.joules == 500.0
    (e,) = acc.evaluate([reading(120.0)], holders, (), refs("a"))
    assert e.joules == 600.0


def test_energy_while_the_kubelet_is_down_is_credited_to_nobody() -> None:
    acc = EnergyAccountant()
    holders = {G0: [holding("a")]}
    acc.evaluate([reading(0.0)], holders, (), refs("a"))
    acc.evaluate([reading(100.0)], holders, (), refs("a"))
    acc.forget_baselines()  # the stage's answer to a kubelet outage
    acc.evaluate([reading(900.0)], holders, (), refs("a"))  # first answer again: baseline
    (e,) = acc.evaluate([reading(1000.0)], holders, (), refs("a"))
    assert e.joules == 200.0


def test_unknown_per_process_utilization_splits_a_shared_gpu_equally() -> None:
    acc = EnergyAccountant()
    holders = {G0: [holding("a"), holding("b")]}
    usage = (PodGpuUsage(0, G0, refs("a")[("ns", "a")], "main", 1, None),)
    acc.evaluate([reading(0.0)], holders, usage, refs("a", "b"))
    out = acc.evaluate([reading(100.0)], holders, usage, refs("a", "b"))
    assert {e.pod.name: e.joules for e in out} == {"a": 50.0, "b": 50.0}


def test_low_activity_is_weighted_by_the_mig_share_and_kept_for_the_retention() -> None:
    acc = LowActivityAccountant(0.5, 0.1, grace=60.0)
    holders = {"MIG-a": [holding("srv", "MIG-a")]}
    acc.evaluate([ActivityInput("MIG-a", 0.0, 0.0, 3 / 7)], holders, monotonic=0.0)
    acc.evaluate([ActivityInput("MIG-a", 70.0, 1.0, 3 / 7)], holders, monotonic=70.0)
    key = ("ns", "Pod", "srv")
    assert acc.totals() == {key: pytest.approx(30.0)}  # 70 s x 3/7 of the GPU
    acc.evaluate([], {}, monotonic=100.0)  # released: kept for increase()
    assert key in acc.totals()
    acc.evaluate([], {}, monotonic=131.0)
    assert acc.totals() == {}


def test_no_gpm_means_no_low_activity_series() -> None:
    acc = LowActivityAccountant()
    holders = {G0: [holding("a")]}
    for t in (0.0, 60.0):
        acc.evaluate([ActivityInput(G0, t, None)], holders, monotonic=t)
    assert acc.totals() == {}

"""The cause of idle and low-activity seconds: the rule on literal rates, rates taken between
the cgroup reader's actual readings (never a zero from a cached one), and through the real
attribution stage over pod cgroup files under tmp_path, every idle second charged to exactly
one cause so that the causes add up to the workload's counter."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.agent.attribution.cause import (
    CAUSES,
    Rates,
    SignalRates,
    idle_cause,
)
from gpuscope.agent.attribution.options import AttributionOptions
from gpuscope.agent.attribution.stage import Attributor
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.k8s.pod_cgroup_usage import (
    CgroupRoots,
    PodCgroupReader,
    PodCgroupUsage,
    Pressure,
)
from gpuscope.agent.net.records import NetSnapshot, PodNetwork
from tests.support.why_idle import gpu_collection, meta

ALL = {"io": 0.0, "cpu": 0.0, "memory": 0.0}


def r(**kw: float | None) -> Rates:
    return Rates(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([r(io=0.5, cpu=0.2, memory=0.0)], "input_io"),
        ([r(io=0.05, cpu=0.3, memory=0.0)], "cpu"),
        ([r(io=0.0, cpu=0.0, memory=0.12)], "memory"),
        ([r(io=0.10, cpu=0.0, memory=0.0)], "input_io"),  # at the threshold counts
        ([r(io=0.2, cpu=0.2, memory=0.2)], "input_io"),  # a tie goes io, cpu, memory
        ([r(io=0.0, cpu=0.2, memory=0.2)], "cpu"),
        ([r(io=0.09, cpu=0.09, memory=0.09, network=1.0)], "network"),  # no pressure, retransmits
        ([r(io=0.5, cpu=0.0, memory=0.0, network=50.0)], "input_io"),  # pressure wins
        ([r(io=0.0, cpu=0.0, memory=0.0, network=0.9)], "none"),
        ([r(io=0.0, cpu=0.0, memory=0.0)], "none"),  # no net collector: network never chosen
        ([r(io=0.0, cpu=0.0, memory=None)], "unknown"),  # memory not measured: no "none"
        ([r(io=0.3, cpu=None, memory=None)], "input_io"),  # evidence is evidence
        ([r(network=5.0)], "network"),  # no cgroup signals, but retransmits
        ([r()], "unknown"),  # nothing read: a pod's first reading, no cgroup, reader off
        ([], "unknown"),  # no holder pod known
        # Several holder pods of one workload: the most stalled pod decides...
        ([r(io=0.0, cpu=0.0, memory=0.0), r(io=0.0, cpu=0.4, memory=0.0)], "cpu"),
        # ... and "none" needs every pod measured.
        ([r(io=0.0, cpu=0.0, memory=0.0), r()], "unknown"),
        ([r(io=0.0, cpu=0.0, memory=0.0), r(io=0.0, cpu=0.0, memory=0.0)], "none"),
    ],
)
def test_the_cause_rule(pods: list[Rates], expected: str) -> None:
    assert idle_cause(pods, 0.10, 1.0) == expected


def test_the_thresholds_are_the_flags() -> None:
    pod = [r(io=0.3, cpu=0.0, memory=0.0, network=3.0)]
    assert idle_cause(pod, pressure_threshold=0.5, retransmit_threshold=5.0) == "none"
    assert idle_cause(pod, pressure_threshold=0.5, retransmit_threshold=2.0) == "network"
    opts = AttributionOptions()
    assert (opts.idle_cause_pressure_threshold, opts.idle_cause_retransmit_threshold) == (0.1, 1.0)


def usage(io: float, cpu: float = 0.0, mem: float = 0.0, throttled: float = 0.0) -> PodCgroupUsage:
    return PodCgroupUsage(
        "u",
        cpu_pressure=Pressure(cpu, None),
        memory_pressure=Pressure(mem, None),
        io_pressure=Pressure(io, None),
        cpu_throttled_seconds=throttled,
    )


def test_rates_are_taken_between_readings_and_a_cached_reading_keeps_the_last_rates() -> None:
    rates = SignalRates()
    first = usage(io=10.0)
    rates.update({"u"}, {"u": first}, None, 0.0)
    assert rates.of("u") == Rates()  # one reading: no rate yet
    second = usage(io=15.0, cpu=1.0, throttled=3.0)
    rates.update({"u"}, {"u": second}, None, 10.0)
    assert rates.of("u") == Rates(io=0.5, cpu=0.3, memory=0.0)  # cpu: throttling beats PSI
    # The reader hands back the same reading until its interval passes: no zero deltas.
    rates.update({"u"}, {"u": second}, None, 12.0)
    assert rates.of("u") == Rates(io=0.5, cpu=0.3, memory=0.0)
    rates.update({"u"}, {"u": usage(io=15.0, cpu=1.0, throttled=3.0)}, None, 20.0)
    assert rates.of("u") == Rates(io=0.0, cpu=0.0, memory=0.0)  # a new reading, truly idle


def test_a_counter_that_falls_or_a_missing_file_is_not_a_rate_and_gone_pods_are_forgotten() -> None:
    rates = SignalRates()
    rates.update({"u"}, {"u": usage(io=10.0)}, None, 0.0)
    rates.update({"u"}, {"u": usage(io=2.0)}, None, 10.0)  # a new cgroup under the same pod
    assert rates.of("u").io is None
    no_psi = PodCgroupUsage("u", cpu_throttled_seconds=1.0)
    rates.update({"u"}, {"u": no_psi}, None, 20.0)
    rates.update({"u"}, {"u": PodCgroupUsage("u", cpu_throttled_seconds=3.0)}, None, 30.0)
    assert rates.of("u") == Rates(io=None, cpu=0.2, memory=None)
    rates.update(set(), {}, None, 40.0)
    assert len(rates) == 0


def net(**retransmits: int) -> NetSnapshot:
    pods = tuple(PodNetwork(uid, c, tcp_retransmits=n)
                 for uid, n in retransmits.items() for c in ("c1", "c2"))  # fmt: skip
    return NetSnapshot(pods, {}, {}, {}, {})


def test_retransmits_per_second_sum_the_pods_containers_between_evaluations() -> None:
    rates = SignalRates()
    rates.update({"u"}, {}, net(u=10), 0.0)
    assert rates.of("u").network is None
    rates.update({"u"}, {}, net(u=35), 10.0)
    assert rates.of("u").network == pytest.approx(5.0)  # (70 - 20) / 10 s, two containers
    rates.update({"u"}, {}, None, 20.0)  # net collector off or failed: not measured
    assert rates.of("u").network is None


# --- through the attribution stage ------------------------------------------------------------

UID = "eadf4777-07b8-449a-873e-2a219705c38d"
OTHER = "0b6a3f1e-5a4d-4c1b-9f8e-7d6c5b4a3928"


def pod_dir(root: Path, uid: str) -> Path:
    d = root / "kubepods.slice" / f"kubepods-pod{uid.replace('-', '_')}.slice"
    (d / f"cri-containerd-{'a' * 64}.scope").mkdir(parents=True, exist_ok=True)
    return d


def psi(seconds: float) -> str:
    return f"some avg10=0.00 avg60=0.00 avg300=0.00 total={int(seconds * 1e6)}\n"


def stalls(root: Path, uid: str, io: float = 0.0, cpu: float = 0.0, mem: float = 0.0) -> None:
    d = pod_dir(root, uid)
    (d / "io.pressure").write_text(psi(io))
    (d / "cpu.pressure").write_text(psi(cpu))
    (d / "memory.pressure").write_text(psi(mem))


def stage(tmp_path: Path, **options: float) -> tuple[Attributor, ManualClock]:
    clock = ManualClock(1000.0)
    reader = PodCgroupReader(CgroupRoots(tmp_path / "cgroup"), clock=clock, interval=1.0)
    att = Attributor(
        tmp_path / "proc", clock=clock, options=AttributionOptions(**options), pod_signals=reader
    )  # type: ignore[arg-type]
    return att, clock


def causes(totals: dict[tuple[str, str, str, str], float], name: str) -> dict[str, float]:
    return {k[3]: v for k, v in totals.items() if k[2] == name}


def test_idle_seconds_are_charged_to_the_cause_the_holders_signals_show_over_that_interval(
    tmp_path: Path,
) -> None:
    cg = tmp_path / "cgroup"
    train, web = meta(UID, "train"), meta(OTHER, "web")
    att, clock = stage(tmp_path)
    # Interval by interval (10 s each, the GPU idle throughout, time-sliced by two jobs):
    # train waits on storage, then on its CPU limit, then on nothing; web is never read
    # (no cgroup here), so its share stays unknown.
    script = [(0.0, 0.0), (6.0, 0.0), (6.0, 3.0), (6.0, 3.0)]  # cumulative io, cpu stall
    for i, (io, cpu) in enumerate(script):
        stalls(cg, UID, io=io, cpu=cpu)
        out = att.attribute(gpu_collection(idle=10.0 * i, pods=[train, web], at=clock.time()))
        clock.advance(10)
    assert causes(dict(out.idle_cause_seconds_total), "train") == {
        "input_io": 5.0, "cpu": 5.0, "memory": 0.0, "network": 0.0, "none": 5.0, "unknown": 0.0,
    }  # fmt: skip
    assert causes(dict(out.idle_cause_seconds_total), "web")["unknown"] == 15.0
    for key, total in out.idle_seconds_total.items():
        by_cause = [v for k, v in out.idle_cause_seconds_total.items() if k[:3] == key]
        assert len(by_cause) == len(CAUSES)
        assert sum(by_cause) == pytest.approx(total)


def test_network_is_the_cause_only_with_retransmits_and_without_pressure(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup"
    train = meta(UID, "train")
    att, clock = stage(tmp_path, idle_cause_retransmit_threshold=2.0)
    for i, sent in enumerate((0, 30, 40)):  # 3/s, then 1/s
        stalls(cg, UID)
        out = att.attribute(
            gpu_collection(idle=10.0 * i, pods=[train], retransmits={UID: sent}, at=clock.time())
        )
        clock.advance(10)
    got = causes(dict(out.idle_cause_seconds_total), "train")
    assert (got["network"], got["none"]) == (10.0, 10.0)


def test_low_activity_seconds_are_charged_to_a_cause_as_well(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup"
    train = meta(UID, "train")
    att, clock = stage(tmp_path)
    for i in range(3):
        stalls(cg, UID, mem=4.0 * i)  # 40% of every interval in memory stalls
        # Busy on paper all the time, SMs doing nothing: low activity.
        out = att.attribute(
            gpu_collection(idle=0.0, busy=10.0 * i, sm_active=0.0, pods=[train], at=clock.time())
        )
        clock.advance(10)
    assert out.low_activity_seconds_total == {("ml", "Job", "train"): 20.0}
    got = causes(dict(out.low_activity_cause_seconds_total), "train")
    # Charged from the second evaluation, when two readings give a rate: all to memory.
    assert got == dict.fromkeys(CAUSES, 0.0) | {"memory": 20.0}


def test_without_the_reader_every_idle_second_is_unknown(tmp_path: Path) -> None:
    clock = ManualClock(1000.0)
    att = Attributor(tmp_path / "proc", clock=clock)  # no pod signals reader
    train = meta(UID, "train")
    for i in range(3):
        out = att.attribute(gpu_collection(idle=10.0 * i, pods=[train], at=clock.time()))
        clock.advance(10)
    got = causes(dict(out.idle_cause_seconds_total), "train")
    assert got["unknown"] == 20.0 and sum(got.values()) == 20.0


def test_scrapes_between_readings_charge_the_last_rates_not_zero(tmp_path: Path) -> None:
    """Two scrapes 0.5 s apart with a 1 s reader interval: the second gets the reader's cached
    reading, and must keep the storage cause rather than compute 0 from it."""
    cg = tmp_path / "cgroup"
    train = meta(UID, "train")
    att, clock = stage(tmp_path)
    stalls(cg, UID, io=0.0)
    att.attribute(gpu_collection(idle=0.0, pods=[train]))
    clock.advance(10)
    stalls(cg, UID, io=8.0)
    att.attribute(gpu_collection(idle=10.0, pods=[train]))
    clock.advance(0.5)
    out = att.attribute(gpu_collection(idle=10.5, pods=[train]))
    assert causes(dict(out.idle_cause_seconds_total), "train")["input_io"] == 10.5

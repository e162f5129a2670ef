"""Per-workload counters are bounded (issue #21): a workload's idle and low-activity series go
--workload-prune-grace after its last pod leaves, at most --max-workloads are kept (the rest
counted in gpuscope_series_dropped_total{reason="workload_limit"}), and the totals stay
honest: continuous across a pod restart within the grace, from 0 after it, never a share
handed to another workload. The churn test runs the real attribution stage and renderer for
600 simulated seconds on the agent's ManualClock."""

from __future__ import annotations

import logging

import pytest

from gpuscope.agent.app.config import ConfigError, parse
from gpuscope.agent.app.exposition import catalog
from gpuscope.agent.attribution.cause import CAUSES
from gpuscope.agent.attribution.idle import GpuIdleInput, IdleAccountant
from gpuscope.agent.attribution.options import AttributionOptions
from gpuscope.agent.attribution.records import GpuHolding
from gpuscope.agent.attribution.retention import WorkloadRetention
from gpuscope.agent.attribution.stage import Attributor
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.k8s.workloads import Workload
from gpuscope.exporters.prometheus.attribution import render_attribution
from gpuscope.exporters.prometheus.families import Families
from tests.support.why_idle import G0, gpu_collection, meta

PER_WORKLOAD = (
    "gpuscope_workload_gpu_idle_seconds_total",
    "gpuscope_workload_gpu_idle_cause_seconds_total",
    "gpuscope_workload_gpu_low_activity_seconds_total",
    "gpuscope_workload_gpu_low_activity_cause_seconds_total",
)
SERIES = 2 * (1 + len(CAUSES))  # one workload's series in the four families: 14
EVERY, SCRAPE, LIFE, SPAN = 5.0, 15.0, 30.0, 600.0  # a new pod every 5 s, each living 30 s


def w(name: str) -> tuple[str, str, str]:
    return ("ml", "Job", name)


# --- the retention on its own -----------------------------------------------------------------


def test_a_workload_goes_after_the_grace_and_not_before() -> None:
    r = WorkloadRetention(grace=60.0, limit=10)
    assert r.admit({w("a")}, 0.0).kept == {w("a")}
    assert r.admit(set(), 60.0).gone == ()  # exactly the grace: still kept
    assert r.admit({w("b")}, 60.5).gone == (w("a"),)
    assert len(r) == 1


def test_past_the_limit_the_least_recently_held_goes_first_and_holders_never() -> None:
    r = WorkloadRetention(grace=300.0, limit=3)
    r.admit({w("a")}, 0.0)
    r.admit({w("b")}, 10.0)
    r.admit({w("c")}, 20.0)
    got = r.admit({w("c"), w("d")}, 30.0)  # full: "a" held least recently, so it goes
    assert (got.gone, got.evicted, got.refused, got.kept) == ((w("a"),), 1, 0, {w("c"), w("d")})
    # Three holders at once in three places; a fourth holder finds none and is refused,
    # while no holder is ever evicted for it.
    got = r.admit({w("b"), w("c"), w("d"), w("e")}, 40.0)
    assert (got.gone, got.refused, got.kept) == ((), 1, {w("b"), w("c"), w("d")})


# --- the accountant: honest totals ------------------------------------------------------------


def holding(name: str) -> GpuHolding:
    return GpuHolding(0, G0, "ml", f"{name}-0", "main", Workload("Job", name))


def test_a_workload_back_within_the_grace_continues_and_after_it_starts_at_zero() -> None:
    idle = IdleAccountant(grace=60.0)
    held = {G0: [holding("train")]}

    def at(t: float, holders: dict[str, list[GpuHolding]]) -> None:
        idle.evaluate([GpuIdleInput(G0, t, None)], holders, now=t, monotonic=t)

    at(0.0, held)
    at(10.0, held)
    at(40.0, {})  # the pod restarts: 30 s without it
    at(50.0, held)
    at(60.0, held)
    assert idle.totals() == {w("train"): 20.0}  # the same counter, its gap not counted
    at(100.0, {})
    at(121.0, {})  # 61 s since it last held a GPU: gone with every cause
    assert idle.totals() == {} and idle.cause_totals() == {}
    at(130.0, held)
    at(140.0, held)
    assert idle.totals() == {w("train"): 10.0}  # back after the grace: from 0, a reset


def test_a_holder_without_a_place_is_left_out_counted_and_keeps_its_share_from_others() -> None:
    idle = IdleAccountant(max_workloads=2)
    held = {G0: [holding("a"), holding("b"), holding("c")]}
    for t in (0.0, 30.0, 60.0):
        idle.evaluate([GpuIdleInput(G0, t, None)], held, now=t, monotonic=t)
    # "c" has no place: the GPU's 60 idle seconds are still split three ways.
    assert idle.totals() == {w("a"): 20.0, w("b"): 20.0}
    assert idle.dropped_series == 3 * (1 + len(CAUSES))  # its 7 series, at 3 evaluations


# --- 600 s of pod churn through the stage and the renderer ------------------------------------


def churn(
    att: Attributor, clock: ManualClock, names: dict[float, set[str]] | None = None
) -> list[tuple[float, int, float]]:
    """A new pod every 5 s, each its own workload, living 30 s (6 at a time), time-slicing one
    GPU with GPM that idles throughout; a scrape every 15 s for 600 s. Per scrape: the time,
    the per-workload series and gpuscope_series_dropped_total{reason="workload_limit"}; and
    in `names`, by time, the workloads with an idle counter."""
    start, seen = clock.time(), []
    while (t := clock.time() - start) <= SPAN:
        born = [i for i in range(int(t // EVERY) + 1) if t - i * EVERY < LIFE]
        alive = [meta(f"00000000-0000-4000-8000-{i:012d}", f"job-{i:03d}") for i in born]
        out = att.attribute(
            gpu_collection(idle=t, busy=0.0, sm_active=0.0, pods=alive, at=clock.time())
        )
        families = Families(catalog())
        render_attribution(out, families)
        series = sum(len(families.samples(name)) for name in PER_WORKLOAD)
        dropped = dict(out.series_dropped).get("workload_limit", -1.0)
        seen.append((t, series, float(dropped)))
        if names is not None:
            idle = families.samples("gpuscope_workload_gpu_idle_seconds_total")
            names[t] = {labels[2] for labels, _ in idle}
        clock.advance(SCRAPE)
    return seen


def test_six_hundred_seconds_of_pod_churn_keep_the_per_workload_series_bounded() -> None:
    clock = ManualClock(1000.0)
    att = Attributor(clock=clock, options=AttributionOptions())
    names: dict[float, set[str]] = {}
    seen = churn(att, clock, names)
    grace = AttributionOptions().workload_prune_grace
    # A workload is there while its pod holds the GPU and for the grace after the last scrape
    # that saw it; then it is gone. Pod i lives from 5i to 5i + 30 s; a scrape every 15 s.
    kept = gone = 0
    for t, present in names.items():
        for i in range(int(t // EVERY) + 1):
            held = [s for s in names if s <= t and EVERY * i <= s < EVERY * i + LIFE]
            expected = bool(held) and t - max(held) <= grace
            assert (f"job-{i:03d}" in present) == expected, (t, i, held)
            kept, gone = kept + expected, gone + (bool(held) and not expected)
    assert kept and gone  # both seen: held ones, and ones gone after their grace
    # Workloads held within the grace (and one scrape), plus those alive now.
    bound = ((grace + SCRAPE) / EVERY + LIFE / EVERY) * SERIES
    assert max(s for _, s, _ in seen) <= bound
    # Past the grace the count stops growing: as many workloads go as come.
    late = [s for t, s, _ in seen if t >= grace + 2 * SCRAPE]
    assert max(late) - min(late) <= 3 * SERIES, late
    assert all(d == 0 for *_, d in seen)  # the cap never bit


def test_with_a_cap_the_series_never_pass_it_and_the_drops_are_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(1000.0)
    att = Attributor(clock=clock, options=AttributionOptions(max_workloads=20))
    with caplog.at_level(logging.INFO, logger="gpuscope.attribution"):
        seen = churn(att, clock)
    assert max(s for _, s, _ in seen) <= 20 * SERIES
    assert [s for t, s, _ in seen if t >= 120] == [20 * SERIES] * len(
        [t for t, *_ in seen if t >= 120]
    )  # full from then on: each newcomer takes the place of the one idle longest
    dropped = seen[-1][2]
    # 121 workloads came, 20 have a place: each of the other 101 left early, 14 series each.
    assert dropped == (121 - 20) * SERIES
    lines = [r for r in caplog.records if "--max-workloads" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING]  # once, not per eviction


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--workload-prune-grace", "-1"), ("--workload-prune-grace", "86401"),
     ("--max-workloads", "0"), ("--max-workloads", "100001"), ("--max-workloads", "many")],
)  # fmt: skip
def test_the_flags_reject_what_is_not_a_grace_or_a_count(flag: str, value: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        parse([flag, value], env={})


def test_the_flags_reach_the_options() -> None:
    config = parse(["--workload-prune-grace", "120", "--max-workloads", "64"], env={})
    assert (config.attribution.workload_prune_grace, config.attribution.max_workloads) == (
        120.0,
        64,
    )

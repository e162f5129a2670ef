"""Why is this GPU idle" as Prometheus exposes it: the start-up gauge with the per-pod
labels, the idle and low-activity seconds by cause beside their totals (summed over cause,
the total), golden text (which also proves every documented family is exported) and
promtool-clean."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from gpuscope.agent.app.exposition import catalog
from gpuscope.agent.attribution.activity import ActivityInput, LowActivityAccountant
from gpuscope.agent.attribution.cause import CAUSES
from gpuscope.agent.attribution.idle import GpuIdleInput, IdleAccountant
from gpuscope.agent.attribution.records import Attribution, GpuHolding, PodRef, PodStartup
from gpuscope.agent.k8s.workloads import Workload
from gpuscope.exporters.prometheus.attribution import render_attribution
from gpuscope.exporters.prometheus.families import Families
from tests.support import GOLDEN_DIR
from tests.support.promtext import Exposition

GOLDEN = GOLDEN_DIR / "why_idle.prom"
G0 = "GPU-00000000-0000-4000-8000-000000000000"
TRAIN = PodRef("0b8e6a9c-1d2f-4e3a-8b7c-6d5e4f3a2b1c", "ml", "train-0", Workload("Job", "train"))


def attribution() -> Attribution:
    """Two workloads time-slicing one GPU for three intervals of 10 s, each interval judged
    by a different cause; the GPU idle throughout and busy on paper with no SM activity."""
    idle, low = IdleAccountant(), LowActivityAccountant()
    holders = {
        G0: [
            GpuHolding(0, G0, "ml", "train-0", "main", Workload("Job", "train")),
            GpuHolding(0, G0, "web", "srv-0", "main", Workload("Deployment", "srv")),
        ]
    }
    causes = iter(["input_io", "cpu", "network", "none", "unknown", "memory"])

    def judge(theirs: object) -> str:
        return next(causes)

    for t in (0.0, 10.0, 20.0, 30.0):
        idle.evaluate([GpuIdleInput(G0, t, None)], holders, now=t, monotonic=t, judge=judge)
        low.evaluate([ActivityInput(G0, t, 0.0)], holders, monotonic=t, judge=lambda _: "cpu")
    return Attribution(
        idle_seconds_total=idle.totals(),
        idle_cause_seconds_total=idle.cause_totals(),
        low_activity_seconds_total=low.totals(),
        low_activity_cause_seconds_total=low.cause_totals(),
        startups=(PodStartup(TRAIN, 42.5),),
    )


def render() -> str:
    out = Families(catalog())
    render_attribution(attribution(), out)
    return out.render_text().decode()


def test_startup_is_a_gauge_with_the_per_pod_labels() -> None:
    e = Exposition(render())
    assert e.value(
        "gpuscope_pod_gpu_startup_seconds", namespace="ml", pod="train-0", pod_uid=TRAIN.uid,
        workload_kind="Job", workload="train",
    ) == 42.5  # fmt: skip
    assert "# TYPE gpuscope_pod_gpu_startup_seconds gauge" in render()


@pytest.mark.parametrize("family", ["idle", "low_activity"])
def test_every_cause_is_exported_and_they_sum_to_the_workloads_total(family: str) -> None:
    text = render()
    e = Exposition(text)
    cause_name = f"gpuscope_workload_gpu_{family}_cause_seconds_total"
    assert f"# TYPE {cause_name} counter" in text
    for ns, kind, name in (("ml", "Job", "train"), ("web", "Deployment", "srv")):
        w = {"namespace": ns, "workload_kind": kind, "workload": name}
        by_cause = e.by_label(cause_name, "cause", **w)
        assert set(by_cause) == set(CAUSES)  # every cause from 0, so rate() sees each start
        total = e.value(f"gpuscope_workload_gpu_{family}_seconds_total", **w)
        assert total == 15.0  # 30 s of one GPU, split between two workloads
        assert sum(by_cause.values()) == pytest.approx(total)
    idle = "gpuscope_workload_gpu_idle_cause_seconds_total"
    train = {"namespace": "ml", "workload_kind": "Job", "workload": "train"}
    assert e.by_label(idle, "cause", **train) == {
        "input_io": 5.0, "cpu": 0.0, "memory": 0.0, "network": 5.0, "none": 0.0, "unknown": 5.0,
    }  # fmt: skip


def test_why_idle_exposition_matches_golden() -> None:
    text = render()
    if os.environ.get("GPUSCOPE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_why_idle_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool
    check = subprocess.run(
        [promtool, "check", "metrics"], input=render().encode(), capture_output=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr

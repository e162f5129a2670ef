"""Per-pod cgroup signals as Prometheus exposes them: base units, the per-pod labels, one
series per direction and stall kind, nothing for a file the pod's cgroup lacks, golden text
(which also proves every documented family is exported) and promtool-clean."""

from __future__ import annotations

import os
import shutil
import subprocess

from gpuscope.agent.app.exposition import catalog
from gpuscope.agent.attribution.records import Attribution, PodRef, PodSignals
from gpuscope.agent.k8s.pod_cgroup_usage import PodCgroupUsage, Pressure
from gpuscope.agent.k8s.workloads import Workload
from gpuscope.exporters.prometheus.attribution import render_attribution
from gpuscope.exporters.prometheus.families import Families
from tests.support import GOLDEN_DIR
from tests.support.promtext import Exposition

GOLDEN = GOLDEN_DIR / "pod_signals.prom"

TRAIN = PodRef("0b8e6a9c-1d2f-4e3a-8b7c-6d5e4f3a2b1c", "ml", "train-0", Workload("Job", "train"))
UNNAMED = PodRef("7f6e5d4c-3b2a-4190-8f7e-6d5c4b3a2910", "", "", Workload("", ""))
FULL = PodCgroupUsage(
    TRAIN.uid,
    cpu_pressure=Pressure(2.5, 1.0),
    memory_pressure=Pressure(0.25, 0.125),
    io_pressure=Pressure(4.0, None),
    cpu_throttled_periods=12,
    cpu_throttled_seconds=1.5,
    io_read_bytes=4096,
    io_write_bytes=0,
    io_read_operations=1,
    io_write_operations=0,
    oom_kills=2,
)
ATT = Attribution(
    pod_signals=(
        PodSignals(TRAIN, FULL),
        PodSignals(UNNAMED, PodCgroupUsage(UNNAMED.uid, io_pressure=Pressure(1.0, 0.5))),
    )
)
POD = {
    "namespace": "ml",
    "pod": "train-0",
    "pod_uid": TRAIN.uid,
    "workload_kind": "Job",
    "workload": "train",
}


def render() -> str:
    out = Families(catalog())
    render_attribution(ATT, out)
    return out.render_text().decode()


def test_every_signal_of_a_pod_is_a_counter_in_base_units_with_the_per_pod_labels() -> None:
    text = render()
    e = Exposition(text)
    p = POD
    pressure = "gpuscope_pod_pressure_stalled_seconds_total"
    assert e.value(pressure, **p, resource="cpu", stall="some") == 2.5
    assert e.value(pressure, **p, resource="cpu", stall="full") == 1.0
    assert e.value(pressure, **p, resource="memory", stall="full") == 0.125
    assert e.value(pressure, **p, resource="io", stall="some") == 4.0
    # The kernel wrote no `full` line for io: no series, not a zero.
    assert e.get(pressure, **p, resource="io", stall="full") is None
    assert e.value("gpuscope_pod_cpu_throttled_periods_total", **p) == 12
    assert e.value("gpuscope_pod_cpu_throttled_seconds_total", **p) == 1.5
    assert e.by_label("gpuscope_pod_io_bytes_total", "direction", **p) == {
        "read": 4096,
        "write": 0,
    }
    assert e.by_label("gpuscope_pod_io_operations_total", "direction", **p) == {
        "read": 1,
        "write": 0,
    }
    assert e.value("gpuscope_pod_oom_kills_total", **p) == 2
    for name in e.names():
        assert f"# TYPE {name} counter" in text


def test_a_pod_whose_cgroup_lacks_files_has_only_the_series_it_has() -> None:
    unnamed = [line for line in render().splitlines() if UNNAMED.uid in line]
    assert len(unnamed) == 2
    assert all("gpuscope_pod_pressure_stalled_seconds_total" in line for line in unnamed)
    assert all('namespace="",pod=""' in line for line in unnamed)


def test_pod_signals_exposition_matches_golden() -> None:
    text = render()
    if os.environ.get("GPUSCOPE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_the_signals_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool
    check = subprocess.run(
        [promtool, "check", "metrics"], input=render().encode(), capture_output=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr

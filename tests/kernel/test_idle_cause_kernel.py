"""Idle causes on the real kernel: scripted pods in real cgroups (tests/kernel/scripted_pods.py),
each holding one GPU that idles throughout, through the real attribution stage (`Attributor`)
with the real `PodCgroupReader` over the real cgroup tree. The GPU, kubelet and API records
are synthetic (tests/support/why_idle.py: a GPU whose idle integral is the time elapsed),
so what is under test is the kernel's accounting and the stage's reading of it, not the
doubles (an in-process agent would add the fake NVML, kubelet and API server doubles and
nothing the cause depends on). A pod reading a file with O_DIRECT in a loop is charged
`input_io`; a pod over a CPU quota it exceeds, `cpu`; a pod that sleeps, `none`."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuscope.agent.attribution.records import Attribution
from gpuscope.agent.attribution.stage import Attributor
from gpuscope.agent.k8s.pod_cgroup_usage import PodCgroupReader
from tests.doubles.podcgroups import CPU_BURNER, block_device_file, direct_reader
from tests.kernel.scripted_pods import WAIT, ScriptedPod, cpu_quota, scripted_pod
from tests.support.why_idle import gpu_collection, meta

pytestmark = [pytest.mark.kernel, pytest.mark.root(reason="creates cgroups and moves into them")]

EVERY = 0.5  # seconds between evaluations (scrapes); the reader reads at most every 0.25 s
ENOUGH = 3.0  # idle seconds charged before the causes are judged


@pytest.fixture
def pod() -> Iterator[ScriptedPod]:
    with scripted_pod() as p:
        if not (p.pod.v2 / "io.pressure").exists():
            pytest.skip("the kernel has no pressure stall information (PSI)")
        yield p


def causes(pod: ScriptedPod, worker: subprocess.Popen[bytes]) -> dict[str, float]:
    """Evaluate the stage every EVERY s while `worker` runs, until ENOUGH idle seconds are
    charged past the first interval with rates (bounded by WAIT); the seconds by cause."""
    att = Attributor(Path("/proc"), pod_signals=PodCgroupReader(pod.roots, interval=EVERY / 2))
    train = meta(pod.uid, "train")
    t0 = time.monotonic()
    out = Attribution()

    def charged() -> dict[str, float]:
        return {k[3]: v for k, v in out.idle_cause_seconds_total.items() if k[2] == "train"}

    try:
        while time.monotonic() - t0 < WAIT:
            assert worker.poll() is None, "the pod's process ended early"
            out = att.attribute(gpu_collection(idle=time.monotonic() - t0, pods=[train]))
            if sum(charged().values()) >= ENOUGH:
                break
            time.sleep(EVERY)
    finally:
        worker.kill()
        worker.wait()
    got = charged()
    total = out.idle_seconds_total[("ml", "Job", "train")]
    assert sum(got.values()) == pytest.approx(total)  # every idle second has one cause
    assert total >= ENOUGH, got
    return got


def test_a_pod_reading_with_o_direct_while_its_gpu_idles_is_charged_input_io(
    pod: ScriptedPod, tmp_path: Path
) -> None:
    data = tmp_path / "shard.bin"
    if block_device_file(data, 8 << 20) is None:
        pytest.skip(f"{tmp_path} is on no block device, or does not take O_DIRECT")
    got = causes(pod, pod.spawn(direct_reader(data, loop=True)))
    assert got["input_io"] > 0 and got["input_io"] == max(got.values()), got


def test_a_pod_over_its_cpu_quota_while_its_gpu_idles_is_charged_cpu(pod: ScriptedPod) -> None:
    cpu_quota(pod)  # 10% of a CPU for the pod
    got = causes(pod, pod.spawn(CPU_BURNER))
    assert got["cpu"] > 0 and got["cpu"] == max(got.values()), got


def test_a_pod_that_sleeps_while_its_gpu_idles_is_charged_none(pod: ScriptedPod) -> None:
    got = causes(pod, pod.spawn("import time; time.sleep(600)"))
    # Signals read and no stall at all: "none", never a resource and never "unknown".
    assert got["none"] > 0, got
    assert got["input_io"] == got["cpu"] == got["memory"] == got["unknown"] == 0.0, got

"""Start-up time (scheduling to first GPU activity): the PodScheduled condition as the API
server double serves it, and through the real attribution stage: pods that start idle and
become active, pods already there when the agent started (no series, never a guess), pods
the API names late, MIG processes, blind spells without GPU records and pods that leave."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig

from gpuscope.agent.attribution.stage import Attributor
from gpuscope.agent.attribution.startup import StartupTracker
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.gpu import partitions
from gpuscope.agent.gpu.records import (
    GpmActivity,
    GpuProcess,
    GpuReading,
    MigInstance,
    NvidiaReading,
)
from gpuscope.agent.k8s.pods import PodWatcher, pod_meta, scheduled_at
from gpuscope.agent.k8s.records import PodMeta, PodsSnapshot
from gpuscope.agent.runtime.sources import Collection, SourceResult
from tests.doubles.kube_apiserver import KubeApiServer
from tests.doubles.kube_apiserver import pod as pod_object
from tests.support import gpu_records, wait_for
from tests.support.why_idle import gpu_collection, meta

UID = "eadf4777-07b8-449a-873e-2a219705c38d"
LATE = "0b6a3f1e-5a4d-4c1b-9f8e-7d6c5b4a3928"
T0 = 1_700_000_000.0


def test_the_pod_scheduled_condition_is_read_from_what_the_api_serves() -> None:
    obj = pod_object("ml", "train-0", "n1", uid=UID, scheduled_at=T0 + 0.7)
    assert obj["status"]["conditions"][0]["lastTransitionTime"] == "2023-11-14T22:13:20Z"
    assert pod_meta(obj).scheduled_at == T0  # the API keeps whole seconds
    assert pod_meta(pod_object("ml", "pending", uid=UID)).scheduled_at is None
    unschedulable = {"conditions": [{"type": "PodScheduled", "status": "False",
                                     "reason": "Unschedulable"}]}  # fmt: skip
    assert scheduled_at(unschedulable) is None
    odd = {"conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "x"}]}
    assert scheduled_at(odd) is None
    offset = [{"type": "Ready"}, {"type": "PodScheduled", "status": "True",
                                  "lastTransitionTime": "2023-11-14T23:13:20+01:00"}]  # fmt: skip
    assert scheduled_at({"conditions": offset}) == T0


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[KubeApiServer, PodWatcher]]:
    with KubeApiServer() as server:
        kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
        watcher = PodWatcher(lambda: Client(KubeConfig.from_file(str(kubeconfig))), "n1",
                             backoff_first=0.05, backoff_max=0.2, watch_timeout=2)  # fmt: skip
        yield server, watcher
        server.stop()
        watcher.stop()


def test_the_pods_watcher_keeps_when_each_pod_was_scheduled(api) -> None:
    server, watcher = api
    server.add_pod("ml", "train-0", "n1", uid=UID, scheduled_at=T0)
    watcher.start()
    assert watcher.synced.wait(5)
    server.add_pod("ml", "train-1", "n1", uid=LATE, scheduled_at=T0 + 30)
    wait_for(lambda: len(watcher.pods()) == 2, what="the second pod")
    assert {m.name: m.scheduled_at for m in watcher.pods().values()} == {
        "train-0": T0,
        "train-1": T0 + 30,
    }


# --- the tracker on its own ------------------------------------------------------------------


def test_a_pod_seen_idle_then_active_gets_its_start_up_and_keeps_it_until_it_leaves() -> None:
    t = StartupTracker()
    pods = {UID: meta(UID, "train", scheduled_at=T0 + 5)}
    assert t.evaluate(set(), {}, T0) == {}  # the agent's first look: the watch begins
    assert t.evaluate(set(), pods, T0 + 15) == {}  # pulling its image
    assert t.evaluate({UID}, pods, T0 + 95) == {UID: 90.0}
    assert t.evaluate(set(), pods, T0 + 110) == {UID: 90.0}  # idle again: kept
    assert t.evaluate(set(), {}, T0 + 125) == {}  # left the pods list: forgotten


def test_a_pod_scheduled_before_the_agent_watched_has_no_start_up() -> None:
    t = StartupTracker()
    old = {UID: meta(UID, "train", scheduled_at=T0 - 600)}
    assert t.evaluate({UID}, old, T0) == {}  # active when first seen
    assert t.evaluate(set(), old, T0 + 15) == {}
    idle_at_first = StartupTracker()
    assert idle_at_first.evaluate(set(), old, T0) == {}  # idle when first seen: it may have
    assert idle_at_first.evaluate({UID}, old, T0 + 15) == {}  # run before; still unknown


def test_activity_before_the_api_names_the_pod_counts_from_when_it_began() -> None:
    t = StartupTracker()
    t.evaluate(set(), {}, T0)
    assert t.evaluate({LATE}, {}, T0 + 30) == {}  # active, not named yet (API down)
    named = {LATE: meta(LATE, "train", scheduled_at=T0 + 10)}
    assert t.evaluate({LATE}, named, T0 + 300) == {LATE: 20.0}  # not 290


def test_a_spell_without_gpu_records_makes_earlier_pods_unknowable() -> None:
    t = StartupTracker()
    pods = {UID: meta(UID, "train", scheduled_at=T0 + 5)}
    t.evaluate(set(), pods, T0 + 10)
    t.blind()  # the GPU collector failed: activity meanwhile unseen
    assert t.evaluate({UID}, pods, T0 + 60) == {}
    fresh = {**pods, LATE: meta(LATE, "b", scheduled_at=T0 + 70)}
    t.evaluate(set(), fresh, T0 + 75)
    assert t.evaluate({LATE}, fresh, T0 + 90) == {LATE: 20.0}


def test_a_skewed_clock_reads_zero_not_a_negative_start_up() -> None:
    t = StartupTracker()
    pods = {UID: meta(UID, "train", scheduled_at=T0 + 20)}  # the control plane runs ahead
    t.evaluate(set(), {}, T0)
    assert t.evaluate({UID}, pods, T0 + 15) == {UID: 0.0}


# --- through the attribution stage -------------------------------------------------------------


def procfs(tmp_path: Path, pid: int, uid: str) -> Path:
    root = tmp_path / "proc"
    (root / str(pid)).mkdir(parents=True)
    path = f"/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{'a' * 64}"
    (root / str(pid) / "cgroup").write_text(f"0::{path}.scope\n")
    return root


def test_the_stage_exports_a_start_up_once_a_process_of_the_pod_runs_a_kernel(
    tmp_path: Path,
) -> None:
    clock = ManualClock(T0)
    att = Attributor(procfs(tmp_path, 7, UID), clock=clock)
    assert att.attribute(gpu_collection(idle=0.0, pods=[])).startups == ()
    train = meta(UID, "train", scheduled_at=T0 + 3)
    seen = []
    for util in (None, 0.0, 0.0, 0.4):  # no process yet, then a context without kernels
        clock.advance(15)
        procs = [] if util is None else [GpuProcess(7, 2**30, util)]
        seen.append(att.attribute(gpu_collection(idle=0.0, pods=[train], processes=procs)))
    assert [s.startups for s in seen[:3]] == [(), (), ()]
    (startup,) = seen[-1].startups
    assert (startup.pod.name, startup.pod.uid, startup.seconds) == ("train", UID, 57.0)
    clock.advance(15)
    gone = att.attribute(gpu_collection(idle=0.0, pods=[]))
    assert gone.startups == ()


def mig_collection(pods: dict[str, PodMeta], active: float) -> Collection:
    ident = gpu_records.identity(0, "GPU-0", "H100")
    mig = MigInstance("MIG-a", "1g.10gb", 1, 0, None, None,
                      gpm=GpmActivity(graphics_engine_active=active))  # fmt: skip
    reading = GpuReading(ident, True, extension=NvidiaReading(mig_instances=(mig,)),
                         partitions=partitions.partitions("GPU-0", "H100", (mig,)),
                         processes=(GpuProcess(7, 2**30, None, "MIG-a"),))  # fmt: skip
    return Collection(
        results={
            "gpu": SourceResult("gpu", gpu_records.snapshot((reading,)), True, 0),
            "pods": SourceResult("pods", PodsSnapshot(pods), True, 0),
        },
        collected_at=0.0,
    )


def test_on_mig_the_gpu_instances_activity_stands_for_the_process(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    att = Attributor(procfs(tmp_path, 7, UID), clock=clock)
    pods = {UID: meta(UID, "infer", scheduled_at=T0 + 1)}
    att.attribute(mig_collection({}, 0.0))
    clock.advance(15)
    assert att.attribute(mig_collection(pods, 0.0)).startups == ()
    clock.advance(15)
    (startup,) = att.attribute(mig_collection(pods, 0.25)).startups
    assert startup.seconds == 29.0

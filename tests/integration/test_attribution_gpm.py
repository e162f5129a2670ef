"""Attribution on GPM: MIG devices get busy time, per-pod utilization, allocated-but-idle
and idle GPU-seconds; a GPU busy by NVML but with idle SMs counts low-activity seconds; each
GPU's energy is split between the pods on it. The real agent in-process on the fake node,
the kubelet and API server doubles, time moved by hand (tests/integration/test_attribution.py
has the pattern and the whole-GPU cases)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.kube_apiserver import KubeApiServer
from tests.doubles.kubelet_server import KubeletServer, container, devices
from tests.doubles.kubelet_server import pod as kubelet_pod
from tests.integration.test_attribution import NODE, Node, wait_pods
from tests.support import InProcess, wait_for
from tests.support.promtext import Exposition

GIB = 2**30
MIG_GPU = 6  # dgx-h100-mig: 3g.40gb (GI 2) + 2g.20gb (GI 5) + 1g.10gb (GI 13, GI 14)
LOW = "gpuscope_workload_gpu_low_activity_seconds_total"
IDLE = "gpuscope_workload_gpu_idle_seconds_total"
ENERGY = "gpuscope_pod_gpu_energy_joules_total"


@pytest.fixture
def node(inprocess: Callable[..., InProcess], tmp_path: Path) -> Iterator[Callable[..., Node]]:
    """`node(profile, *agent_args)`: an agent with the gpu, kubelet and pods collectors, every
    GPU at 0 % utilization to start with."""
    with KubeletServer() as kubelet, KubeApiServer() as api:

        def start(profile: str, *args: str) -> Node:
            procfs = tmp_path / "proc"
            procfs.mkdir(exist_ok=True)

            def setup(fake: Any) -> None:
                for gpu in range(fake.gpu_count()):
                    fake.set_utilization(gpu, 0)

            env = inprocess(
                profile, "--collectors", "gpu,kubelet,pods",
                "--kubelet-socket", str(kubelet.socket_path),
                "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
                "--procfs", str(procfs), "--node-name", NODE, "--collection-max-age", "0",
                *args, setup=setup,
            )  # fmt: skip
            return Node(env=env, kubelet=kubelet, api=api, procfs=procfs)

        yield start


def mig_pod(n: Node, namespace: str, name: str, resource: str, mig_uuid: str) -> tuple[str, str]:
    """A pod whose container `main` holds one MIG device as `resource`; (pod uid, container id)."""
    uid, ids = n.add_pod(namespace, name, {"main": []})
    n.allocations[(namespace, name)] = kubelet_pod(
        namespace, name, container("main", devices(resource, mig_uuid))
    )
    n.kubelet.set_pods(*n.allocations.values())
    return uid, ids["main"]


def settle(n: Node, allocations: int) -> Exposition:
    """Scrape until the agent has seen every allocation (the kubelet is polled, the GPU
    sampler has had its first GPM window): where the counters' baselines start."""
    n.env.advance(2)
    found: list[Exposition] = []

    def seen() -> bool:
        found.append(n.scrape())
        return len(found[-1].series("gpuscope_gpu_allocation_info")) >= allocations

    wait_for(seen, what=f"{allocations} allocations")
    return found[-1]


def mig_process(n: Node, mig_uuid: str, pod_uid: str, cid: str) -> None:
    """A process of the pod's container running in the MIG device (cgroup as the kubelet's)."""
    pid = n.gpu_process(MIG_GPU, GIB, pod_uid=pod_uid, cid=cid)
    n.env.fake.add_process(MIG_GPU, pid, GIB, mig_uuid=mig_uuid)  # replaces it, in the device


def migs(n: Node) -> dict[int, str]:
    """GPU instance id -> MIG UUID on the MIG GPU."""
    return {d["gpu_instance_id"]: d["uuid"] for d in n.env.fake.mig_devices(MIG_GPU)}


def test_mig_devices_are_attributed_with_busy_idle_and_utilization_from_gpm(node) -> None:
    n = node("dgx-h100-mig")
    fake, by_gi = n.env.fake, migs(n)
    fake.set_utilization(MIG_GPU, 100)
    fake.set_gpm_activity(MIG_GPU, graphics=0.8, sm_active=0.6, mig_instance=13)  # serving
    for gi in (2, 5, 14):
        fake.set_gpm_activity(MIG_GPU, graphics=0.0, sm_active=0.0, mig_instance=gi)
    # The mixed strategy (nvidia.com/mig-3g.40gb) and the single one (MIG UUIDs as GPUs).
    mig_pod(n, "research", "notebook-3g", "nvidia.com/mig-3g.40gb", by_gi[2])
    suid, scid = mig_pod(n, "infer", "server-1g", "nvidia.com/gpu", by_gi[13])
    mig_process(n, by_gi[13], suid, scid)
    wait_pods(n, {"research/notebook-3g", "infer/server-1g"})
    start = settle(n, 2)  # the agent sees the allocations: the idle clocks start
    n.env.advance(300)
    m = n.scrape()

    info = {(k["mig_uuid"], k["pod"]) for k in (dict(x) for x in
            m.series("gpuscope_mig_allocation_info"))}  # fmt: skip
    assert info == {(by_gi[2], "notebook-3g"), (by_gi[13], "server-1g")}
    assert m.value("gpuscope_gpu_allocated", gpu=str(MIG_GPU)) == 1
    allocated = {k["mig_uuid"]: v for k, v in m.rows("gpuscope_mig_allocated", gpu="6")}
    assert allocated == {by_gi[2]: 1, by_gi[5]: 0, by_gi[13]: 1, by_gi[14]: 0}
    assert set(m.by_label("gpuscope_mig_allocated", "gpu")) == {"6", "7"}

    gauge = {k["mig_uuid"]: v for k, v in m.rows("gpuscope_mig_allocated_idle_seconds")}
    assert 300 - 2 <= gauge[by_gi[2]] <= 300 + 2  # holds 3 slices, runs nothing
    assert gauge[by_gi[13]] <= 2  # busy throughout
    assert gauge[by_gi[5]] == gauge[by_gi[14]] == 0  # not allocated

    busy = {k["mig_uuid"]: v for k, v in m.rows("gpuscope_mig_busy_seconds_total")}
    t0 = {k["mig_uuid"]: v for k, v in start.rows("gpuscope_mig_busy_seconds_total")}
    assert busy[by_gi[13]] - t0[by_gi[13]] == pytest.approx(0.8 * 300, abs=1.0)
    assert busy[by_gi[2]] == 0

    # Idle GPU-seconds in GPU units: 300 s x 3/7 of the GPU for the notebook, none for the
    # server. The whole GPU has no NVML utilization on MIG, so it adds nothing itself.
    def idle(x: Exposition, workload: str) -> float:
        return sum(x.series(IDLE, workload=workload).values())

    assert idle(m, "notebook-3g") - idle(start, "notebook-3g") == pytest.approx(
        300 * 3 / 7, abs=1.0
    )
    assert idle(m, "server-1g") == 0
    ((labels, util),) = m.rows("gpuscope_pod_gpu_utilization_ratio")
    assert (labels["pod"], util) == ("server-1g", pytest.approx(0.8))
    assert m.get("gpuscope_gpu_allocated_idle_seconds", gpu=str(MIG_GPU)) is None


def test_a_mig_device_that_wakes_up_restarts_its_idle_gauge(node) -> None:
    n = node("dgx-h100-mig")
    fake, by_gi = n.env.fake, migs(n)
    fake.set_utilization(MIG_GPU, 100)
    fake.set_gpm_activity(MIG_GPU, graphics=0.0, mig_instance=5)
    mig_pod(n, "research", "nb-2g", "nvidia.com/mig-2g.20gb", by_gi[5])
    wait_pods(n, {"research/nb-2g"})
    settle(n, 1)
    n.env.advance(120)
    gauge = "gpuscope_mig_allocated_idle_seconds"
    assert n.scrape().value(gauge, mig_uuid=by_gi[5]) == pytest.approx(120, abs=2)
    fake.set_gpm_activity(MIG_GPU, graphics=0.5, mig_instance=5)  # works 60 s, idles 90 s
    n.env.advance(60)
    fake.set_gpm_activity(MIG_GPU, graphics=0.0, mig_instance=5)
    n.env.advance(90)
    assert n.scrape().value(gauge, mig_uuid=by_gi[5]) == pytest.approx(90, abs=2)
    n.env.advance(30)
    assert n.scrape().value(gauge, mig_uuid=by_gi[5]) == pytest.approx(120, abs=2)


def test_busy_gpu_with_idle_sms_counts_low_activity_seconds(node) -> None:
    n = node("dgx-h100")
    fake = n.env.fake
    u = n.uuid
    n.add_pod("ml-team", "spin-0", {"main": [u(0)]})  # one tiny kernel in a loop
    n.add_pod("ml-team", "train-0", {"main": [u(1)]})  # really working
    n.add_pod("ml-team", "idle-0", {"main": [u(2)]})  # no kernel at all: idle, not low
    n.add_pod("research", "shared-a", {"main": [f"{u(3)}::0"]})
    n.add_pod("research", "shared-b", {"main": [f"{u(3)}::1"]})
    for gpu, sm in ((0, 0.02), (1, 0.7), (3, 0.05)):
        fake.set_utilization(gpu, 100)
        fake.set_gpm_activity(gpu, sm_active=sm)
    wait_pods(n, {"ml-team/spin-0", "ml-team/train-0", "ml-team/idle-0",
                  "research/shared-a", "research/shared-b"})  # fmt: skip
    start = settle(n, 5)
    n.env.advance(240)
    m = n.scrape()

    def low(x: Exposition, workload: str) -> float:
        return x.value(LOW, workload=workload)

    assert low(m, "spin-0") - low(start, "spin-0") == pytest.approx(240, abs=2)
    assert low(m, "train-0") == 0
    assert low(m, "idle-0") == 0
    assert m.value(IDLE, workload="idle-0") - start.value(IDLE, workload="idle-0") > 230
    # A time-sliced GPU splits its low-activity time, as its idle time.
    for w in ("shared-a", "shared-b"):
        assert low(m, w) - low(start, w) == pytest.approx(120, abs=1)


def test_low_activity_thresholds_are_flags(node) -> None:
    n = node(
        "dgx-h100", "--low-activity-busy-threshold", "0.9", "--low-activity-sm-threshold", "0.5"
    )
    fake = n.env.fake
    n.add_pod("ml-team", "half-0", {"main": [n.uuid(0)]})
    n.add_pod("ml-team", "mid-0", {"main": [n.uuid(1)]})
    fake.set_utilization(0, 80)  # below the 0.9 busy threshold: not counted
    fake.set_gpm_activity(0, sm_active=0.01)
    fake.set_utilization(1, 100)
    fake.set_gpm_activity(1, sm_active=0.4)  # below the 0.5 SM threshold: counted
    wait_pods(n, {"ml-team/half-0", "ml-team/mid-0"})
    start = settle(n, 2)
    n.env.advance(100)
    m = n.scrape()
    assert m.value(LOW, workload="half-0") == 0
    assert m.value(LOW, workload="mid-0") - start.value(LOW, workload="mid-0") == pytest.approx(
        100, abs=2
    )


def test_gpus_without_gpm_have_no_low_activity_series(node) -> None:
    n = node("pcie-l40s")
    n.add_pod("ml-team", "spin-0", {"main": [n.uuid(0)]})
    n.env.fake.set_utilization(0, 100)
    wait_pods(n, {"ml-team/spin-0"})
    settle(n, 1)
    n.env.advance(60)
    m = n.scrape()
    assert m.series(LOW) == {}
    assert m.series(IDLE, workload="spin-0")  # the idle counter is there, as before


def energy(x: Exposition, gpu: int) -> dict[str, float]:
    return {k["pod"]: v for k, v in x.rows(ENERGY, gpu=str(gpu))}


def test_energy_is_split_whole_by_share_and_by_mig_slices(node) -> None:
    n = node("dgx-h100-mig")
    fake, u, by_gi = n.env.fake, n.uuid, migs(n)
    wuid, wids = n.add_pod("ml-team", "worker-0", {"main": [u(0)]})
    auid, aids = n.add_pod("research", "nb-a", {"lab": [f"{u(1)}::0"]})
    buid, bids = n.add_pod("research", "nb-b", {"lab": [f"{u(1)}::1"]})
    n.add_pod("research", "nb-c", {"lab": [f"{u(1)}::2"]})  # holds a share, runs nothing
    n.gpu_process(0, GIB, 90, pod_uid=wuid, cid=wids["main"])
    n.gpu_process(1, GIB, 20, pod_uid=auid, cid=aids["lab"])
    n.gpu_process(1, GIB, 60, pod_uid=buid, cid=bids["lab"])
    mig_pod(n, "infer", "srv-3g", "nvidia.com/mig-3g.40gb", by_gi[2])
    mig_pod(n, "infer", "srv-1g", "nvidia.com/mig-1g.10gb", by_gi[14])
    for gpu, watts in ((0, 500.0), (1, 350.0), (MIG_GPU, 420.0)):
        fake.set_power(gpu, watts)
    wait_pods(n, {"ml-team/worker-0", "research/nb-a", "research/nb-b", "research/nb-c",
                  "infer/srv-3g", "infer/srv-1g"})  # fmt: skip
    start = settle(n, 6)
    assert energy(start, 0) == {"worker-0": 0}  # counted from when the agent saw the pod
    n.env.advance(100)
    m = n.scrape()

    def gpu_joules(gpu: int) -> float:
        name = "gpuscope_gpu_energy_joules_total"
        return m.value(name, gpu=str(gpu)) - start.value(name, gpu=str(gpu))

    def pods(gpu: int) -> dict[str, float]:
        before = energy(start, gpu)
        return {pod: v - before[pod] for pod, v in energy(m, gpu).items()}

    assert gpu_joules(0) == pytest.approx(50_000, rel=0.01)
    assert pods(0) == {"worker-0": pytest.approx(gpu_joules(0))}  # exclusive: all of it
    # Time-sliced: by per-process SM utilization, 20:60; the share that ran nothing gets 0.
    assert pods(1) == pytest.approx(
        {"nb-a": gpu_joules(1) / 4, "nb-b": gpu_joules(1) * 3 / 4, "nb-c": 0.0}
    )
    # MIG: 3 and 1 of the GPU's 7 compute slices; the unheld 2g and 1g credit nobody.
    assert pods(MIG_GPU) == pytest.approx(
        {"srv-3g": gpu_joules(MIG_GPU) * 3 / 7, "srv-1g": gpu_joules(MIG_GPU) / 7}
    )
    ((labels, _),) = m.rows(ENERGY, pod="worker-0")
    assert (labels["pod_uid"], labels["workload"]) == (wuid, "worker-0")

    n.remove_pod("research", "nb-b")  # a pod that leaves keeps nothing
    wait_pods(n, {"ml-team/worker-0", "research/nb-a", "research/nb-c",
                  "infer/srv-3g", "infer/srv-1g"})  # fmt: skip
    assert "nb-b" not in energy(n.scrape(), 1)


def test_a_shared_gpu_nobody_runs_on_splits_its_energy_equally(node) -> None:
    n = node("dgx-h100")
    u = n.uuid
    n.add_pod("research", "nb-a", {"lab": [f"{u(2)}::0"]})
    n.add_pod("research", "nb-b", {"lab": [f"{u(2)}::1"]})
    n.env.fake.set_power(2, 120.0)
    wait_pods(n, {"research/nb-a", "research/nb-b"})
    start = settle(n, 2)
    n.env.advance(50)
    m = n.scrape()
    spent = {p: v - energy(start, 2)[p] for p, v in energy(m, 2).items()}
    assert spent == pytest.approx({"nb-a": 3000.0, "nb-b": 3000.0}, rel=0.01)


def test_a_mig_device_busy_with_idle_sms_counts_its_share_of_the_gpu(node) -> None:
    n = node("dgx-h100-mig")
    fake, by_gi = n.env.fake, migs(n)
    fake.set_utilization(MIG_GPU, 100)
    fake.set_gpm_activity(MIG_GPU, graphics=0.9, sm_active=0.02, mig_instance=2)  # spinning
    fake.set_gpm_activity(MIG_GPU, graphics=0.9, sm_active=0.6, mig_instance=5)  # working
    mig_pod(n, "ml-team", "spin-3g", "nvidia.com/mig-3g.40gb", by_gi[2])
    mig_pod(n, "ml-team", "work-2g", "nvidia.com/mig-2g.20gb", by_gi[5])
    wait_pods(n, {"ml-team/spin-3g", "ml-team/work-2g"})
    start = settle(n, 2)
    n.env.advance(140)
    m = n.scrape()
    spun = m.value(LOW, workload="spin-3g") - start.value(LOW, workload="spin-3g")
    assert spun == pytest.approx(140 * 3 / 7, abs=1)  # GPU-seconds: 3 of the 7 slices
    assert m.value(LOW, workload="work-2g") == 0

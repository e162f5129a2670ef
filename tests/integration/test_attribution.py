"""Attribution in-process: the real agent on a fake 8-GPU node, the kubelet PodResources
double over gRPC, the Kubernetes API double through lightkube, GPU processes mapped to pods
through a fixture /proc (--procfs), time moved by hand."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuscope.agent.bounded import bounded
from gpuscope.agent.k8s.pods_source import PodsSource
from tests.doubles.kube_apiserver import KubeApiServer, owner_reference
from tests.doubles.kube_apiserver import pod as pod_manifest
from tests.doubles.kubelet_server import KubeletServer, container, devices
from tests.doubles.kubelet_server import pod as kubelet_pod
from tests.support import InProcess, wait_for
from tests.support.promtext import Exposition

NODE = "gpu-node-1"
GIB = 2**30
SAMPLE = 1 / 6  # seconds covered by one NVML utilization sample on the fake H100
SCRAPE_STEP = 0.001  # seconds between two scrapes with no time moved in between


@dataclass
class Node:
    """The cluster around one in-process agent: kubelet, API server, /proc fixture."""

    env: InProcess
    kubelet: KubeletServer
    api: KubeApiServer
    procfs: Path
    allocations: dict[tuple[str, str], Any] = field(default_factory=dict)
    next_pid: int = 4000

    def uuid(self, gpu: int) -> str:
        return self.env.fake.gpu_uuid(gpu)

    def add_pod(
        self,
        namespace: str,
        name: str,
        containers: dict[str, list[str]],
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        owners: tuple[dict[str, Any], ...] = (),
    ) -> tuple[str, dict[str, str]]:
        """A running pod: in the API (with container ids), in the kubelet (device ids)."""
        uid = str(uuid.uuid4())
        ids = {c: uuid.uuid4().hex + uuid.uuid4().hex for c in containers}
        obj = pod_manifest(
            namespace, name, NODE, uid=uid, labels=labels, annotations=annotations,
            owner_references=owners,
            containers=[{"name": c, "image": "trainer"} for c in containers],
        )  # fmt: skip
        obj["status"]["containerStatuses"] = [
            {
                "name": c,
                "containerID": f"containerd://{ids[c]}",
                "ready": True,
                "image": "trainer",
                "imageID": "sha256:" + "0" * 64,
                "restartCount": 0,
            }
            for c in ids
        ]
        self.api.create(obj)
        self.allocations[(namespace, name)] = kubelet_pod(
            namespace,
            name,
            *(
                container(c, devices("nvidia.com/gpu", *device_ids)) if device_ids else container(c)
                for c, device_ids in containers.items()
            ),
        )
        self.kubelet.set_pods(*self.allocations.values())
        return uid, ids

    def remove_pod(self, namespace: str, name: str) -> None:
        self.api.delete_pod(namespace, name)
        self.allocations.pop((namespace, name), None)
        self.kubelet.set_pods(*self.allocations.values())

    def gpu_process(
        self, gpu: int, memory: int, sm: float = 0, *, pod_uid: str = "", cid: str = ""
    ) -> int:
        """A GPU process whose /proc/<pid>/cgroup puts it in the pod's container (or the host)."""
        pid = self.next_pid
        self.next_pid += 1
        if pod_uid:
            path = (
                "/kubepods.slice/kubepods-burstable.slice/"
                f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/"
                f"cri-containerd-{cid}.scope"
            )
        else:
            path = "/system.slice/sshd.service"
        (self.procfs / str(pid)).mkdir(parents=True)
        (self.procfs / str(pid) / "cgroup").write_text(f"0::{path}\n")
        self.env.fake.add_process(gpu, pid, memory, sm_util=sm)
        return pid

    def scrape(self) -> Exposition:
        return Exposition(self.scrape_text())

    def scrape_text(self) -> str:
        """A scrape at a moment of its own: the agent reuses a collection for scrapes at the
        same instant, and time here moves only by hand."""
        self.env.clock.advance(SCRAPE_STEP)
        return self.env.scrape_text()


@pytest.fixture
def node(inprocess: Callable[..., InProcess], tmp_path: Path) -> Iterator[Callable[..., Node]]:
    made: list[Node] = []
    with KubeletServer() as kubelet, KubeApiServer() as api:

        def start(*args: str, setup: Callable[[Node], None] | None = None) -> Node:
            procfs = tmp_path / "proc"
            procfs.mkdir(exist_ok=True)
            kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
            holder: list[Node] = []

            def fake_setup(fake: Any) -> None:
                for gpu in range(8):
                    fake.set_utilization(gpu, 0)

            env_args = [
                "--collectors", "gpu,kubelet,pods", "--kubelet-socket", str(kubelet.socket_path),
                "--kubeconfig", str(kubeconfig), "--procfs", str(procfs), "--node-name", NODE,
                "--collection-max-age", "0", *args,
            ]  # fmt: skip
            if setup is not None:
                # Pods that exist before the agent starts: created on a stand-in handle.
                pre = Node(env=None, kubelet=kubelet, api=api, procfs=procfs)  # type: ignore[arg-type]
                setup(pre)
                holder.append(pre)
            env = inprocess("dgx-h100", *env_args, setup=fake_setup)
            n = Node(env=env, kubelet=kubelet, api=api, procfs=procfs)
            if holder:
                n.allocations = holder[0].allocations
                n.next_pid = holder[0].next_pid
            made.append(n)
            return n

        yield start
        for n in made:
            n.env.agent.stop()


def pods_source(n: Node) -> PodsSource:
    source = n.env.agent.source("pods")
    assert isinstance(source, PodsSource)
    return source


def wait_pods(n: Node, expected: set[str]) -> None:
    def names() -> set[str]:
        return {f"{p.namespace}/{p.name}" for p in pods_source(n).watcher.pods().values()}

    wait_for(lambda: names() == expected, what=f"pods {expected}")


PYTORCH_OWNER = owner_reference("PyTorchJob", "llama-ft", api_version="kubeflow.org/v1")
KUBEFLOW = {
    "training.kubeflow.org/job-name": "llama-ft",
    "training.kubeflow.org/replica-type": "worker",
    "training.kubeflow.org/replica-index": "0",
}


def training_node(n: Node) -> dict[str, tuple[str, dict[str, str]]]:
    """A 4-GPU PyTorchJob worker, a 2-GPU batch Job, two pods sharing GPU 6 time-sliced."""
    u = n.uuid
    return {
        "worker": n.add_pod(
            "ml-team", "llama-ft-worker-0", {"pytorch": [u(0), u(1), u(2), u(3)]},
            labels=KUBEFLOW, owners=(PYTORCH_OWNER,),
        ),
        "eval": n.add_pod(
            "eval", "eval-nightly-x7k2p", {"eval": [u(4), u(5)]},
            labels={"batch.kubernetes.io/job-name": "eval-nightly", "job-name": "eval-nightly"},
            owners=(owner_reference("Job", "eval-nightly"),),
        ),
        "nb-a": n.add_pod(
            "research", "notebook-a-5d9f-abcde", {"lab": [f"{u(6)}::0"]},
            labels={"pod-template-hash": "5d9f"},
            owners=(owner_reference("ReplicaSet", "notebook-a-5d9f", api_version="apps/v1"),),
        ),
        "nb-b": n.add_pod(
            "research", "notebook-b-77c4-fghij", {"lab": [f"{u(6)}::1"]},
            labels={"pod-template-hash": "77c4"},
            owners=(owner_reference("ReplicaSet", "notebook-b-77c4", api_version="apps/v1"),),
        ),
    }  # fmt: skip


def test_every_allocation_names_its_pod_container_and_workload(node) -> None:
    n = node()
    training_node(n)
    wait_pods(n, {"ml-team/llama-ft-worker-0", "eval/eval-nightly-x7k2p",
                  "research/notebook-a-5d9f-abcde", "research/notebook-b-77c4-fghij"})  # fmt: skip
    m = n.scrape()
    info = m.series("gpuscope_gpu_allocation_info")
    assert len(info) == 8  # 4 + 2 + two holders of the shared GPU 6
    rows = {
        (d["gpu"], d["pod"], d["container"], d["workload_kind"], d["workload"])
        for d in (dict(k) for k in info)
    }
    assert {r for r in rows if r[1] == "llama-ft-worker-0"} == {
        (str(g), "llama-ft-worker-0", "pytorch", "PyTorchJob", "llama-ft") for g in range(4)
    }
    assert {r for r in rows if r[0] in ("4", "5")} == {
        (g, "eval-nightly-x7k2p", "eval", "Job", "eval-nightly") for g in ("4", "5")
    }
    assert {r for r in rows if r[0] == "6"} == {
        ("6", "notebook-a-5d9f-abcde", "lab", "Deployment", "notebook-a"),
        ("6", "notebook-b-77c4-fghij", "lab", "Deployment", "notebook-b"),
    }
    allocated = {k["gpu"]: v for k, v in m.rows("gpuscope_gpu_allocated")}
    assert allocated == {str(g): (0.0 if g == 7 else 1.0) for g in range(8)}
    assert m.value("gpuscope_collector_success", collector="kubelet") == 1
    assert m.value("gpuscope_collector_success", collector="pods") == 1
    pod_info = {dict(k)["pod"]: dict(k) for k in m.series("gpuscope_pod_info")}
    assert pod_info["llama-ft-worker-0"]["replica"] == "worker-0"
    assert pod_info["eval-nightly-x7k2p"]["workload_kind"] == "Job"
    assert len(pod_info) == 4


def test_gpu_processes_are_split_by_pod_and_time_sliced_gpus_by_share(node) -> None:
    n = node()
    pods = training_node(n)
    wuid, wids = pods["worker"]
    auid, aids = pods["nb-a"]
    buid, bids = pods["nb-b"]
    for gpu in range(4):
        n.gpu_process(gpu, (60 + gpu) * GIB, 90, pod_uid=wuid, cid=wids["pytorch"])
    n.gpu_process(6, 5 * GIB, 30, pod_uid=auid, cid=aids["lab"])
    n.gpu_process(6, 7 * GIB, 45, pod_uid=buid, cid=bids["lab"])
    n.gpu_process(6, 1 * GIB, 20, pod_uid=buid, cid=bids["lab"])  # a second process, same pod
    wait_pods(n, {"ml-team/llama-ft-worker-0", "eval/eval-nightly-x7k2p",
                  "research/notebook-a-5d9f-abcde", "research/notebook-b-77c4-fghij"})  # fmt: skip
    n.env.advance(3)
    m = n.scrape()
    mem = m.rows("gpuscope_pod_gpu_memory_bytes")
    util = m.rows("gpuscope_pod_gpu_utilization_ratio")
    worker = {k["gpu"]: v for k, v in mem if k["pod"] == "llama-ft-worker-0"}
    assert worker == {str(g): float((60 + g) * GIB) for g in range(4)}
    shared = {k["pod"]: v for k, v in mem if k["gpu"] == "6"}
    assert shared == {"notebook-a-5d9f-abcde": 5.0 * GIB, "notebook-b-77c4-fghij": 8.0 * GIB}
    shared_util = {k["pod"]: v for k, v in util if k["gpu"] == "6"}
    assert shared_util == pytest.approx(
        {"notebook-a-5d9f-abcde": 0.30, "notebook-b-77c4-fghij": 0.65}
    )
    labels = next(k for k, _ in mem if k["pod"] == "llama-ft-worker-0")
    assert (labels["namespace"], labels["container"], labels["workload_kind"],
            labels["workload"], labels["pod_uid"]) == (
        "ml-team", "pytorch", "PyTorchJob", "llama-ft", wuid)  # fmt: skip
    assert all(v == 0 for _, v in m.rows("gpuscope_gpu_unallocated_memory_bytes"))


def test_rogue_and_host_processes_show_as_unallocated_memory(node) -> None:
    n = node()
    pods = training_node(n)
    euid, eids = pods["eval"]
    n.gpu_process(4, 3 * GIB, 50, pod_uid=euid, cid=eids["eval"])  # its own GPU: fine
    n.gpu_process(7, 9 * GIB, 50, pod_uid=euid, cid=eids["eval"])  # GPU 7: never given
    n.gpu_process(0, 2 * GIB, 0)  # a host process on the worker's GPU
    wait_pods(n, {"ml-team/llama-ft-worker-0", "eval/eval-nightly-x7k2p",
                  "research/notebook-a-5d9f-abcde", "research/notebook-b-77c4-fghij"})  # fmt: skip
    m = n.scrape()
    unallocated = {k["gpu"]: v for k, v in
                   m.rows("gpuscope_gpu_unallocated_memory_bytes")}  # fmt: skip
    assert unallocated == {g: 0.0 for g in map(str, range(8))} | {"7": 9.0 * GIB, "0": 2.0 * GIB}
    host = m.rows("gpuscope_pod_gpu_memory_bytes", pod="")
    assert [(k["gpu"], k["pod_uid"], v) for k, v in host] == [("0", "", 2.0 * GIB)]


def test_idle_allocated_gpu_counts_exact_idle_seconds_and_activity_resets_it(node) -> None:
    n = node()
    training_node(n)
    wait_pods(n, {"ml-team/llama-ft-worker-0", "eval/eval-nightly-x7k2p",
                  "research/notebook-a-5d9f-abcde", "research/notebook-b-77c4-fghij"})  # fmt: skip
    n.scrape()  # the agent sees the allocations now: the idle clocks start
    idle_total = "gpuscope_workload_gpu_idle_seconds_total"

    def total(m: Exposition, workload: str) -> float:
        return sum(m.series(idle_total, workload=workload).values())

    start = n.scrape()
    n.env.advance(7 * 60)
    m = n.scrape()
    gauge = {k["gpu"]: v for k, v in m.rows("gpuscope_gpu_allocated_idle_seconds")}
    for gpu in map(str, range(7)):
        assert 7 * 60 - 1 <= gauge[gpu] <= 7 * 60 + 1, (gpu, gauge[gpu])
    assert gauge["7"] == 0  # not allocated
    # Four idle GPUs for 7 minutes: 1680 GPU-seconds for the PyTorchJob, to within one NVML
    # utilization sample (1/6 s) per GPU: the counter integrates the samples themselves.
    assert total(m, "llama-ft") - total(start, "llama-ft") == pytest.approx(4 * 420, abs=4 * SAMPLE)
    assert total(m, "eval-nightly") - total(start, "eval-nightly") == pytest.approx(
        2 * 420, abs=2 * SAMPLE
    )
    # GPU 6 is shared by two workloads: its idle time is split, not doubled.
    shared = total(m, "notebook-a") + total(m, "notebook-b")
    shared_before = total(start, "notebook-a") + total(start, "notebook-b")
    assert shared - shared_before == pytest.approx(420, abs=SAMPLE)

    # GPU 0 works for 2 minutes, then idles 3: the gauge restarts, the counter counts only
    # idle seconds (3 minutes for GPU 0, 5 for GPUs 1-3).
    n.env.fake.set_utilization(0, 80)
    n.env.advance(2 * 60)
    n.env.fake.set_utilization(0, 0)
    n.env.advance(3 * 60)
    after = n.scrape()
    gauge = {k["gpu"]: v for k, v in after.rows(
        "gpuscope_gpu_allocated_idle_seconds")}  # fmt: skip
    assert 3 * 60 - 1 <= gauge["0"] <= 3 * 60 + 1
    assert 12 * 60 - 1 <= gauge["1"] <= 12 * 60 + 1
    assert total(after, "llama-ft") - total(m, "llama-ft") == pytest.approx(
        3 * 60 + 3 * 5 * 60, abs=4 * SAMPLE
    )
    ns = {k["namespace"] for k, _ in after.rows(idle_total)}
    assert ns == {"ml-team", "eval", "research"}


def test_kubelet_down_keeps_device_series_and_recovers_on_next_poll(node) -> None:
    n = node()
    training_node(n)
    wait_pods(n, {"ml-team/llama-ft-worker-0", "eval/eval-nightly-x7k2p",
                  "research/notebook-a-5d9f-abcde", "research/notebook-b-77c4-fghij"})  # fmt: skip
    before = n.scrape()
    assert len(before.series("gpuscope_gpu_allocation_info")) == 8
    n.kubelet.stop()
    down = n.scrape()
    assert down.value("gpuscope_collector_success", collector="kubelet") == 0
    assert down.series("gpuscope_gpu_allocation_info") == {}
    assert down.series("gpuscope_gpu_allocated") == {}
    assert len(down.series("gpuscope_gpu_up")) == 8
    assert len(down.series("gpuscope_gpu_busy_seconds_total")) == 8
    n.kubelet.start()
    up = n.scrape()
    assert up.value("gpuscope_collector_success", collector="kubelet") == 1
    assert len(up.series("gpuscope_gpu_allocation_info")) == 8


def test_api_server_down_keeps_last_names_and_new_pods_are_named_when_back(node) -> None:
    n = node()
    pods = training_node(n)
    wuid, wids = pods["worker"]
    n.gpu_process(0, 10 * GIB, 50, pod_uid=wuid, cid=wids["pytorch"])
    wait_pods(n, {"ml-team/llama-ft-worker-0", "eval/eval-nightly-x7k2p",
                  "research/notebook-a-5d9f-abcde", "research/notebook-b-77c4-fghij"})  # fmt: skip
    n.api.stop()
    wait_for(lambda: pods_source(n).watcher.error is not None, what="API outage noticed")
    m = n.scrape()
    assert m.value("gpuscope_collector_success", collector="pods") == 0
    ((labels, _),) = m.rows("gpuscope_pod_gpu_memory_bytes")
    assert (labels["pod"], labels["workload"]) == ("llama-ft-worker-0", "llama-ft")
    assert len(m.series("gpuscope_gpu_allocation_info", workload="llama-ft")) == 4

    n.api.start()
    late_uid, late_ids = n.add_pod("ml-team", "late-pod", {"main": [n.uuid(7)]})
    n.gpu_process(7, GIB, 10, pod_uid=late_uid, cid=late_ids["main"])
    wait_pods(n, {"ml-team/llama-ft-worker-0", "eval/eval-nightly-x7k2p", "ml-team/late-pod",
                  "research/notebook-a-5d9f-abcde", "research/notebook-b-77c4-fghij"})  # fmt: skip
    m = n.scrape()
    assert m.value("gpuscope_collector_success", collector="pods") == 1
    late = m.rows("gpuscope_pod_gpu_memory_bytes", gpu="7")
    assert [(k["pod"], k["container"], k["workload_kind"]) for k, _ in late] == [
        ("late-pod", "main", "Pod")
    ]


def test_deleted_pod_series_disappear_after_the_next_poll(node) -> None:
    n = node()
    pods = training_node(n)
    euid, eids = pods["eval"]
    pid = n.gpu_process(4, 3 * GIB, 50, pod_uid=euid, cid=eids["eval"])
    wait_pods(n, {"ml-team/llama-ft-worker-0", "eval/eval-nightly-x7k2p",
                  "research/notebook-a-5d9f-abcde", "research/notebook-b-77c4-fghij"})  # fmt: skip
    assert n.scrape().series("gpuscope_pod_info", pod="eval-nightly-x7k2p")
    n.remove_pod("eval", "eval-nightly-x7k2p")
    n.env.fake.remove_process(4, pid)
    wait_pods(n, {"ml-team/llama-ft-worker-0", "research/notebook-a-5d9f-abcde",
                  "research/notebook-b-77c4-fghij"})  # fmt: skip
    m = n.scrape()
    text = n.scrape_text()
    assert "eval-nightly" not in text.replace('workload="eval-nightly"', "")
    assert m.series("gpuscope_pod_info", pod="eval-nightly-x7k2p") == {}
    assert m.series("gpuscope_gpu_allocation_info", gpu="4") == {}
    assert m.value("gpuscope_gpu_allocated", gpu="4") == 0
    # The workload's idle counter stays (for increase()) until --workload-prune-grace runs
    # out (300 s by default), and then goes with its causes; the others stay.
    assert m.series("gpuscope_workload_gpu_idle_seconds_total", workload="eval-nightly")
    n.env.advance(290, step=10)
    assert n.scrape().series("gpuscope_workload_gpu_idle_seconds_total", workload="eval-nightly")
    n.env.advance(20, step=10)
    gone = n.scrape()
    for family in ("gpuscope_workload_gpu_idle_seconds_total",
                   "gpuscope_workload_gpu_idle_cause_seconds_total"):  # fmt: skip
        assert gone.series(family, workload="eval-nightly") == {}
        assert gone.series(family, workload="llama-ft")


HOSTILE = 'job "quoted" \\ back\nslash ünïcødé ' + "x" * 300


def test_hostile_metadata_is_escaped_and_round_trips(node) -> None:
    n = node()
    long_name = "p" * 253
    uid, ids = n.add_pod(
        "ml-team", long_name, {'c"\n\\ü': [n.uuid(2)]},
        annotations={"volcano.sh/job-name": HOSTILE, "volcano.sh/task-spec": "w\"1\n"},
    )  # fmt: skip
    n.gpu_process(2, GIB, 10, pod_uid=uid, cid=ids['c"\n\\ü'])
    wait_pods(n, {f"ml-team/{long_name}"})
    text = n.scrape_text()
    m = Exposition(text)
    ((alloc, _),) = m.rows("gpuscope_gpu_allocation_info")
    # The workload comes from an annotation: bounded like every pod-metadata label value.
    assert (alloc["pod"], alloc["container"], alloc["workload"]) == (
        long_name, 'c"\n\\ü', bounded(HOSTILE))  # fmt: skip
    assert alloc["workload"].startswith('job "quoted" \\ back\nslash ünïcødé xx')
    ((info, _),) = m.rows("gpuscope_pod_info")
    assert (info["workload_kind"], info["replica"]) == ("VolcanoJob", 'w"1\n')
    assert m.rows("gpuscope_pod_gpu_memory_bytes")[0][0]["container"] == 'c"\n\\ü'
    promtool = shutil.which("promtool")
    assert promtool
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    assert b"error" not in check.stdout.lower() + check.stderr.lower(), check


def test_mig_processes_are_attributed_without_inventing_utilization(inprocess, tmp_path) -> None:
    """On a MIG GPU NVML lists processes per instance but reports no per-process utilization:
    memory is attributed, utilization is absent (never 0), and nothing needs the kubelet."""
    procfs = tmp_path / "proc"
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex * 2
    cgroup = (
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"
    )
    (procfs / "4242").mkdir(parents=True)
    (procfs / "4242" / "cgroup").write_text(cgroup)

    def setup(fake: Any) -> None:
        gpu = next(g for g in range(fake.gpu_count()) if fake.mig_devices(g))
        mig = fake.mig_devices(gpu)[0]["uuid"]
        fake.add_process(gpu, 4242, 3 * GIB, sm_util=50, mig_uuid=mig)

    env = inprocess("hgx-a100-mig", "--procfs", str(procfs), setup=setup)
    m = env.scrape()
    ((labels, value),) = m.rows("gpuscope_pod_gpu_memory_bytes")
    assert (labels["pod_uid"], labels["pod"], value) == (uid, "", 3.0 * GIB)
    assert m.rows("gpuscope_pod_gpu_utilization_ratio") == []
    assert m.rows("gpuscope_gpu_allocation_info") == []  # no kubelet collector: no claims

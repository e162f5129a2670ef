"""Which workload a pod belongs to: framework labels first, then controller owners."""

from __future__ import annotations

from typing import Any

import pytest

from gpuscope.agent.bounded import PROMETHEUS_LABEL_MAX
from gpuscope.agent.k8s.workloads import Workload, resolve


def pod(
    name: str = "p-0",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {},
                         "ownerReferences": owners or []}}  # fmt: skip


def owner(kind: str, name: str, api: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "controller": True, "uid": "u"}


CASES = [
    ("jobset", pod("llm-trainer-0-3-x", {
        "jobset.sigs.k8s.io/jobset-name": "llm", "jobset.sigs.k8s.io/replicatedjob-name":
        "trainer", "jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-name":
        "llm-trainer-0"}, {"batch.kubernetes.io/job-completion-index": "3"},
        [owner("Job", "llm-trainer-0", "batch/v1")]),
     Workload("JobSet", "llm", "trainer-0-3")),
    ("pytorchjob", pod("bert-worker-2", {
        "training.kubeflow.org/job-name": "bert", "training.kubeflow.org/replica-type":
        "Worker", "training.kubeflow.org/replica-index": "2"}, None,
        [owner("PyTorchJob", "bert", "kubeflow.org/v1")]),
     Workload("PyTorchJob", "bert", "worker-2")),
    ("kubeflow without owner", pod("x", {"training.kubeflow.org/job-name": "mpi"}),
     Workload("TrainingJob", "mpi", "")),
    ("volcano", pod("vj-worker-1", {"volcano.sh/job-name": "vj"},
        {"volcano.sh/task-spec": "worker", "volcano.sh/task-index": "1"},
        [owner("Job", "vj", "batch.volcano.sh/v1alpha1")]),
     Workload("VolcanoJob", "vj", "worker-1")),
    ("leaderworkerset", pod("lws-1-2", {"leaderworkerset.sigs.k8s.io/name": "vllm",
        "leaderworkerset.sigs.k8s.io/group-index": "1",
        "leaderworkerset.sigs.k8s.io/worker-index": "2"}),
     Workload("LeaderWorkerSet", "vllm", "1-2")),
    ("ray", pod("rc-worker-x", {"ray.io/cluster": "rc", "ray.io/node-type": "worker"}),
     Workload("RayCluster", "rc", "worker")),
    ("indexed job", pod("j-3-x", {"batch.kubernetes.io/job-name": "j"},
        {"batch.kubernetes.io/job-completion-index": "3"}, [owner("Job", "j", "batch/v1")]),
     Workload("Job", "j", "3")),
    ("old job label", pod("j-x", {"job-name": "j"}), Workload("Job", "j", "")),
    ("deployment", pod("web-7d9f8-abcde", {"pod-template-hash": "7d9f8"}, None,
        [owner("ReplicaSet", "web-7d9f8")]), Workload("Deployment", "web", "")),
    ("bare replicaset", pod("rs-x", {}, None, [owner("ReplicaSet", "rs")]),
     Workload("ReplicaSet", "rs", "")),
    ("statefulset", pod("db-2", {}, None, [owner("StatefulSet", "db")]),
     Workload("StatefulSet", "db", "2")),
    ("daemonset", pod("ds-x", {}, None, [owner("DaemonSet", "gpuscope")]),
     Workload("DaemonSet", "gpuscope", "")),
    ("bare pod", pod("notebook"), Workload("Pod", "notebook", "")),
    ("no metadata", {}, Workload("Pod", "", "")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pod_json", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_resolve(pod_json: dict[str, Any], expected: Workload) -> None:
    assert resolve(pod_json) == expected


def test_order_is_configurable() -> None:
    both = pod("x", {"jobset.sigs.k8s.io/jobset-name": "js", "batch.kubernetes.io/job-name": "j"})
    assert resolve(both).kind == "JobSet"
    assert resolve(both, order=("job", "jobset")).kind == "Job"


def test_a_huge_annotation_becomes_a_bounded_readable_workload_name() -> None:
    # Seen in the wild: a 200 KB volcano.sh/job-name annotation, copied onto every series.
    huge = "llama-pretrain-" + "x" * 200_000
    other = "llama-pretrain-" + "x" * 199_999 + "y"
    found = resolve(pod("w-0", annotations={"volcano.sh/job-name": huge,
                                             "volcano.sh/task-spec": "t" * 5000}))  # fmt: skip
    assert found.kind == "VolcanoJob"
    assert len(found.name) == PROMETHEUS_LABEL_MAX and found.name.startswith("llama-pretrain-x")
    assert len(found.replica) <= PROMETHEUS_LABEL_MAX
    again = resolve(pod("w-1", annotations={"volcano.sh/job-name": huge}))
    assert again.name == found.name  # the same job gives the same label on every pod
    assert resolve(pod("w-2", annotations={"volcano.sh/job-name": other})).name != found.name


def test_names_within_the_bound_are_untouched() -> None:
    name = "n" * PROMETHEUS_LABEL_MAX
    assert resolve(pod("p", {"jobset.sigs.k8s.io/jobset-name": name})).name == name
    owner_name = "d" * 300  # owner names may be 253 characters, pod names too
    found = resolve(pod("p", {}, None, [owner("StatefulSet", owner_name)]))
    assert len(found.name) == PROMETHEUS_LABEL_MAX

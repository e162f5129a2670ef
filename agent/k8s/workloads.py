"""Which workload a pod belongs to, from its labels and owner references.

Training jobs are rarely owned directly by the object users think of: a JobSet owns Jobs
that own pods, a PyTorchJob owns pods through the training operator, a Deployment owns
ReplicaSets. The framework labels name the workload a user recognises, so they are checked
first, in a configurable order; controller owner references come after; a bare pod is its
own workload. Pure: table-tested on literal pod metadata.

Every field of a `Workload` becomes a Prometheus label value, and annotations are free text
of any length (a 200 KB `volcano.sh/job-name` was seen), so each is bounded here, where the
record is made, to `PROMETHEUS_LABEL_MAX` characters: a readable prefix and a hash of the
whole (`agent/bounded.py`). Every consumer sees the same bounded value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuscope.agent.bounded import bounded

DEFAULT_ORDER = ("jobset", "kubeflow", "volcano", "lws", "ray", "job", "owner")


@dataclass(frozen=True, slots=True)
class Workload:
    """The workload a pod belongs to, as its users name it. Each field becomes a label value, so
    each is bounded where the record is made (the module docstring)."""

    kind: str  # JobSet, PyTorchJob, VolcanoJob, LeaderWorkerSet, RayCluster, Job, Deployment…
    name: str
    replica: str = ""  # the pod's place in it: "worker-3", "trainer-0-1", "2"…


def _get(labels: Mapping[str, str], *keys: str) -> str:
    for key in keys:
        value = labels.get(key)
        if value:
            return value
    return ""


def _owner(refs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for ref in refs:
        if ref.get("controller"):
            return ref
    return refs[0] if refs else None


def _jobset(
    labels: Mapping[str, str], annotations: Mapping[str, str], refs: Any
) -> Workload | None:
    name = labels.get("jobset.sigs.k8s.io/jobset-name")
    if not name:
        return None
    job = labels.get("jobset.sigs.k8s.io/replicatedjob-name", "")
    index = labels.get("jobset.sigs.k8s.io/job-index", "")
    completion = _get(annotations, "batch.kubernetes.io/job-completion-index") or _get(
        labels, "batch.kubernetes.io/job-completion-index"
    )
    replica = "-".join(p for p in (job, index, completion) if p)
    return Workload("JobSet", name, replica)


def _kubeflow(labels: Mapping[str, str], _a: Mapping[str, str], refs: Any) -> Workload | None:
    name = labels.get("training.kubeflow.org/job-name")
    if not name:
        return None
    owner = _owner(refs)
    kind = "TrainingJob"
    if owner and str(owner.get("apiVersion", "")).startswith("kubeflow.org/"):
        kind = str(owner.get("kind") or kind)
    rtype = labels.get("training.kubeflow.org/replica-type", "").lower()
    index = labels.get("training.kubeflow.org/replica-index", "")
    return Workload(kind, name, "-".join(p for p in (rtype, index) if p))


def _volcano(labels: Mapping[str, str], annotations: Mapping[str, str], _r: Any) -> Workload | None:
    name = _get(labels, "volcano.sh/job-name") or _get(annotations, "volcano.sh/job-name")
    if not name:
        return None
    task = _get(labels, "volcano.sh/task-spec") or _get(annotations, "volcano.sh/task-spec")
    index = _get(labels, "volcano.sh/task-index") or _get(annotations, "volcano.sh/task-index")
    return Workload("VolcanoJob", name, "-".join(p for p in (task, index) if p))


def _lws(labels: Mapping[str, str], _a: Mapping[str, str], _r: Any) -> Workload | None:
    name = labels.get("leaderworkerset.sigs.k8s.io/name")
    if not name:
        return None
    group = labels.get("leaderworkerset.sigs.k8s.io/group-index", "")
    worker = labels.get("leaderworkerset.sigs.k8s.io/worker-index", "")
    return Workload("LeaderWorkerSet", name, "-".join(p for p in (group, worker) if p))


def _ray(labels: Mapping[str, str], _a: Mapping[str, str], _r: Any) -> Workload | None:
    name = labels.get("ray.io/cluster")
    if not name:
        return None
    return Workload("RayCluster", name, labels.get("ray.io/node-type", ""))


def _job(labels: Mapping[str, str], annotations: Mapping[str, str], _r: Any) -> Workload | None:
    name = _get(labels, "batch.kubernetes.io/job-name", "job-name")
    if not name:
        return None
    index = _get(annotations, "batch.kubernetes.io/job-completion-index") or _get(
        labels, "batch.kubernetes.io/job-completion-index"
    )
    return Workload("Job", name, index)


_STATEFUL_ORDINAL = re.compile(r"-(\d+)$")


def _owners(labels: Mapping[str, str], _a: Mapping[str, str], refs: Any) -> Workload | None:
    owner = _owner(refs)
    if owner is None:
        return None
    kind, name = str(owner.get("kind", "")), str(owner.get("name", ""))
    if kind == "ReplicaSet":
        pod_hash = labels.get("pod-template-hash", "")
        if pod_hash and name.endswith(f"-{pod_hash}"):
            return Workload("Deployment", name[: -len(pod_hash) - 1])
        return Workload("ReplicaSet", name)
    return Workload(kind, name) if kind and name else None


RESOLVERS = {
    "jobset": _jobset,
    "kubeflow": _kubeflow,
    "volcano": _volcano,
    "lws": _lws,
    "ray": _ray,
    "job": _job,
    "owner": _owners,
}


def resolve(pod: Mapping[str, Any], order: Sequence[str] = DEFAULT_ORDER) -> Workload:
    """The workload of a pod given as Kubernetes JSON (metadata is all that is read), each
    field bounded to a label value's length."""
    found = _resolve(pod, order)
    return Workload(bounded(found.kind), bounded(found.name), bounded(found.replica))


def _resolve(pod: Mapping[str, Any], order: Sequence[str]) -> Workload:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    refs = meta.get("ownerReferences") or []
    for key in order:
        found = RESOLVERS[key](labels, annotations, refs)
        if found is not None:
            if found.kind == "StatefulSet" and not found.replica:
                match = _STATEFUL_ORDINAL.search(str(meta.get("name", "")))
                if match:
                    found = Workload(found.kind, found.name, match.group(1))
            return found
    return Workload("Pod", str(meta.get("name", "")))

"""A stand-in Kubernetes API server: the real REST and watch protocol over plain HTTP, scripted.

Real client libraries (the official `kubernetes` client, `lightkube`) are pointed at it
unmodified, so the wire format, watch streaming, resource versions, selectors, pagination,
patch content types and error `Status` objects are exercised as they are against a real
apiserver. What a real apiserver does is followed where it matters to a client:

- One global, monotonically increasing resourceVersion (rendered as a string) stamps every
  write; a write that changes nothing (a no-op PUT or PATCH) gets no new version and no event.
- A watch from resourceVersion N streams the retained events after N. An N older than the
  retained history is answered, as real apiservers answer it, with HTTP 200 and a single
  `ERROR` event carrying a `Status` with code 410 and reason `Expired`. A watch with no
  resourceVersion (or "0") first replays the current objects as synthetic `ADDED` events.
- Under a label or field selector an object moving into the selection is `ADDED` and one
  moving out is `DELETED` (with its previous content and the new resourceVersion).
- `BOOKMARK` events (only when `allowWatchBookmarks=true`) carry just kind, apiVersion and
  `metadata.resourceVersion`: every `bookmark_interval` seconds (a real apiserver's watch
  cache sends one a minute), on `bookmark()`, and, as the watch cache does, once 2 s before
  a watch's `timeoutSeconds` runs out, so a client can resume from the freshest version.
- JSON patch failures are 422 `Invalid`; a resourceVersion mismatch on PUT or in a patch is 409
  `Conflict`; strategic merge patch on the custom resource is 415, as for any CRD.
- Writes to `pods`/`nodes` keep the stored `.status`; `/status` writes change only `.status`.

Fault injection: `fail_next`, `delay`, `expire_history`, `drop_watches` (connections cut
mid-stream, no terminating chunk), `freeze_watches` (connections kept open with nothing ever
sent again: no event, no bookmark, no end at `timeoutSeconds`, what a client sees behind a
half-open TCP connection or a wedged proxy; new requests are served as usual) and
`stop`/`start` on the same port. Every request is logged
in `requests` with its verb, so tests can assert "relisted once" or "patched only on change".
Handler crashes are answered 500 and kept in `errors`; a test should assert it stays empty.

Not modelled: server-side apply (415), protobuf/CBOR/Table output, aggregated discovery,
namespaces as objects (any namespace is accepted), LIST `resourceVersion`/`resourceVersionMatch`
beyond "0" ignoring `limit`, a watch from a future resourceVersion waiting for it, grace periods
and garbage collection on REST DELETE (a pod without finalizers goes at once; `delete_pod(...,
graceful=True)` scripts the kubelet-confirmed two-step), managedFields, strict field validation.

    with KubeApiServer() as api:
        api.add_node("n1", labels={"a": "b"})
        api.add_pod("default", "train-0", "n1", labels={"job": "x"})
        api.kubeconfig(tmp_path / "kubeconfig")  # or host=api.url, any bearer token

Dynamic Resource Allocation: ResourceClaims (namespaced, with a status subresource, no field
selector beyond name and namespace) and ResourceSlices (cluster-scoped, selected by
`spec.nodeName` and `spec.driver`), in the versions of `resource.k8s.io` the server is made
with (`dra_versions`, default `("v1",)`, as Kubernetes 1.34+ with the betas off; `("v1beta1",)`
is a 1.32 API server, `("v1beta2", "v1beta1")` a 1.33 one, `()` one without DRA). Only those
are routed (any other is a 404) and listed by discovery (`/apis`, `/apis/resource.k8s.io`,
the preferred version the newest). Objects are stored in one shape (v1's, as etcd keeps one
storage version) and converted on the way in and out, with the real differences: a v1beta1
slice device keeps its attributes, capacity and counters under `basic`, v1beta2 and v1 on
the device; a v1beta1 claim request has its fields (`deviceClassName`, `adminAccess`, ...)
on the request, v1beta2 and v1 under `exactly`; allocation results have one shape in all
three. The test-side `get`/`objects` answer the stored (v1) shape. `resource_slice`,
`dra_gpu`, `dra_mig` and `dra_dynamic_mig` build what NVIDIA's driver publishes,
`resource_claim` an allocated claim (`version=` for a beta's shape), `pod_claim` and
`claim_container` a pod's use of it:

        api.create(resource_slice("n1", [dra_gpu(0, "GPU-...")]))
        api.create(resource_claim("ml", "c", results=[("gpu", "n1", "gpu-0")],
                                  reserved_for=[("train-0", pod_uid)]))
"""

from __future__ import annotations

import base64
import contextlib
import copy
import itertools
import json
import re
import select
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

Obj = dict[str, Any]

NFD_GROUP = "nfd.k8s-sigs.io"
NFD_VERSION = "v1alpha1"
DRA_GROUP = "resource.k8s.io"
DRA_VERSION = "v1"  # GA in Kubernetes 1.34; the storage shape of DRA objects here
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # what a server may be made to serve, by priority
NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
SERVER_VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0",
    "gitCommit": "60a317eadfcb839692a68eab88b2096f4d708f4f",
    "gitTreeState": "clean",
    "buildDate": "2025-04-23T13:07:08Z",
    "goVersion": "go1.24.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}
ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


# --- resource types ---------------------------------------------------------------------------


def _path(obj: Mapping[str, Any], dotted: str) -> Any:
    value: Any = obj
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _field_text(value: Any) -> str:
    """A field's value as a field selector compares it: missing is "", booleans lowercase."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    field_labels: tuple[str, ...] = ("metadata.name", "metadata.namespace")
    short_names: tuple[str, ...] = ()
    builtin: bool = True  # list items omit kind/apiVersion; strategic merge patch is served
    status_subresource: bool = False
    generation: bool = False  # metadata.generation set on create, bumped on spec changes
    returns_deleted_object: bool = False  # DELETE answers the object, not a Status

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def group_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def patch_types(self) -> tuple[str, ...]:
        if self.builtin:
            return (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH)
        return (JSON_PATCH, MERGE_PATCH)

    def field_value(self, obj: Mapping[str, Any], label: str) -> str:
        return _field_text(_path(obj, label))


PODS = ResourceType(
    "",
    "v1",
    "pods",
    "pod",
    "Pod",
    namespaced=True,
    field_labels=(
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    short_names=("po",),
    status_subresource=True,
    generation=True,
    returns_deleted_object=True,
)
NODES = ResourceType(
    "",
    "v1",
    "nodes",
    "node",
    "Node",
    namespaced=False,
    field_labels=("metadata.name", "spec.unschedulable"),
    short_names=("no",),
    status_subresource=True,
)
NODE_FEATURES = ResourceType(
    NFD_GROUP,
    NFD_VERSION,
    "nodefeatures",
    "nodefeature",
    "NodeFeature",
    namespaced=True,
    builtin=False,
    generation=True,
)


# Dynamic Resource Allocation. ResourceClaims have no field labels beyond name and namespace
# (nothing selects a claim by node); ResourceSlices, cluster-scoped, select by node and driver.
def _dra_types(version: str) -> tuple[ResourceType, ResourceType]:
    claims = ResourceType(
        DRA_GROUP,
        version,
        "resourceclaims",
        "resourceclaim",
        "ResourceClaim",
        namespaced=True,
        status_subresource=True,
        generation=True,
    )
    slices = ResourceType(
        DRA_GROUP,
        version,
        "resourceslices",
        "resourceslice",
        "ResourceSlice",
        namespaced=False,
        field_labels=("metadata.name", "spec.nodeName", "spec.driver"),
        generation=True,
    )
    return claims, slices


DRA_TYPES = {v: _dra_types(v) for v in DRA_VERSIONS}
RESOURCE_CLAIMS, RESOURCE_SLICES = DRA_TYPES[DRA_VERSION]
CORE_TYPES = (PODS, NODES, NODE_FEATURES)
RESOURCE_TYPES = (*CORE_TYPES, RESOURCE_CLAIMS, RESOURCE_SLICES)  # a default server's
_BY_PLURAL = {rt.plural: rt for rt in RESOURCE_TYPES}


def _resource_type(resource: str | ResourceType) -> ResourceType:
    return resource if isinstance(resource, ResourceType) else _BY_PLURAL[resource]


# --- object builders --------------------------------------------------------------------------


def owner_reference(
    kind: str,
    name: str,
    *,
    uid: str | None = None,
    api_version: str = "batch/v1",
    controller: bool = True,
) -> Obj:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid or str(uuid.uuid4()),
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def pod(
    namespace: str,
    name: str,
    node: str = "",
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner_references: Iterable[Obj] = (),
    uid: str | None = None,
    phase: str = "Running",
    containers: Iterable[Obj] | None = None,
    resource_claims: Iterable[Obj] = (),
    resource_claim_statuses: Iterable[Obj] = (),
    scheduled_at: float | None = None,
) -> Obj:
    """A Pod manifest; `node` empty means not yet scheduled. `resource_claims` is
    `spec.resourceClaims` (see `pod_claim`), `resource_claim_statuses` the names the control
    plane generated for claims made from templates (`status.resourceClaimStatuses`).
    `scheduled_at` (Unix time) adds the `PodScheduled` condition the scheduler writes when it
    binds the pod, shaped as a real API server serves it (RFC 3339 in whole seconds, UTC)."""
    metadata: Obj = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    if owner_references:
        metadata["ownerReferences"] = [dict(ref) for ref in owner_references]
    if uid:
        metadata["uid"] = uid
    spec: Obj = {
        "containers": list(containers or [{"name": "main", "image": "busybox"}]),
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
    }
    if node:
        spec["nodeName"] = node
    if resource_claims:
        spec["resourceClaims"] = [dict(c) for c in resource_claims]
    status: Obj = {"phase": phase}
    if resource_claim_statuses:
        status["resourceClaimStatuses"] = [dict(c) for c in resource_claim_statuses]
    if scheduled_at is not None:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(scheduled_at))
                ),
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": status,
    }


def node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> Obj:
    metadata: Obj = {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }


def node_feature(
    namespace: str,
    name: str,
    node_name: str,
    *,
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """An NFD NodeFeature as a feature source publishes it for `node_name`."""
    return {
        "apiVersion": f"{NFD_GROUP}/{NFD_VERSION}",
        "kind": "NodeFeature",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"nfd.node.kubernetes.io/node-name": node_name},
        },
        "spec": {"labels": dict(labels or {})},
    }


def pod_claim(name: str, *, claim: str = "", template: str = "") -> Obj:
    """One `spec.resourceClaims[]` entry: an existing claim, or one made from a template."""
    entry: Obj = {"name": name}
    if claim:
        entry["resourceClaimName"] = claim
    if template:
        entry["resourceClaimTemplateName"] = template
    return entry


def claim_container(name: str, *claims: str | tuple[str, str], image: str = "busybox") -> Obj:
    """A container using pod claims by name, or `(claim, request)` for one request only."""
    refs = [{"name": c} if isinstance(c, str) else {"name": c[0], "request": c[1]} for c in claims]
    return {"name": name, "image": image, "resources": {"claims": refs}}


def dra_gpu(
    minor: int,
    uuid: str | None,
    *,
    product: str = "NVIDIA H100 80GB HBM3",
    pci_bus_id: str = "",
) -> Obj:
    """A full GPU as NVIDIA's DRA driver publishes it (cmd/gpu-kubelet-plugin/deviceinfo.go):
    named `gpu-<minor>`, attributes `type` "gpu", `uuid`, `productName`, ...; `uuid` None
    leaves that attribute out, as a driver that publishes none would."""
    attributes: Obj = {
        "type": {"string": "gpu"},
        "productName": {"string": product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "570.124.6"},
        "cudaDriverVersion": {"version": "12.8.0"},
        "pcieBusID": {"string": pci_bus_id or f"0000:{0x18 + minor:02x}:00.0"},
    }
    if uuid is not None:
        attributes["uuid"] = {"string": uuid}
    return {
        "name": f"gpu-{minor}",
        "attributes": attributes,
        "capacity": {"memory": {"value": "80Gi"}},
    }


def dra_dynamic_mig(
    parent_minor: int,
    parent_uuid: str | None,
    *,
    profile: str = "1g.10gb",
    profile_id: int = 19,
    start: int = 0,
    size: int = 1,
    counter_set: str | None = None,
) -> Obj:
    """A MIG device as NVIDIA's driver publishes it with DynamicMIG: a partition that exists
    only once a claim is prepared, so no `uuid` attribute; `parentUUID` (None leaves it out,
    as a driver that does not publish it), and the parent GPU's counter set it consumes from
    (`counter_set`, partitionable devices; None for none)."""
    attributes: Obj = {"type": {"string": "mig"}, "profile": {"string": profile}}
    if parent_uuid is not None:
        attributes["parentUUID"] = {"string": parent_uuid}
    device: Obj = {
        "name": f"gpu-{parent_minor}-mig-{profile_id}-{start}-{size}",
        "attributes": attributes,
        "capacity": {"memory": {"value": "10Gi"}},
    }
    if counter_set is not None:
        device["consumesCounters"] = [
            {"counterSet": counter_set, "counters": {"memory": {"value": "10Gi"}}}
        ]
    return device


def dra_mig(
    parent_minor: int,
    parent_uuid: str,
    uuid: str,
    *,
    profile: str = "1g.10gb",
    profile_id: int = 19,
    start: int = 0,
    size: int = 1,
) -> Obj:
    """A MIG device as NVIDIA's DRA driver publishes it: named
    `gpu-<minor>-mig-<profile id>-<start>-<size>`, `type` "mig", `uuid`, `parentUUID`,
    `profile`."""
    return {
        "name": f"gpu-{parent_minor}-mig-{profile_id}-{start}-{size}",
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": uuid},
            "parentUUID": {"string": parent_uuid},
            "profile": {"string": profile},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
        },
        "capacity": {"multiprocessors": {"value": "16"}, "memory": {"value": "10Gi"}},
    }


def resource_slice(
    node_name: str,
    devices: Iterable[Obj],
    *,
    driver: str = NVIDIA_GPU_DRIVER,
    pool: str | None = None,
    name: str | None = None,
    version: str = DRA_VERSION,
) -> Obj:
    """A ResourceSlice of one node's pool (a kubelet plugin's: `spec.nodeName` set, the pool
    named after the node, one slice in it), in `version`'s shape (devices are given in v1's)."""
    pool_name = node_name if pool is None else pool
    obj = {
        "apiVersion": f"{DRA_GROUP}/{DRA_VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node_name}-{driver}-{pool_name}"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": pool_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [dict(d) for d in devices],
        },
    }
    return dra_view(obj, version)


def resource_claim(
    namespace: str,
    name: str,
    *,
    requests: Iterable[str] = ("gpu",),
    results: Iterable[tuple[str, str, str] | tuple[str, str, str, str]] = (),
    reserved_for: Iterable[tuple[str, str]] = (),
    node_name: str = "",
    uid: str | None = None,
    admin_access: bool = False,
    version: str = DRA_VERSION,
) -> Obj:
    """A ResourceClaim; with `results` ((request, pool, device) for NVIDIA's driver, or
    (request, driver, pool, device)) it is allocated (`status.allocation`, on `node_name`),
    and `reserved_for` lists the (pod name, pod uid) that may use it. `admin_access`: every
    request asks for admin access (a monitoring claim), which the allocator copies into each
    result. In `version`'s shape."""
    metadata: Obj = {"name": name, "namespace": namespace}
    if uid:
        metadata["uid"] = uid
    claim: Obj = {
        "apiVersion": f"{DRA_GROUP}/{DRA_VERSION}",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": r,
                        "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER}
                        | ({"adminAccess": True} if admin_access else {}),
                    }
                    for r in requests
                ]
            }
        },
    }
    status: Obj = {}
    allocated: list[Obj] = []
    for result in results:
        request, driver, pool, device = (
            (result[0], NVIDIA_GPU_DRIVER, result[1], result[2]) if len(result) == 3 else result
        )
        allocated.append({"request": request, "driver": driver, "pool": pool, "device": device})
        if admin_access:
            allocated[-1]["adminAccess"] = True
    if allocated:
        status["allocation"] = {"devices": {"results": allocated}}
        if node_name:
            status["allocation"]["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node_name]}
                        ]
                    }
                ]
            }
    reserved = [{"resource": "pods", "name": n, "uid": u} for n, u in reserved_for]
    if reserved:
        status["reservedFor"] = reserved
    if status:
        claim["status"] = status
    return dra_view(claim, version)


# --- DRA versions: the stored (v1) shape and each served version's ---------------------------


def _v1beta1_request(request: Obj) -> Obj:
    """v1 `{name, exactly: {...}, firstAvailable}` -> v1beta1 `{name, ..., firstAvailable}`."""
    out = {k: v for k, v in request.items() if k != "exactly"}
    out.update(request.get("exactly") or {})
    return out


def _v1_request(request: Obj) -> Obj:
    """v1beta1's inline request -> v1's: what is not the name or the subrequests goes under
    `exactly` (a request has one or the other). An `exactly` sent to v1beta1 is an unknown
    field there, dropped as the API server drops unknown fields."""
    own = {k: v for k, v in request.items() if k in ("name", "firstAvailable")}
    exact = {k: v for k, v in request.items() if k not in ("name", "firstAvailable", "exactly")}
    return own | ({"exactly": exact} if exact else {})


def _v1_only_request(request: Obj) -> Obj:
    """What v1 (and v1beta2) keep of a request: v1beta1's inline fields are unknown there."""
    return {k: v for k, v in request.items() if k in ("name", "exactly", "firstAvailable")}


def _v1beta1_device(device: Obj) -> Obj:
    return {"name": device.get("name"), "basic": {k: v for k, v in device.items() if k != "name"}}


def _v1_device(device: Obj) -> Obj:
    """v1beta1's device -> v1's; attributes beside `basic` are unknown to v1beta1: dropped."""
    return {"name": device.get("name"), **(device.get("basic") or {})}


def _v1_only_device(device: Obj) -> Obj:
    return {k: v for k, v in device.items() if k != "basic"}  # unknown to v1 and v1beta2


def _reshape(
    obj: Obj, kind: str, request: Callable[[Obj], Obj], device: Callable[[Obj], Obj]
) -> Obj:
    out = copy.deepcopy(obj)
    spec = out.get("spec")
    kind = out.get("kind") or kind
    if not isinstance(spec, dict):
        return out
    if kind == "ResourceSlice" and isinstance(spec.get("devices"), list):
        spec["devices"] = [device(d) if isinstance(d, dict) else d for d in spec["devices"]]
    requests = _path(spec, "devices.requests")
    if kind == "ResourceClaim" and isinstance(requests, list):
        spec["devices"]["requests"] = [request(r) if isinstance(r, dict) else r for r in requests]
    return out


def dra_view(obj: Obj, version: str, kind: str = "") -> Obj:
    """A DRA object of the stored (v1) shape as `version` shows it. v1beta2's claims and
    slices have v1's shape (for the fields modelled here)."""
    if version == "v1beta1":
        obj = _reshape(obj, kind, _v1beta1_request, _v1beta1_device)
    else:
        obj = copy.deepcopy(obj)
    obj["apiVersion"] = f"{DRA_GROUP}/{version}"
    return obj


def dra_stored(obj: Obj, version: str, kind: str = "") -> Obj:
    """A DRA object written in `version` in the stored (v1) shape."""
    if version == "v1beta1":
        obj = _reshape(obj, kind, _v1_request, _v1_device)
    else:
        obj = _reshape(obj, kind, _v1_only_request, _v1_only_device)
    if "apiVersion" in obj:
        obj["apiVersion"] = f"{DRA_GROUP}/{DRA_VERSION}"
    return obj


def _is_dra(rt: ResourceType) -> bool:
    return rt.group == DRA_GROUP


def _inbound(rt: ResourceType, obj: Obj) -> Obj:
    """An object written through `rt`'s version, as stored."""
    return dra_stored(obj, rt.version, rt.kind) if _is_dra(rt) else obj


def _outbound(rt: ResourceType, answer: Obj) -> Obj:
    """A stored object (or a list of them) as `rt`'s version shows it; a Status unchanged."""
    if not _is_dra(rt) or answer.get("kind") == "Status":
        return answer
    if isinstance(answer.get("items"), list):
        items = [
            {k: v for k, v in dra_view(i, rt.version, rt.kind).items() if k in i}
            for i in answer["items"]
        ]
        return {**answer, "items": items}
    return dra_view(answer, rt.version, rt.kind)


# --- errors -----------------------------------------------------------------------------------

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An error the server answers with a `Status` object."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: Obj | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = dict(headers or {})

    def status(self) -> Obj:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def _details(rt: ResourceType, name: str, **extra: Any) -> Obj:
    details: Obj = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.plural
    details.update(extra)
    return details


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.group_resource} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    message = f'{rt.group_resource} "{name}" already exists'
    return ApiError(409, "AlreadyExists", message, _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str | None = None) -> ApiError:
    why = why or (
        "the object has been modified; please apply your changes to the latest version "
        "and try again"
    )
    message = f'Operation cannot be fulfilled on {rt.group_resource} "{name}": {why}'
    return ApiError(409, "Conflict", message, _details(rt, name))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(rt: ResourceType, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """NewInvalid: causes are (field, "Invalid value: ...: detail") pairs."""
    texts = [f"{path}: {text}" for path, text in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details: Obj = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.kind
    details["causes"] = [
        {"reason": _cause_reason(text), "message": text, "field": path} for path, text in causes
    ]
    return ApiError(422, "Invalid", f'{rt.group_kind} "{name}" is invalid: {joined}', details)


def _cause_reason(text: str) -> str:
    if text.startswith("Required value"):
        return "FieldValueRequired"
    if text.startswith("Forbidden"):
        return "FieldValueForbidden"
    return "FieldValueInvalid"


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def injected(code: int, message: str | None = None) -> ApiError:
    reason = _REASONS.get(code, "InternalError" if code >= 500 else "Unknown")
    headers: dict[str, str] = {}
    details: Obj | None = None
    if code == 429:
        headers["Retry-After"] = "1"
        details = {"retryAfterSeconds": 1}
    return ApiError(
        code, reason, message or f"injected failure ({code} {reason})", details, headers
    )


# --- selectors --------------------------------------------------------------------------------

_LABEL_TERM = re.compile(r"^([^\s!=<>(),]+)\s*(==|=|!=)\s*([^\s!=<>(),]*)$")
_SET_TERM = re.compile(r"^([^\s!=<>(),]+)\s+(in|notin)\s*\(([^()]*)\)$")
_CMP_TERM = re.compile(r"^([^\s!=<>(),]+)\s*([<>])\s*(-?\d+)$")
_KEY_ONLY = re.compile(r"^[^\s!=<>(),]+$")


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    op: str  # =, !=, in, notin, exists, !, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        try:
            number = int(value or "")
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == "gt" else number < bound


def _split_top_level(text: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return terms


def parse_label_selector(text: str) -> list[LabelRequirement]:
    """The labelSelector grammar: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`."""
    requirements: list[LabelRequirement] = []
    if not text.strip():
        return requirements
    for raw in _split_top_level(text):
        term = raw.strip()
        if match := _LABEL_TERM.match(term):
            key, op, value = match.groups()
            requirements.append(LabelRequirement(key, "!=" if op == "!=" else "=", (value,)))
        elif match := _SET_TERM.match(term):
            key, op, values = match.groups()
            parsed = tuple(v.strip() for v in values.split(","))
            requirements.append(LabelRequirement(key, op, parsed))
        elif match := _CMP_TERM.match(term):
            key, op, value = match.groups()
            requirements.append(LabelRequirement(key, "gt" if op == ">" else "lt", (value,)))
        elif term.startswith("!") and _KEY_ONLY.match(term[1:].strip()):
            requirements.append(LabelRequirement(term[1:].strip(), "!"))
        elif _KEY_ONLY.match(term):
            requirements.append(LabelRequirement(term, "exists"))
        else:
            raise bad_request(f"unable to parse requirement: found '{term}', expected: identifier")
    return requirements


@dataclass(frozen=True)
class FieldRequirement:
    label: str
    op: str  # = or !=
    value: str

    def matches(self, rt: ResourceType, obj: Mapping[str, Any]) -> bool:
        equal = rt.field_value(obj, self.label) == self.value
        return equal if self.op == "=" else not equal


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, escaped = [], "", False
    for char in text:
        if escaped:
            current += "\\" + char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == sep:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current + ("\\" if escaped else ""))
    return parts


def _unescape_field_value(value: str) -> str:
    out, escaped = "", False
    for char in value:
        if escaped:
            if char not in "\\,=":
                raise bad_request(f"invalid field selector: invalid escape sequence: \\{char}")
            out += char
            escaped = False
        elif char == "\\":
            escaped = True
        else:
            out += char
    if escaped:
        raise bad_request("invalid field selector: unterminated escape sequence")
    return out


def parse_field_selector(rt: ResourceType, text: str) -> list[FieldRequirement]:
    requirements: list[FieldRequirement] = []
    if not text.strip():
        return requirements
    for term in _split_unescaped(text, ","):
        for op in ("!=", "==", "="):
            index = term.find(op)
            if index > 0:
                label = term[:index].strip()
                value = _unescape_field_value(term[index + len(op) :])
                break
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        if label not in rt.field_labels:
            if rt.builtin:
                raise bad_request(f"field label not supported: {label}")
            known = ", ".join(f'"{name}"' for name in rt.field_labels)
            raise bad_request(f'"{label}" is not a known field selector: only {known}')
        requirements.append(FieldRequirement(label, "!=" if op == "!=" else "=", value))
    return requirements


@dataclass(frozen=True)
class Selection:
    """What one list or watch asks for: a namespace (or all) and label and field selectors."""

    rt: ResourceType
    namespace: str | None
    labels: tuple[LabelRequirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        return all(r.matches(labels) for r in self.labels) and all(
            r.matches(self.rt, obj) for r in self.fields
        )

    @property
    def filtered(self) -> bool:
        return bool(self.labels or self.fields)


# --- patches ----------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# patchMergeKey of the list fields whose patchStrategy is "merge", by field name (the types
# here use each name with one meaning); None marks a merged list of scalars (finalizers).
_SMP_MERGE_KEYS: dict[str, str | None] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "taints": "key",
    "addresses": "type",
    "resourceClaims": "name",
    "finalizers": None,
}


class _Delete:
    """Marks a map removed by `$patch: delete`."""


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch as apiserver applies it to the built-in types used here: maps merge
    (null deletes a key), lists listed in `_SMP_MERGE_KEYS` merge by their key, other lists are
    replaced; `$patch` (replace/delete/merge), `$retainKeys`, `$deleteFromPrimitiveList/` and
    `$setElementOrder/` directives are honoured."""
    result = _smp_map(target if isinstance(target, dict) else {}, patch)
    return {} if isinstance(result, _Delete) else result


def _smp_map(target: Obj, patch: Obj) -> Obj | _Delete:
    directive = patch.get("$patch")
    if directive == "delete":
        return _Delete()
    body = {k: v for k, v in patch.items() if k != "$patch"}
    if directive == "replace":
        replaced: Obj = _smp_strip(body)
        return replaced
    if directive not in (None, "merge"):
        raise bad_request(f"Unknown patch type: {directive}")
    result = copy.deepcopy(target)
    retain = body.pop("$retainKeys", None)
    for key, value in body.items():
        if key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(result.get(name), list):
                result[name] = [item for item in result[name] if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            merged = _smp_map(result[key], value)
            if isinstance(merged, _Delete):
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, dict):
            stripped = _smp_map({}, value)
            if isinstance(stripped, _Delete):
                result.pop(key, None)
            else:
                result[key] = stripped
        elif isinstance(value, list) and key in _SMP_MERGE_KEYS:
            result[key] = _smp_list(result.get(key) or [], value, _SMP_MERGE_KEYS[key])
        else:
            result[key] = _smp_strip(value)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _smp_list(target: list[Any], patch: list[Any], merge_key: str | None) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [_smp_strip(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    if merge_key is None:  # a merged list of scalars: union, order kept
        result = list(target)
        result.extend(item for item in patch if item not in result)
        return result
    result = copy.deepcopy(target)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {merge_key}")
        index = next(
            (i for i, old in enumerate(result) if old.get(merge_key) == item[merge_key]), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(_smp_strip(item))
        else:
            merged = _smp_map(result[index], item)
            if not isinstance(merged, _Delete):
                result[index] = merged
    return result


def _smp_strip(value: Any) -> Any:
    """A patch value stored as is: directives dropped, nulls in maps meaning "absent"."""
    if isinstance(value, dict):
        return {
            k: _smp_strip(v) for k, v in value.items() if v is not None and not k.startswith("$")
        }
    if isinstance(value, list):
        return [_smp_strip(v) for v in value]
    return value


class JsonPatchError(Exception):
    pass


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise JsonPatchError(f"invalid JSON pointer: {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _resolve_parent(doc: Any, tokens: list[str], path: str) -> Any:
    parent = doc
    for token in tokens[:-1]:
        if isinstance(parent, dict) and token in parent:
            parent = parent[token]
        elif isinstance(parent, list) and token.isdigit() and int(token) < len(parent):
            parent = parent[int(token)]
        else:
            raise JsonPatchError(f"doc is missing path: {path}")
    return parent


def _get_pointer(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _resolve_parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise JsonPatchError(f"doc is missing path: {path}")


def _add_pointer(doc: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _resolve_parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise JsonPatchError(f"add operation does not apply: index out of bounds: {path}")
    else:
        raise JsonPatchError(f"add operation does not apply: doc is missing path: {path}")
    return doc


def _remove_pointer(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise JsonPatchError("remove operation does not apply: cannot remove the root")
    parent = _resolve_parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise JsonPatchError(f"remove operation does not apply: doc is missing path: {path}")
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch: add, remove, replace, move, copy, test."""
    doc = copy.deepcopy(doc)
    for op in operations:
        kind, path = op.get("op"), op.get("path")
        if not isinstance(path, str):
            raise JsonPatchError(f"operation missing path: {op}")
        if kind in ("add", "replace", "test") and "value" not in op:
            raise JsonPatchError(f"operation missing value: {op}")
        if kind == "add":
            doc = _add_pointer(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            doc = _remove_pointer(doc, path)
        elif kind == "replace":
            _get_pointer(doc, path)  # must exist
            if _pointer(path):
                doc = _remove_pointer(doc, path)
            doc = _add_pointer(doc, path, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise JsonPatchError(f"operation missing from: {op}")
            value = copy.deepcopy(_get_pointer(doc, source))
            if kind == "move":
                doc = _remove_pointer(doc, source)
            doc = _add_pointer(doc, path, value)
        elif kind == "test":
            try:
                current = _get_pointer(doc, path)
            except JsonPatchError:
                current = None
            if current != op["value"]:
                raise JsonPatchError(f"testing value {path} failed: test failed")
        else:
            raise JsonPatchError(f"Unexpected kind: {kind}")
    return doc


# --- validation -------------------------------------------------------------------------------

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_NAME_PART_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',"
    "  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def _qualified_name_errors(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    errors = []
    if "/" in prefix:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and "
            "must start and end with an alphanumeric character with an optional DNS subdomain "
            "prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if key.endswith("/") or (key.startswith("/") and not prefix):
        errors.append("prefix part must be non-empty")
    elif prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        errors.append("prefix part " + _SUBDOMAIN_MSG)
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    elif not _QUALIFIED_NAME.match(name):
        errors.append(_NAME_PART_MSG)
    return errors


def _metadata_type_errors(obj: Obj) -> list[str]:
    """What a Go decoder would refuse in metadata: labels/annotations must map strings."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return ["metadata must be an object"]
    errors = []
    for name in ("labels", "annotations"):
        value = meta.get(name)
        if value is None:
            continue
        if not isinstance(value, dict):
            errors.append(f"ObjectMeta.metadata.{name} must be an object")
            continue
        for key, item in value.items():
            if not isinstance(item, str):
                errors.append(
                    f"json: cannot unmarshal {_json_type(item)} into Go struct field "
                    f"ObjectMeta.metadata.{name} of type string (key {key!r})"
                )
    return errors


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"


def _validation_causes(obj: Obj) -> list[tuple[str, str]]:
    meta = obj["metadata"]
    causes: list[tuple[str, str]] = []
    name = meta.get("name") or ""
    if not name:
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        causes.append(("metadata.name", f'Invalid value: "{name}": {_SUBDOMAIN_MSG}'))
    for key, value in (meta.get("labels") or {}).items():
        causes.extend(
            ("metadata.labels", f'Invalid value: "{key}": {e}') for e in _qualified_name_errors(key)
        )
        if len(value) > 63:
            causes.append(
                ("metadata.labels", f'Invalid value: "{value}": must be no more than 63 characters')
            )
        elif not _LABEL_VALUE.match(value):
            causes.append(("metadata.labels", f'Invalid value: "{value}": {_LABEL_VALUE_MSG}'))
    annotations = meta.get("annotations") or {}
    for key in annotations:
        causes.extend(
            ("metadata.annotations", f'Invalid value: "{key}": {e}')
            for e in _qualified_name_errors(key)
        )
    size = sum(len(k) + len(v) for k, v in annotations.items())
    if size > 256 * 1024:
        causes.append(
            ("metadata.annotations", f"Too long: may not be more than 262144 bytes, got {size}")
        )
    return causes


# --- the request log --------------------------------------------------------------------------


@dataclass
class KubeRequest:
    """One request as the server saw it. `verb` is the Kubernetes verb (list, watch, get,
    create, update, patch, delete, deletecollection) or "discovery"/"other"."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    token: str | None
    body: Any
    verb: str
    resource: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    code: int | None = None  # the status answered (200 for a watch that streamed)

    @property
    def watch(self) -> bool:
        return self.verb == "watch"


@dataclass
class _Fault:
    remaining: int
    code: int
    method: str | None
    path: str | None
    message: str | None

    def applies(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path is None or path.startswith(self.path)
        )


@dataclass
class _Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    rt: ResourceType
    obj: Obj  # the new state (for DELETED: the last state, stamped with the delete's RV)
    old: Obj | None  # the previous state (None for ADDED)


@dataclass
class _Watch:
    handler: BaseHTTPRequestHandler
    selection: Selection
    bookmarks: bool
    dropped: bool = False
    frozen: bool = False  # freeze_watches(): send nothing more, keep the connection open
    bookmarks_sent: int = 0  # how many of the server's bookmark() requests it has answered


@dataclass(frozen=True)
class _Route:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None
    legacy_watch: bool = False


@dataclass
class _Incoming:
    """One request as read off the wire, before it is authorized or served; `record` is
    what the request log keeps of it, `route_error` a path no route matches."""

    path: str
    query: dict[str, str]
    raw: bytes
    content_type: str | None
    token: str | None
    record: KubeRequest
    route: _Route | None
    route_error: ApiError | None


# --- the server -------------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], owner: KubeApiServer) -> None:
        self.owner = owner
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up (and `stop`/`drop_watches` cutting them) are not errors."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            self.owner.errors.append(traceback.format_exc())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.owner._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base signature
        pass

    def do_GET(self) -> None:
        self.server.owner._handle(self)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET  # noqa: N815


class KubeApiServer:
    """An in-memory Kubernetes API server on 127.0.0.1, started on `__enter__`.

    `history_limit` bounds the retained watch events (older watches get 410);
    `bookmark_interval` sends periodic BOOKMARKs to watches that allow them;
    `max_watch_seconds` caps every watch (as apiserver's request timeout does), so a client that
    sets no `timeoutSeconds` still sees clean ends of stream; `token`, when set, is the only
    bearer token accepted (401 otherwise); any token is accepted when it is None.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        token: str | None = None,
        history_limit: int = 1000,
        bookmark_interval: float | None = None,
        max_watch_seconds: float | None = None,
        initial_resource_version: int = 100,
        clock: Callable[[], float] = time.time,
        dra_versions: Iterable[str] = (DRA_VERSION,),
    ) -> None:
        versions = tuple(dra_versions)
        unknown = sorted(set(versions) - set(DRA_VERSIONS))
        if unknown:
            raise ValueError(f"resource.k8s.io versions not modelled: {unknown}")
        self.dra_versions = tuple(v for v in DRA_VERSIONS if v in versions)  # by priority
        self._types = (*CORE_TYPES, *(t for v in self.dra_versions for t in DRA_TYPES[v]))
        self._by_path = {(rt.group, rt.version, rt.plural): rt for rt in self._types}
        self._by_kind = {(rt.api_version, rt.kind): rt for rt in self._types}
        self.port = port
        self.token = token
        self.history_limit = history_limit
        self.bookmark_interval = bookmark_interval
        self.max_watch_seconds = max_watch_seconds
        self.errors: list[str] = []
        self._clock = clock
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._rv = initial_resource_version
        self._floor = initial_resource_version  # watches from RV >= floor can be served
        self._objects: dict[tuple[str, str, str], Obj] = {}  # (plural, ns, name)
        self._history: list[_Event] = []
        self._snapshots: dict[int, tuple[int, list[Obj]]] = {}  # paginated lists: rv, items
        self._snapshot_ids = itertools.count(1)
        self._watches: list[_Watch] = []
        self._watches_opened = 0
        self._bookmark_rvs: list[int] = []  # the RV at each bookmark() call
        self._requests: list[KubeRequest] = []
        self._faults: list[_Fault] = []
        self._delay = 0.0
        self._conns: set[socket.socket] = set()
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Listen (again) on the same port: clients reconnect as to a restarted apiserver."""
        if self._server is not None:
            return
        self._stopping.clear()
        server = _HTTPServer(("127.0.0.1", self.port), self)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Go down: stop listening and cut every open connection (watches included)."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        with self._changed:
            for watch in self._watches:
                watch.dropped = True
            conns = list(self._conns)
            self._changed.notify_all()
        for conn in conns:
            _cut(conn)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> KubeApiServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def kubeconfig(
        self, path: Path | str, *, token: str | None = None, namespace: str = "default"
    ) -> Path:
        """Write a kubeconfig whose current context points at this server."""
        path = Path(path)
        path.write_text(
            "apiVersion: v1\n"
            "kind: Config\n"
            "clusters:\n"
            "- name: kube-apiserver-double\n"
            "  cluster:\n"
            f"    server: {self.url}\n"
            "contexts:\n"
            "- name: kube-apiserver-double\n"
            "  context:\n"
            "    cluster: kube-apiserver-double\n"
            "    user: test\n"
            f"    namespace: {namespace}\n"
            "current-context: kube-apiserver-double\n"
            "users:\n"
            "- name: test\n"
            "  user:\n"
            f"    token: {token or self.token or 'test-token'}\n"
        )
        return path

    # fault injection

    def fail_next(
        self,
        n: int = 1,
        code: int = 500,
        *,
        method: str | None = None,
        path: str | None = None,
        message: str | None = None,
    ) -> None:
        """Answer the next `n` requests (of `method`, under `path`, when given) with a `Status`
        of `code` (429 also carries Retry-After: 1)."""
        with self._lock:
            self._faults.append(_Fault(n, code, method, path, message))

    def delay(self, seconds: float) -> None:
        """Hold every request this long before answering (0 to stop); `stop` cuts it short."""
        self._delay = seconds

    def expire_history(self) -> None:
        """Forget the watch history (an etcd compaction): watches from any earlier RV get 410,
        and continue tokens of earlier lists expire."""
        with self._changed:
            self._history.clear()
            self._floor = self._rv
            self._snapshots.clear()
            self._changed.notify_all()

    def drop_watches(self) -> int:
        """Cut every open watch mid-stream, with no terminating chunk. Returns how many."""
        with self._changed:
            watches = [w for w in self._watches if not w.dropped]
            for watch in watches:
                watch.dropped = True
            self._changed.notify_all()
        for watch in watches:
            _cut(watch.handler.connection)
        return len(watches)

    def freeze_watches(self) -> int:
        """Freeze every open watch: its connection stays open but nothing is sent on it any
        more, not even the end of stream at its timeout, until the client hangs up (or
        `drop_watches`/`stop`). Watches opened later stream normally. Returns how many."""
        with self._changed:
            watches = [w for w in self._watches if not w.dropped and not w.frozen]
            for watch in watches:
                watch.frozen = True
            self._changed.notify_all()
        return len(watches)

    @property
    def frozen_watches(self) -> int:
        """How many frozen watches are still connected (their client has not hung up)."""
        with self._lock:
            return sum(1 for w in self._watches if w.frozen and not w.dropped)

    def bookmark(self) -> None:
        """Send a BOOKMARK now to every watch that allows bookmarks."""
        with self._changed:
            self._bookmark_rvs.append(self._rv)
            self._changed.notify_all()

    @property
    def watch_count(self) -> int:
        with self._lock:
            return sum(1 for w in self._watches if not w.dropped)

    @property
    def watches_opened(self) -> int:
        """How many watches have started streaming since the server was made (410s excluded)."""
        with self._lock:
            return self._watches_opened

    def wait_for_watches(
        self, count: int = 1, timeout: float = 5.0, *, opened: bool = False
    ) -> None:
        """Wait until `count` watches are streaming (or, with `opened`, have ever streamed):
        a client's watch is in place before a test makes the changes it should see."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if opened:
                    have = self._watches_opened
                else:
                    have = sum(1 for w in self._watches if not w.dropped)
                if have >= count:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{have} watches, not {count}, after {timeout}s")
                self._changed.wait(left)

    # the request log

    @property
    def requests(self) -> list[KubeRequest]:
        with self._lock:
            return list(self._requests)

    def calls(
        self,
        verb: str | None = None,
        resource: str | None = None,
        *,
        name: str | None = None,
        method: str | None = None,
    ) -> list[KubeRequest]:
        return [
            r
            for r in self.requests
            if (verb is None or r.verb == verb)
            and (resource is None or r.resource == resource)
            and (name is None or r.name == name)
            and (method is None or r.method == method)
        ]

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # state, bypassing the HTTP layer (no validation, no faults)

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def create(self, obj: Obj) -> Obj:
        """Store a new object as a controller would create it, in a version this server
        serves; uid, if set, is kept. Answers the stored shape."""
        rt = self._type_of(obj)
        with self._lock:
            return self._create(rt, _inbound(rt, copy.deepcopy(obj)), keep_uid=True)

    def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        rt = _resource_type(resource)
        with self._lock:
            stored = self._objects.get(self._key(rt, namespace, name))
            return copy.deepcopy(stored) if stored is not None else None

    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        rt = _resource_type(resource)
        with self._lock:
            return [
                copy.deepcopy(obj)
                for key, obj in sorted(self._objects.items())
                if key[0] == rt.plural and (namespace is None or key[1] == namespace)
            ]

    def modify(
        self, resource: str, namespace: str | None, name: str, change: Callable[[Obj], None]
    ) -> Obj:
        """Apply `change` to a copy of the object and store it (MODIFIED, if anything changed)."""
        rt = _resource_type(resource)
        with self._lock:
            current = self._objects.get(self._key(rt, namespace, name))
            if current is None:
                raise KeyError(f"{rt.plural} {namespace}/{name}")
            new = copy.deepcopy(current)
            change(new)
            return self._write(rt, current, new)

    def delete(
        self, resource: str, namespace: str | None, name: str, *, graceful: bool = False
    ) -> Obj | None:
        """Remove an object (DELETED). `graceful` first marks it terminating (MODIFIED with
        deletionTimestamp), as a kubelet-confirmed pod deletion looks to a watcher."""
        rt = _resource_type(resource)
        with self._lock:
            current = self._objects.get(self._key(rt, namespace, name))
            if current is None:
                return None
            if graceful and "deletionTimestamp" not in current["metadata"]:
                terminating = copy.deepcopy(current)
                terminating["metadata"]["deletionTimestamp"] = self._now()
                terminating["metadata"]["deletionGracePeriodSeconds"] = 30
                current = self._commit(rt, current, terminating)
            return self._remove(rt, current)

    def add_pod(self, namespace: str, name: str, node: str = "", **kwargs: Any) -> Obj:
        """Create a pod; keyword arguments are `pod()`'s (labels, owner_references, uid, ...)."""
        return self.create(pod(namespace, name, node, **kwargs))

    def update_pod(
        self,
        namespace: str,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        node: str | None = None,
        phase: str | None = None,
        status: Obj | None = None,
    ) -> Obj:
        """Change a pod: given labels/annotations replace the maps, `phase` sets status.phase."""

        def change(obj: Obj) -> None:
            if labels is not None:
                obj["metadata"]["labels"] = dict(labels)
            if annotations is not None:
                obj["metadata"]["annotations"] = dict(annotations)
            if node is not None:
                obj["spec"]["nodeName"] = node
            if status is not None:
                obj["status"] = copy.deepcopy(status)
            if phase is not None:
                obj.setdefault("status", {})["phase"] = phase

        return self.modify("pods", namespace, name, change)

    def delete_pod(self, namespace: str, name: str, *, graceful: bool = False) -> Obj | None:
        return self.delete("pods", namespace, name, graceful=graceful)

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        return self.get("pods", namespace, name)

    def add_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> Obj:
        return self.create(node(name, labels=labels, annotations=annotations))

    def update_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> Obj:
        def change(obj: Obj) -> None:
            if labels is not None:
                obj["metadata"]["labels"] = dict(labels)
            if annotations is not None:
                obj["metadata"]["annotations"] = dict(annotations)

        return self.modify("nodes", None, name, change)

    def delete_node(self, name: str) -> Obj | None:
        return self.delete("nodes", None, name)

    def get_node(self, name: str) -> Obj | None:
        return self.get("nodes", None, name)

    def add_node_feature(
        self,
        namespace: str,
        name: str,
        node_name: str,
        labels: Mapping[str, str] | None = None,
    ) -> Obj:
        return self.create(node_feature(namespace, name, node_name, labels=labels))

    def get_node_feature(self, namespace: str, name: str) -> Obj | None:
        return self.get("nodefeatures", namespace, name)

    # the store (callers hold self._lock)

    def _type_of(self, obj: Obj) -> ResourceType:
        try:
            return self._by_kind[(obj["apiVersion"], obj["kind"])]
        except KeyError:
            raise ValueError(f"not served: {obj.get('apiVersion')} {obj.get('kind')}") from None

    @staticmethod
    def _key(rt: ResourceType, namespace: str | None, name: str) -> tuple[str, str, str]:
        return (rt.plural, (namespace or "") if rt.namespaced else "", name)

    def _now(self) -> str:
        return datetime.fromtimestamp(self._clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _create(self, rt: ResourceType, obj: Obj, *, keep_uid: bool, dry_run: bool = False) -> Obj:
        meta = obj.setdefault("metadata", {})
        if not rt.namespaced:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            suffix = uuid.uuid4().hex[:5]
            meta["name"] = f"{meta['generateName']}{suffix}"
        key = self._key(rt, meta.get("namespace"), meta.get("name", ""))
        if key in self._objects:
            raise already_exists(rt, meta["name"])
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        if not (keep_uid and meta.get("uid")):
            meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self._now()
        if rt.generation:
            meta["generation"] = 1
        if rt is PODS:
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        if dry_run:
            meta["resourceVersion"] = str(self._rv)
            return copy.deepcopy(obj)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._objects[key] = obj
        self._record(_Event(self._rv, "ADDED", rt, copy.deepcopy(obj), None))
        return copy.deepcopy(obj)

    def _write(self, rt: ResourceType, current: Obj, new: Obj, *, dry_run: bool = False) -> Obj:
        """Store `new` over `current` unless nothing changed; finish a pending deletion."""
        meta, old_meta = new.setdefault("metadata", {}), current["metadata"]
        for fixed in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
            if fixed in old_meta:
                meta[fixed] = old_meta[fixed]
            else:
                meta.pop(fixed, None)
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if rt.generation and new.get("spec") != current.get("spec"):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        elif "generation" in old_meta:
            meta["generation"] = old_meta["generation"]
        if new == current:
            return copy.deepcopy(current)
        if dry_run:
            return copy.deepcopy(new)
        terminating = "deletionTimestamp" in meta and not meta.get("finalizers")
        if terminating and (rt is not PODS or not meta.get("deletionGracePeriodSeconds")):
            return self._remove(rt, new)
        return self._commit(rt, current, new)

    def _commit(self, rt: ResourceType, current: Obj, new: Obj) -> Obj:
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        meta = new["metadata"]
        self._objects[self._key(rt, meta.get("namespace"), meta["name"])] = new
        self._record(_Event(self._rv, "MODIFIED", rt, copy.deepcopy(new), copy.deepcopy(current)))
        return copy.deepcopy(new)

    def _remove(self, rt: ResourceType, current: Obj) -> Obj:
        meta = current["metadata"]
        self._objects.pop(self._key(rt, meta.get("namespace"), meta["name"]), None)
        self._rv += 1
        gone = copy.deepcopy(current)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._record(_Event(self._rv, "DELETED", rt, copy.deepcopy(gone), copy.deepcopy(current)))
        return gone

    def _record(self, event: _Event) -> None:
        self._history.append(event)
        if len(self._history) > self.history_limit:
            dropped = self._history[: len(self._history) - self.history_limit]
            del self._history[: len(dropped)]
            self._floor = dropped[-1].rv
            for snap_id, (rv, _) in list(self._snapshots.items()):
                if rv < self._floor:
                    del self._snapshots[snap_id]
        self._changed.notify_all()

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    # HTTP

    def _read(self, h: _Handler) -> _Incoming:
        """Parse the request and route it; a bad route is kept, not raised, so the request
        is logged (and faults and auth apply) before its error is answered."""
        url = urlsplit(h.path)
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        content_type = h.headers.get("Content-Type")
        auth = h.headers.get("Authorization") or ""
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        record = KubeRequest(h.command, url.path, query, content_type, token, body, "other")
        route: _Route | None = None
        route_error: ApiError | None = None
        try:
            route = self._route(url.path)
        except ApiError as err:
            route_error = err
        if route is not None:
            record.verb = self._verb(h.command, route, query)
            record.resource, record.namespace = route.rt.plural, route.namespace
            record.name, record.subresource = route.name, route.subresource
        elif h.command == "GET" and route_error is None:
            record.verb = "discovery"
        return _Incoming(url.path, query, raw, content_type, token, record, route, route_error)

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        """The first injected fault for this request, counted down (and dropped when spent)."""
        with self._lock:
            fault = next((f for f in self._faults if f.applies(method, path)), None)
            if fault is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
        return fault

    def _serve(self, h: _Handler, req: _Incoming) -> None:
        """Answer one logged request: an injected fault, then auth, then the route's error,
        then discovery, a watch or the REST verb. Errors raise ApiError for _handle."""
        fault = self._take_fault(h.command, req.path)
        if fault is not None:
            raise injected(fault.code, fault.message)
        if self.token is not None and req.token != self.token:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        if req.route_error is not None:
            raise req.route_error
        route, record = req.route, req.record
        if route is None:
            self._serve_discovery(h, req.path, record)
        elif record.verb == "watch":
            record.code = 200
            self._serve_watch(h, route, req.query)
        else:
            code, answer = self._dispatch(h.command, route, req.query, req.content_type, req.raw)
            self._send(h, code, answer, record)

    def _handle(self, h: _Handler) -> None:
        req = self._read(h)
        record = req.record
        with self._lock:
            self._requests.append(record)
        try:
            if self._delay > 0 and self._stopping.wait(self._delay):
                h.close_connection = True
                return
            self._serve(h, req)
        except ApiError as err:
            self._send(h, err.code, err.status(), record, err.headers)
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True
        except Exception:  # noqa: BLE001 - a bug in the double: answer 500, keep it for the test
            self.errors.append(traceback.format_exc())
            message = f"Internal error occurred: {traceback.format_exc(limit=1)}"
            try:
                self._send(h, 500, status_object(500, "InternalError", message), record)
            except OSError:
                h.close_connection = True

    @staticmethod
    def _verb(method: str, route: _Route, query: Mapping[str, str]) -> str:
        if method == "GET":
            if route.legacy_watch or _truthy(query.get("watch")):
                return "watch"
            return "get" if route.name else "list"
        if route.name is None:
            return {"POST": "create", "DELETE": "deletecollection"}.get(method, "other")
        return {"PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, "other")

    def _route(self, path: str) -> _Route | None:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        if not rest:
            return None
        legacy_watch = rest[0] == "watch"
        if legacy_watch:
            rest = rest[1:]
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise _no_such_resource()
        rt = self._by_path.get((group, version, rest[0]))
        if rt is None or (namespace is not None and not rt.namespaced):
            raise _no_such_resource()
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if name is not None and rt.namespaced and namespace is None:
            raise _no_such_resource()
        if subresource is not None and (subresource != "status" or not rt.status_subresource):
            raise _no_such_resource()
        return _Route(rt, namespace, name, subresource, legacy_watch)

    def _send(
        self,
        h: BaseHTTPRequestHandler,
        code: int,
        answer: Obj,
        record: KubeRequest,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        record.code = code
        payload = json.dumps(answer).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Cache-Control", "no-cache, private")
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    def _serve_discovery(self, h: _Handler, path: str, record: KubeRequest) -> None:
        path = "/" + path.strip("/")
        core = [rt for rt in self._types if not rt.group]
        groups = sorted({rt.group for rt in self._types if rt.group})
        answer: Obj
        if path in ("/healthz", "/livez", "/readyz"):
            record.code = 200
            h.send_response(200)
            h.send_header("Content-Type", "text/plain; charset=utf-8")
            h.send_header("Content-Length", "2")
            h.end_headers()
            h.wfile.write(b"ok")
            return
        if path == "/version":
            answer = dict(SERVER_VERSION)
        elif path == "/api":
            answer = {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}
                ],
            }
        elif path == "/api/v1":
            answer = {"kind": "APIResourceList", "groupVersion": "v1", "resources": []}
            answer["resources"] = [r for rt in core for r in _api_resources(rt)]
        elif path == "/apis":
            answer = {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [_api_group(g, self._types) for g in groups],
            }
        elif path.startswith("/apis/") and path.count("/") == 2 and path[6:] in groups:
            answer = {"kind": "APIGroup", "apiVersion": "v1", **_api_group(path[6:], self._types)}
        elif path.startswith("/apis/") and path.count("/") == 3:
            group, version = path.split("/")[2:4]
            served = [rt for rt in self._types if (rt.group, rt.version) == (group, version)]
            if not served:
                raise _no_such_resource()
            answer = {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}",
                "resources": [r for rt in served for r in _api_resources(rt)],
            }
        elif path == "/":
            answer = {"paths": ["/api", "/api/v1", "/apis", *(f"/apis/{g}" for g in groups)]}
        else:
            raise _no_such_resource()
        self._send(h, 200, answer, record)

    def _dispatch(
        self,
        method: str,
        route: _Route,
        query: Mapping[str, str],
        content_type: str | None,
        raw: bytes,
    ) -> tuple[int, Obj]:
        """The answer in the route's version (DRA objects are stored in v1's shape)."""
        code, answer = self._dispatch_stored(method, route, query, content_type, raw)
        return code, _outbound(route.rt, answer)

    def _dispatch_stored(
        self,
        method: str,
        route: _Route,
        query: Mapping[str, str],
        content_type: str | None,
        raw: bytes,
    ) -> tuple[int, Obj]:
        rt = route.rt
        dry_run = query.get("dryRun") == "All"
        if method == "GET":
            if route.name is None:
                return 200, self._list(route, query)
            with self._lock:
                return 200, self._get_or_404(rt, route.namespace, route.name)
        if method == "POST" and route.name is None:
            if rt.namespaced and route.namespace is None:
                raise _method_not_allowed()
            obj = _inbound(rt, _decode_object(rt, raw))
            with self._lock:
                return 201, self._rest_create(rt, route.namespace, obj, dry_run)
        if method == "DELETE" and route.name is None:
            return 200, self._delete_collection(route, query, dry_run)
        if method == "DELETE" and route.subresource is None:
            try:
                options = json.loads(raw) if raw.strip() else {}
            except ValueError as err:
                raise bad_request(f"error decoding DeleteOptions: {err}") from None
            with self._lock:
                return self._rest_delete(rt, route.namespace, route.name or "", options, dry_run)
        if method == "PUT" and route.name is not None:
            obj = _inbound(rt, _decode_object(rt, raw))
            with self._lock:
                return 200, self._rest_update(route, obj, dry_run)
        if method == "PATCH" and route.name is not None:
            with self._lock:
                return 200, self._rest_patch(route, content_type, raw, dry_run)
        raise _method_not_allowed()

    def _get_or_404(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        stored = self._objects.get(self._key(rt, namespace, name))
        if stored is None:
            raise not_found(rt, name)
        return copy.deepcopy(stored)

    def _selection(self, route: _Route, query: Mapping[str, str]) -> Selection:
        fields = parse_field_selector(route.rt, query.get("fieldSelector", ""))
        if route.legacy_watch and route.name is not None:
            fields.append(FieldRequirement("metadata.name", "=", route.name))
        return Selection(
            route.rt,
            route.namespace,
            tuple(parse_label_selector(query.get("labelSelector", ""))),
            tuple(fields),
        )

    def _matching(self, selection: Selection) -> list[Obj]:
        return [
            copy.deepcopy(obj)
            for key, obj in sorted(self._objects.items())
            if key[0] == selection.rt.plural and selection.matches(obj)
        ]

    def _list(self, route: _Route, query: Mapping[str, str]) -> Obj:
        rt = route.rt
        selection = self._selection(route, query)
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise bad_request(f"invalid limit: {query.get('limit')!r}") from None
        token = query.get("continue")
        if token and query.get("resourceVersion"):
            raise bad_request("specifying resource version is not allowed when using continue")
        if query.get("resourceVersion") == "0":
            limit = 0  # served from the watch cache, which ignores limit
        with self._lock:
            if token:
                snap_id, offset, list_rv = _decode_continue(token)
                if list_rv < self._floor or snap_id not in self._snapshots:
                    raise expired(
                        "The provided continue parameter is too old to display a consistent "
                        "list result. You can start a new list without the continue parameter."
                    )
                items = self._snapshots[snap_id][1]
            else:
                items, offset, list_rv = self._matching(selection), 0, self._rv
                snap_id = 0
            end = offset + limit if limit else len(items)
            meta: Obj = {"resourceVersion": str(list_rv)}
            if end < len(items):
                if not snap_id:
                    snap_id = next(self._snapshot_ids)
                    self._snapshots[snap_id] = (list_rv, items)
                meta["continue"] = _encode_continue(snap_id, end, list_rv)
                if not selection.filtered:
                    meta["remainingItemCount"] = len(items) - end
            elif snap_id:
                self._snapshots.pop(snap_id, None)
            page = [_list_item(rt, obj) for obj in items[offset:end]]
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.api_version,
            "metadata": meta,
            "items": page,
        }

    def _rest_create(self, rt: ResourceType, namespace: str | None, obj: Obj, dry_run: bool) -> Obj:
        meta = obj["metadata"]
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request"
                )
            meta["namespace"] = namespace
        if meta.get("resourceVersion"):
            raise ApiError(
                500,
                "InternalError",
                "Internal error occurred: resourceVersion should not be set on objects to be "
                "created",
            )
        for server_field in ("uid", "creationTimestamp", "deletionTimestamp", "generation"):
            meta.pop(server_field, None)
        probe = copy.deepcopy(obj)
        if not probe["metadata"].get("name") and probe["metadata"].get("generateName"):
            probe["metadata"]["name"] = probe["metadata"]["generateName"] + "xxxxx"
        causes = _validation_causes(probe)
        if causes:
            raise invalid(rt, meta.get("name", ""), causes)
        return self._create(rt, obj, keep_uid=False, dry_run=dry_run)

    def _rest_update(self, route: _Route, obj: Obj, dry_run: bool) -> Obj:
        rt, name = route.rt, route.name or ""
        meta = obj["metadata"]
        if meta.get("name") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({name})"
            )
        if rt.namespaced and meta.get("namespace") not in (None, "", route.namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        current = self._get_stored(rt, route.namespace, name)
        self._check_preconditions(rt, name, current, meta)
        return self._store_update(route, current, obj, dry_run)

    def _get_stored(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        current = self._objects.get(self._key(rt, namespace, name))
        if current is None:
            raise not_found(rt, name)
        return current

    @staticmethod
    def _check_preconditions(rt: ResourceType, name: str, current: Obj, meta: Obj) -> None:
        stored = current["metadata"]
        rv = meta.get("resourceVersion")
        if rv and rv != stored["resourceVersion"]:
            raise conflict(rt, name)
        uid = meta.get("uid")
        if uid and uid != stored["uid"]:
            raise conflict(
                rt,
                name,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{stored['uid']}",
            )

    def _store_update(self, route: _Route, current: Obj, new: Obj, dry_run: bool) -> Obj:
        """Validate and store an updated object, keeping what its (sub)resource may not change."""
        rt = route.rt
        if rt.status_subresource:
            if route.subresource == "status":
                status = new.get("status")
                new = copy.deepcopy(current)
                if status is None:
                    new.pop("status", None)
                else:
                    new["status"] = status
            elif "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        new.setdefault("metadata", {})["name"] = current["metadata"]["name"]
        causes = _validation_causes(new)
        if causes:
            raise invalid(rt, current["metadata"]["name"], causes)
        return self._write(rt, current, new, dry_run=dry_run)

    @staticmethod
    def _patch_type(rt: ResourceType, content_type: str | None) -> str:
        """The patch's media type, 415 unless this resource accepts it."""
        patch_type = (content_type or "").split(";")[0].strip()
        if patch_type not in rt.patch_types:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(rt.patch_types)}",
            )
        return patch_type

    @staticmethod
    def _apply_patch(patch_type: str, current: Obj, patch: Any) -> Any:
        """The patched object, with the errors the API server gives a patch of the wrong shape
        for its type (a JSON patch must be a list of ops, the merge kinds an object)."""
        if patch_type == JSON_PATCH:
            if not isinstance(patch, list) or not all(isinstance(op, dict) for op in patch):
                raise bad_request(
                    f"json: cannot unmarshal {_json_type(patch)} into Go value of type "
                    "jsonpatch.Patch"
                )
            try:
                return json_patch(current, patch)
            except JsonPatchError:
                raise ApiError(
                    422,
                    "Invalid",
                    "the server rejected our request due to an error in our request",
                    {},
                ) from None
        if not isinstance(patch, dict):
            if patch_type == MERGE_PATCH:
                raise bad_request("Invalid JSON Patch")
            raise bad_request(
                f"json: cannot unmarshal {_json_type(patch)} into Go value of type "
                "map[string]interface {}"
            )
        if patch_type == MERGE_PATCH:
            return merge_patch(current, patch)
        return strategic_merge_patch(current, patch)

    @staticmethod
    def _check_patched(patched: Obj, name: str) -> None:
        """A patch may not break metadata's types or rename the object (422 / 400)."""
        type_errors = _metadata_type_errors(patched)
        if type_errors:
            raise ApiError(
                422,
                "Invalid",
                f"patch: Invalid value: {json.dumps(patched)}: {type_errors[0]}",
                {"causes": [{"reason": "FieldValueInvalid", "field": "patch"}]},
            )
        meta = patched["metadata"]
        if meta.get("name") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({name})"
            )

    def _rest_patch(
        self, route: _Route, content_type: str | None, raw: bytes, dry_run: bool
    ) -> Obj:
        rt, name = route.rt, route.name or ""
        patch_type = self._patch_type(rt, content_type)
        try:
            patch = json.loads(raw)
        except ValueError as err:
            raise bad_request(f"error decoding patch: {err}") from None
        current = self._get_stored(rt, route.namespace, name)
        # A patch applies to the object as the route's version shows it.
        patched = self._apply_patch(patch_type, _outbound(rt, copy.deepcopy(current)), patch)
        if not isinstance(patched, dict):
            patched = {}
        elif "metadata" in patched:
            patched = _inbound(rt, patched)
        self._check_patched(patched, name)
        self._check_preconditions(rt, name, current, patched["metadata"])
        return self._store_update(route, current, patched, dry_run)

    def _rest_delete(
        self, rt: ResourceType, namespace: str | None, name: str, options: Obj, dry_run: bool
    ) -> tuple[int, Obj]:
        current = self._get_stored(rt, namespace, name)
        preconditions = options.get("preconditions") or {}
        stored = current["metadata"]
        if preconditions.get("uid") and preconditions["uid"] != stored["uid"]:
            raise conflict(
                rt,
                name,
                f"Precondition failed: UID in precondition: {preconditions['uid']}, UID in "
                f"object meta: {stored['uid']}",
            )
        rv = preconditions.get("resourceVersion")
        if rv and rv != stored["resourceVersion"]:
            raise conflict(
                rt,
                name,
                f"Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion "
                f"in object meta: {stored['resourceVersion']}",
            )
        if stored.get("finalizers"):  # pending until the finalizers are removed
            if dry_run or "deletionTimestamp" in stored:
                return 202, copy.deepcopy(current)
            terminating = copy.deepcopy(current)
            terminating["metadata"]["deletionTimestamp"] = self._now()
            terminating["metadata"]["deletionGracePeriodSeconds"] = 0
            return 202, self._commit(rt, current, terminating)
        gone = copy.deepcopy(current) if dry_run else self._remove(rt, current)
        if rt.returns_deleted_object:
            return 200, gone
        return 200, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": _details(rt, name, uid=stored["uid"]),
        }

    def _delete_collection(self, route: _Route, query: Mapping[str, str], dry_run: bool) -> Obj:
        selection = self._selection(route, query)
        with self._lock:
            removed = []
            for obj in self._matching(selection):
                meta = obj["metadata"]
                current = self._objects[self._key(route.rt, meta.get("namespace"), meta["name"])]
                removed.append(
                    copy.deepcopy(current) if dry_run else self._remove(route.rt, current)
                )
            rv = self._rv
        return {
            "kind": f"{route.rt.kind}List",
            "apiVersion": route.rt.api_version,
            "metadata": {"resourceVersion": str(rv)},
            "items": [_list_item(route.rt, obj) for obj in removed],
        }

    # watch

    def _serve_watch(self, h: _Handler, route: _Route, query: Mapping[str, str]) -> None:
        rt = route.rt
        selection = self._selection(route, query)
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        initial_end = bookmarks and _truthy(query.get("sendInitialEvents"))
        rv_param = query.get("resourceVersion") or ""
        limits = []
        if query.get("timeoutSeconds"):
            try:
                limits.append(float(int(query["timeoutSeconds"])))
            except ValueError:
                raise bad_request(f"invalid timeoutSeconds: {query['timeoutSeconds']!r}") from None
        if self.max_watch_seconds is not None:
            limits.append(self.max_watch_seconds)
        deadline = time.monotonic() + min(limits) if limits else None
        try:
            cursor = int(rv_param) if rv_param else 0
        except ValueError:
            raise bad_request(f"invalid resource version: {rv_param}") from None
        watch = _Watch(h, selection, bookmarks)
        with self._lock:
            expired_rv = None
            initial: list[Obj] = []
            if rv_param in ("", "0"):
                initial, cursor = self._matching(selection), self._rv
            elif cursor < self._floor:
                expired_rv = self._floor
            watch.bookmarks_sent = len(self._bookmark_rvs)
            if expired_rv is None:
                self._watches.append(watch)
                self._watches_opened += 1
                self._changed.notify_all()
        try:
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Cache-Control", "no-cache, private")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            if expired_rv is not None:
                message = f"too old resource version: {cursor} ({expired_rv})"
                _write_event(h, "ERROR", expired(message).status())
                h.wfile.write(b"0\r\n\r\n")
                return
            for obj in initial:
                _write_event(h, "ADDED", _outbound(rt, obj))
            if initial_end:
                marker = _bookmark(rt, cursor, {"k8s.io/initial-events-end": "true"})
                _write_event(h, "BOOKMARK", marker)
            if self._stream(h, watch, cursor, deadline):
                h.wfile.write(b"0\r\n\r\n")  # a clean end of stream
            else:
                h.close_connection = True
        except OSError:
            h.close_connection = True
        finally:
            with self._lock:
                if watch in self._watches:
                    self._watches.remove(watch)

    def _stream(self, h: _Handler, watch: _Watch, cursor: int, deadline: float | None) -> bool:
        """Send events until the deadline (True: end cleanly) or a drop/stop, or the client
        hanging up on a frozen watch (False)."""
        rt = watch.selection.rt
        next_bookmark = (
            time.monotonic() + self.bookmark_interval
            if watch.bookmarks and self.bookmark_interval
            else None
        )
        # The watch cache's last bookmark, 2 s before the deadline (cacheWatcher.nextBookmarkTime).
        final_bookmark = (
            deadline - 2.0
            if watch.bookmarks and deadline is not None and deadline - 2.0 > time.monotonic()
            else None
        )
        while True:
            out: list[tuple[str, Obj]] = []
            with self._changed:
                while True:
                    if watch.dropped:
                        return False
                    if watch.frozen:
                        # Nothing goes out; only notice the client giving up, so this thread
                        # ends with its connection.
                        self._changed.wait(0.05)
                        if _peer_closed(h.connection):
                            return False
                        continue
                    if cursor < self._floor and self._rv > cursor:
                        message = f"too old resource version: {cursor} ({self._floor})"
                        out.append(("ERROR", expired(message).status()))
                        break
                    pending = [e for e in self._history if e.rv > cursor]
                    asked = None  # a bookmark() due on this watch, after the events before it
                    if watch.bookmarks and watch.bookmarks_sent < len(self._bookmark_rvs):
                        asked = self._bookmark_rvs[watch.bookmarks_sent]
                        pending = [e for e in pending if e.rv <= asked]
                    if pending:
                        cursor = pending[-1].rv
                        out.extend(_convert(watch.selection, e) for e in pending)
                        out = [item for item in out if item[0]]
                        if out:
                            break
                        continue
                    now = time.monotonic()
                    if asked is not None:
                        watch.bookmarks_sent += 1
                        out.append(("BOOKMARK", _bookmark(rt, max(asked, cursor))))
                        break
                    if next_bookmark is not None and now >= next_bookmark:
                        next_bookmark = now + (self.bookmark_interval or 0)
                        out.append(("BOOKMARK", _bookmark(rt, cursor)))
                        break
                    if final_bookmark is not None and now >= final_bookmark:
                        final_bookmark = None
                        out.append(("BOOKMARK", _bookmark(rt, cursor)))
                        break
                    if deadline is not None and now >= deadline:
                        return True
                    timers = (deadline, next_bookmark, final_bookmark)
                    waits = [t - now for t in timers if t is not None]
                    self._changed.wait(min(waits) if waits else None)
            for kind, obj in out:
                _write_event(h, kind, obj)
                if kind == "ERROR":
                    return True


def _cut(conn: socket.socket) -> None:
    """Close a connection abruptly, under whoever is reading or writing it."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


def _peer_closed(conn: socket.socket) -> bool:
    """Whether the client has hung up (EOF or an error pending), without reading its data."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset, or already closed under us
        return True


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "t", "true")


def _no_such_resource() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def _method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def _decode_object(rt: ResourceType, raw: bytes) -> Obj:
    try:
        obj = json.loads(raw)
    except ValueError as err:
        raise bad_request(
            f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {err}'
        ) from None
    if not isinstance(obj, dict):
        raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}')
    if (
        obj.get("kind", rt.kind) != rt.kind
        or obj.get("apiVersion", rt.api_version) != rt.api_version
    ):
        raise bad_request(
            f"the API version in the data ({obj.get('apiVersion')}) does not match the expected "
            f"API version ({rt.api_version})"
        )
    obj.setdefault("metadata", {})
    errors = _metadata_type_errors(obj)
    if errors:
        raise bad_request(
            f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {errors[0]}'
        )
    return obj


def _list_item(rt: ResourceType, obj: Obj) -> Obj:
    """Items of built-in lists carry no kind/apiVersion on the wire; custom resources do."""
    if rt.builtin:
        return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    return obj


def _bookmark(rt: ResourceType, rv: int, annotations: Mapping[str, str] | None = None) -> Obj:
    meta: Obj = {"resourceVersion": str(rv)}
    if rt.builtin:
        meta["creationTimestamp"] = None
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}


def _convert(selection: Selection, event: _Event) -> tuple[str, Obj]:
    """What a watch under `selection` sees of one event ("" for nothing): objects moving into
    the selection are ADDED, objects moving out DELETED with their previous content."""
    kind, obj = _convert_stored(selection, event)
    return kind, _outbound(selection.rt, obj) if kind and kind != "ERROR" else obj


def _convert_stored(selection: Selection, event: _Event) -> tuple[str, Obj]:
    if event.rt.group_resource != selection.rt.group_resource:  # a version's watch sees all
        return "", {}
    now = selection.matches(event.obj)
    before = event.old is not None and selection.matches(event.old)
    if event.type == "DELETED":
        return ("DELETED", event.obj) if before else ("", {})
    if event.type == "ADDED":
        return ("ADDED", event.obj) if now else ("", {})
    if now and before:
        return "MODIFIED", event.obj
    if now:
        return "ADDED", event.obj
    if before and event.old is not None:
        gone = copy.deepcopy(event.old)
        gone["metadata"]["resourceVersion"] = str(event.rv)
        return "DELETED", gone
    return "", {}


def _write_event(h: BaseHTTPRequestHandler, kind: str, obj: Obj) -> None:
    line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
    h.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
    h.wfile.flush()


def _encode_continue(snap_id: int, offset: int, rv: int) -> str:
    token = {"v": "meta.k8s.io/v1", "rv": rv, "snap": snap_id, "start": offset}
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, int, int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(data["snap"]), int(data["start"]), int(data["rv"])
    except (ValueError, KeyError, TypeError):
        raise bad_request(f"continue key is not valid: {token!r}") from None


def _api_resources(rt: ResourceType) -> list[Obj]:
    main: Obj = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": ALL_VERBS,
    }
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    resources = [main]
    if rt.status_subresource:
        resources.append(
            {
                "name": f"{rt.plural}/status",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["get", "patch", "update"],
            }
        )
    return resources


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' order of versions: GA before beta before alpha, higher numbers first
    (apimachinery's version.CompareKubeAwareVersionStrings)."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if match is None:
        return (3, 0, 0)
    major, stage, minor = match.groups()
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -int(major), -int(minor or 0))


def _api_group(group: str, types: Iterable[ResourceType]) -> Obj:
    served = {rt.version for rt in types if rt.group == group}
    versions = [
        {"groupVersion": f"{group}/{v}", "version": v}
        for v in sorted(served, key=_version_priority)
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}

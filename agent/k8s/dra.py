"""From Kubernetes objects to DRA GPU allocations: pure functions, tested on literal objects.

Three kinds of object say which GPU a container was given through DRA (`resource.k8s.io`,
`v1` from Kubernetes 1.34, `v1beta2` from 1.33, `v1beta1` from 1.32: every shape is read):

- the pod: `spec.resourceClaims[]` names each claim it uses (`resourceClaimName`, or a
  `resourceClaimTemplateName` from which the control plane makes one, whose generated name is
  in `status.resourceClaimStatuses[]`), and `spec.containers[].resources.claims[]` which
  container uses which claim (and optionally only one `request` of it);
- the ResourceClaim: `status.allocation.devices.results[]` (request, driver, pool, device)
  and `status.reservedFor[]` (the pods allowed to use it: several for a shared claim);
- the driver's ResourceSlices for this node (`spec.nodeName`): `spec.devices[]`, each named
  within its pool and carrying attributes. NVIDIA's driver names devices `gpu-<minor>` and
  `gpu-<minor>-mig-<profile id>-<start>-<size>` and publishes `type` ("gpu", "mig"),
  `uuid`, `parentUUID` (MIG), `productName`, `profile`, `pcieBusID`, ...; an attribute name
  without a domain belongs to the driver, so `uuid` and `gpu.nvidia.com/uuid` are the same.

The kubelet's PodResources answer names the same claims, but its CDI device names
(`k8s.gpu.nvidia.com/device=gpu-0`, `k8s.gpu.nvidia.com/claim=<claim uid>-gpu-0`) carry no
UUID: only the slices can turn a device name into a GPU.

Where the versions differ: a `v1beta1` slice device keeps its attributes (and counters) under
`basic`, `v1beta2` and `v1` on the device itself; a `v1beta1` claim request has its
`adminAccess` on the request, later ones under `exactly`. Every version's allocation results
say `adminAccess` (from 1.32). A device allocated for **admin access** (a monitoring pod
that inspects a GPU another claim holds) is not an allocation: it is left out, or the GPU
would count the monitor as a second holder.

A device without a `uuid` attribute (NVIDIA's dynamic MIG devices: the MIG device exists only
once prepared, so the driver cannot publish its UUID) counts for its GPU: by its `parentUUID`
attribute, or where it has none by its placement: the counter set it consumes from
(`consumesCounters`, partitionable devices) that a whole GPU of the same pool (a device with
a `uuid` and type `gpu`) consumes from too, else its name (`gpu-<minor>-mig-...` is a
partition of the pool's `gpu-<minor>`). Only a device that none of these places is left
out, and said.

`parse_*` keep only what the join needs (a watch over every claim of a cluster holds small
records), returning None for an object with nothing to keep.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuscope.agent.k8s.dra_records import DraAllocation, DraSnapshot

DeviceKey = tuple[str, str, str]  # driver, pool, device name
ClaimKey = tuple[str, str]  # namespace, name


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """A device a ResourceSlice publishes; `uuid` "" when it has no `uuid` attribute."""

    driver: str
    pool: str
    name: str
    uuid: str
    type: str = ""
    parent_uuid: str = ""
    slice: str = ""  # the ResourceSlice's name, for log lines
    counter_sets: tuple[str, ...] = ()  # the counter sets it consumes from (its placement)


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One device of a claim's allocation results: the request it was allocated for, and its name
    (driver, pool, device), which the driver's ResourceSlices turn into a GPU."""

    request: str  # "<request>" or "<request>/<subrequest>" (firstAvailable)
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class Claim:
    """A ResourceClaim's GPU results and the pods it is reserved for (`parse_claim`)."""

    namespace: str
    name: str
    results: tuple[AllocatedDevice, ...]  # the GPU drivers' results only
    reserved_for: frozenset[str]  # pod UIDs


@dataclass(frozen=True, slots=True)
class ContainerClaim:
    """One container's use of one of its pod's claims (`resources.claims[]`), or of one request
    of it."""

    container: str
    claim: str  # the pod's name for the claim (spec.resourceClaims[].name)
    request: str  # "" for every request of the claim


@dataclass(frozen=True, slots=True)
class PodClaims:
    """A pod's claims and which container uses which (`parse_pod`)."""

    uid: str
    namespace: str
    name: str
    # The pod's claim name -> the ResourceClaim's name; "" while a template's claim is not
    # generated yet.
    claims: Mapping[str, str]
    containers: tuple[ContainerClaim, ...]


def _strings(value: Any) -> Iterable[Mapping[str, Any]]:
    """The objects of a list field; anything else in it (or a field that is no list) is
    skipped: the API validates what it stores, so this guards only against a bug there."""
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, Mapping)]


def _at(obj: Any, *path: str) -> Any:
    """A nested field, None where any step is missing or not an object."""
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _attribute(attributes: Mapping[str, Any], driver: str, name: str) -> str:
    """A string (or version) attribute, by its short or driver-qualified name."""
    for key in (name, f"{driver}/{name}"):
        value = attributes.get(key)
        if isinstance(value, Mapping):
            text = value.get("string", value.get("version"))
            if isinstance(text, str):
                return text
    return ""


def parse_slice(
    obj: Mapping[str, Any], drivers: Collection[str]
) -> tuple[str, tuple[SliceDevice, ...] | None]:
    """A ResourceSlice's devices (by slice name), None when its driver publishes no GPUs."""
    meta, spec = _map(obj.get("metadata")), _map(obj.get("spec"))
    name = str(meta.get("name", ""))
    driver = str(spec.get("driver", ""))
    if driver not in drivers:
        return name, None
    pool = str(_map(spec.get("pool")).get("name", ""))
    devices = []
    for device in _strings(spec.get("devices")):
        body = _map(device.get("basic")) or device  # v1beta1 nests it under `basic`
        attributes = _map(body.get("attributes"))
        devices.append(
            SliceDevice(
                driver=driver,
                pool=pool,
                name=str(device.get("name", "")),
                uuid=_attribute(attributes, driver, "uuid"),
                type=_attribute(attributes, driver, "type"),
                parent_uuid=_attribute(attributes, driver, "parentUUID"),
                slice=name,
                counter_sets=tuple(
                    str(c["counterSet"])
                    for c in _strings(body.get("consumesCounters"))
                    if c.get("counterSet")
                ),
            )
        )
    return name, tuple(devices)


def _admin_requests(spec: Mapping[str, Any]) -> frozenset[str]:
    """The claim's requests for admin access (v1beta1: on the request; later: `exactly`)."""
    return frozenset(
        str(r.get("name", ""))
        for r in _strings(_at(spec, "devices", "requests"))
        if (_map(r.get("exactly")) or r).get("adminAccess") is True
    )


def parse_claim(
    obj: Mapping[str, Any], drivers: Collection[str], node_name: str = ""
) -> tuple[ClaimKey, Claim | None]:
    """A ResourceClaim's GPU results and the pods it is reserved for; None while it is not
    allocated, allocated no GPU, or (with `node_name`) allocated on another node."""
    meta, status = _map(obj.get("metadata")), _map(obj.get("status"))
    key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    if node_name and not _may_be_on(_at(status, "allocation", "nodeSelector"), node_name):
        return key, None
    devices = _at(status, "allocation", "devices", "results")
    # Admin access is not allocation: the allocator copies the request's flag into each
    # result (1.32+); the request is read too, for a result written without it.
    admin = _admin_requests(_map(obj.get("spec")))
    results = tuple(
        AllocatedDevice(
            request=str(r.get("request", "")),
            driver=str(r.get("driver", "")),
            pool=str(r.get("pool", "")),
            device=str(r.get("device", "")),
        )
        for r in _strings(devices)
        if r.get("driver") in drivers
        and r.get("adminAccess") is not True
        and str(r.get("request", "")).split("/")[0] not in admin
    )
    if not results:
        return key, None
    reserved = frozenset(
        str(ref["uid"])
        for ref in _strings(status.get("reservedFor"))
        if ref.get("uid") and ref.get("resource", "pods") == "pods" and not ref.get("apiGroup")
    )
    return key, Claim(namespace=key[0], name=key[1], results=results, reserved_for=reserved)


def _may_be_on(selector: Any, node_name: str) -> bool:
    """False only where the allocation's node selector pins it to other nodes by name.

    For devices of a slice with `spec.nodeName` the scheduler's allocator writes exactly
    that: one term, `matchFields` `metadata.name In [<node>]`. Every other shape (no
    selector: devices reachable from any node; label expressions) is kept, since a node's
    labels are not known here; the join still needs this node's slices to name a device.
    """
    terms = _strings(_at(selector, "nodeSelectorTerms"))
    if not terms:
        return True
    for term in terms:
        fields = list(_strings(term.get("matchFields")))
        by_name = [
            f for f in fields if f.get("key") == "metadata.name" and f.get("operator") == "In"
        ]
        if term.get("matchExpressions") or not fields or len(by_name) != len(fields):
            return True  # a shape not read here: kept
        if all(node_name in (f.get("values") or ()) for f in by_name):
            return True
    return False


def parse_pod(obj: Mapping[str, Any]) -> tuple[str, PodClaims | None]:
    """A pod's claims and which container uses which (by pod UID); None without claims."""
    meta, spec, status = _map(obj.get("metadata")), _map(obj.get("spec")), _map(obj.get("status"))
    uid = str(meta.get("uid", ""))
    generated = {
        str(s.get("name", "")): str(s.get("resourceClaimName") or "")
        for s in _strings(status.get("resourceClaimStatuses"))
    }
    claims: dict[str, str] = {}
    for entry in _strings(spec.get("resourceClaims")):
        name = str(entry.get("name", ""))
        if entry.get("resourceClaimName"):
            claims[name] = str(entry["resourceClaimName"])
        else:  # from a ResourceClaimTemplate: the name the control plane generated, if yet
            claims[name] = generated.get(name, "")
    if not claims:
        return uid, None
    containers = tuple(
        ContainerClaim(
            str(c.get("name", "")), str(ref.get("name", "")), str(ref.get("request") or "")
        )
        for key in ("initContainers", "containers")
        for c in _strings(spec.get(key))
        for ref in _strings(_at(c, "resources", "claims"))
    )
    return uid, PodClaims(
        uid=uid,
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        claims=claims,
        containers=containers,
    )


def _wanted(result: AllocatedDevice, request: str) -> bool:
    """A container naming `request` gets that request's devices, its subrequests' included."""
    return not request or result.request == request or result.request.startswith(request + "/")


def resolve(
    pods: Iterable[PodClaims],
    claims: Mapping[ClaimKey, Claim],
    slices: Iterable[Iterable[SliceDevice]],
) -> DraSnapshot:
    """The GPU allocations of `pods` (this node's), through their claims and this node's
    slices. A claim counts for a pod only once it is reserved for that pod (a shared claim:
    for each pod it is reserved for); a claim not allocated yet, or not reserved yet, gives
    nothing. A device without a `uuid` attribute counts for its GPU (`parent_uuid`, from its
    `parentUUID` attribute or its counter set); one that names no GPU either way, or that no
    slice of this node publishes, is left out and said once in `unresolved`."""
    devices: dict[DeviceKey, SliceDevice] = {}
    for published in slices:
        for d in published:
            devices[(d.driver, d.pool, d.name)] = d
    parents = _whole_gpus_by_counter_set(devices.values())
    allocations: dict[DraAllocation, None] = {}
    unresolved: dict[str, None] = {}
    for pod in pods:
        for use in pod.containers:
            claim_name = pod.claims.get(use.claim, "")
            claim = claims.get((pod.namespace, claim_name)) if claim_name else None
            if claim is None or pod.uid not in claim.reserved_for:
                continue
            for result in claim.results:
                if not _wanted(result, use.request):
                    continue
                device = devices.get((result.driver, result.pool, result.device))
                where = (
                    f"claim {pod.namespace}/{claim.name} (pod {pod.name}) device "
                    f"{result.driver}/{result.pool}/{result.device}"
                )
                if device is None:
                    unresolved[f"{where}: no ResourceSlice of this node publishes it"] = None
                    continue
                parent = device.parent_uuid or _placed_on(device, parents, devices)
                if not device.uuid and not parent:
                    unresolved[
                        f"{where}: its ResourceSlice {device.slice} gives it no uuid attribute, "
                        "no parentUUID, and no counter set or name of a published GPU"
                    ] = None
                    continue
                allocation = DraAllocation(
                    namespace=pod.namespace,
                    pod=pod.name,
                    container=use.container,
                    claim=claim.name,
                    request=result.request,
                    driver=result.driver,
                    pool=result.pool,
                    device=result.device,
                    device_uuid=device.uuid,
                    device_type=device.type,
                    parent_uuid=parent,
                )
                allocations[allocation] = None
    return DraSnapshot(allocations=tuple(allocations), unresolved=tuple(unresolved))


def _placed_on(
    device: SliceDevice, parents: Mapping[DeviceKey, str], devices: Mapping[DeviceKey, SliceDevice]
) -> str:
    """The UUID of the whole GPU a device without a `parentUUID` is on, "" if unknown: by the
    counter set it consumes from, else by NVIDIA's names, `gpu-<minor>-mig-...` being a
    partition of `gpu-<minor>` in the same pool (deviceinfo.go's canonical names)."""
    for cs in device.counter_sets:
        if (device.driver, device.pool, cs) in parents:
            return parents[(device.driver, device.pool, cs)]
    whole, sep, _ = device.name.partition("-mig-")
    gpu = devices.get((device.driver, device.pool, whole)) if sep else None
    return gpu.uuid if gpu is not None and gpu.type == "gpu" else ""


def _whole_gpus_by_counter_set(devices: Iterable[SliceDevice]) -> dict[DeviceKey, str]:
    """(driver, pool, counter set) -> the UUID of the whole GPU consuming from it. With
    partitionable devices a GPU and its partitions consume from one counter set of their
    pool, so the set places a partition on its GPU; a set two GPUs share names neither."""
    found: dict[DeviceKey, set[str]] = {}
    for d in devices:
        if d.uuid and d.type == "gpu":
            for cs in d.counter_sets:
                found.setdefault((d.driver, d.pool, cs), set()).add(d.uuid)
    return {key: next(iter(uuids)) for key, uuids in found.items() if len(uuids) == 1}

"""Which GPU (or MIG instance) each container holds, from the kubelet's device lists.

The kubelet only knows the ids that device plugins and DRA drivers advertised, and NVIDIA's
plugin advertises several kinds: a GPU UUID (`GPU-<uuid>`), a MIG instance UUID
(`MIG-<uuid>`, or `MIG-GPU-<uuid>/<gi>/<ci>` from drivers before R470), and, with
time-slicing, one replica id per share (`<uuid>::<n>`). Matching them to the GPUs NVML sees
is pure string work, kept apart from the client so every id shape is tested as a literal.

An id that names no GPU of this node is not an allocation, but it is not noise either: the
kubelet's checkpoint may be stale, or the plugin may be configured with index ids. Such
devices come back in `GpuMatch.unmatched` for the caller to log or count.

AMD's device plugin (ROCm/k8s-device-plugin) advertises a GPU by its PCI address
(`0000:05:00.0`) and the partitions of a compute-partitioned GPU beyond the first as
`amdgpu_xcp_<N>`; under its "mixed" naming strategy each partition mode is a resource of its
own (`amd.com/cpx_nps4`). The caller passes those ids as GPU `aliases` and partition ids.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.k8s.podresources.records import Device, PodDevices

DEFAULT_GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu")
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # nvidia.com/mig-1g.10gb, ... (the "mixed" strategy)
# AMD's partition resources under the plugin's "mixed" strategy: amd.com/cpx_nps4, ...
AMD_PARTITION_RESOURCE = re.compile(r"amd\.com/(?:spx|dpx|tpx|qpx|cpx)_nps\d+")
_REPLICA_SEPARATOR = "::"

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# A GPU or MIG UUID anywhere in a DRA device id (a CDI name such as
# `k8s.gpu.nvidia.com/device=GPU-<uuid>`); the legacy MIG form is tried first, since a plain
# GPU pattern would match inside it.
_UUID_IN_TEXT = re.compile(rf"MIG-GPU-{_UUID}/\d+/\d+|MIG-{_UUID}|GPU-{_UUID}")


@dataclass(frozen=True, slots=True)
class GpuAllocation:
    """A container holding a GPU, a MIG instance of it, or one time-sliced share of either.

    `uuid` is always the physical GPU's; `mig_uuid` is set when the container holds a MIG
    instance. `shared_replica` is the replica number of a time-sliced share, None when the
    container was given the device outright.
    """

    uuid: str
    mig_uuid: str | None
    namespace: str
    pod: str
    container: str
    shared_replica: int | None = None


@dataclass(frozen=True, slots=True)
class UnmatchedDevice:
    """A GPU-resource device whose id names no GPU or MIG instance of this node."""

    namespace: str
    pod: str
    container: str
    device: Device


@dataclass(frozen=True, slots=True)
class GpuMatch:
    """What the kubelet's GPU-resource devices came to: allocations of this node's GPUs, and the
    devices whose ids name none of them (for the caller to log or count)."""

    allocations: tuple[GpuAllocation, ...]
    unmatched: tuple[UnmatchedDevice, ...]


def gpu_allocations(
    pods: Iterable[PodDevices],
    resource_names: Sequence[str] = DEFAULT_GPU_RESOURCES,
    *,
    gpu_uuids: Collection[str],
    mig_uuids: Mapping[str, str],
    aliases: Mapping[str, str] | None = None,
) -> tuple[GpuAllocation, ...]:
    """The GPU allocations of `pods`; see `match_gpus`, which also returns what did not match."""
    return match_gpus(
        pods, resource_names, gpu_uuids=gpu_uuids, mig_uuids=mig_uuids, aliases=aliases
    ).allocations


def match_gpus(
    pods: Iterable[PodDevices],
    resource_names: Sequence[str] = DEFAULT_GPU_RESOURCES,
    *,
    gpu_uuids: Collection[str],
    mig_uuids: Mapping[str, str],
    aliases: Mapping[str, str] | None = None,
) -> GpuMatch:
    """Match every device of every container against this node's GPUs.

    Device-plugin devices count when their resource is in `resource_names` or is a MIG
    resource (`nvidia.com/mig-*`); add renamed resources such as `nvidia.com/gpu.shared` to
    `resource_names`. DRA devices count whatever their driver, when their id contains a GPU
    or MIG UUID. `gpu_uuids` are the node's GPUs and `mig_uuids` maps each partition's ids
    (a MIG instance's UUID; an AMD partition's UUID, PCI address or `amdgpu_xcp_<N>`) to its
    GPU's UUID; `aliases` maps other ids of whole GPUs (AMD's PCI addresses) to their UUID.
    AMD's partition resources (`amd.com/cpx_nps4`) count as MIG resources do. A container
    listing the same device twice yields one allocation; a GPU shared by several containers
    yields one allocation per container.
    """
    wanted = frozenset(resource_names)
    gpus = frozenset(gpu_uuids)
    alias = aliases or {}
    allocations: dict[GpuAllocation, None] = {}  # ordered and deduplicated
    unmatched: list[UnmatchedDevice] = []
    for pod in pods:
        for container in pod.containers:
            for device in container.devices:
                if device.source == "dra":
                    found = _UUID_IN_TEXT.search(device.device_id)
                    if found is None:
                        continue  # not a GPU, or one that names no UUID: nothing to match
                    target = _resolve(found.group(0), gpus, mig_uuids, alias)
                    replica = None
                elif (
                    device.resource_name in wanted
                    or device.resource_name.startswith(MIG_RESOURCE_PREFIX)
                    or AMD_PARTITION_RESOURCE.fullmatch(device.resource_name)
                ):
                    device_id, replica = _split_replica(device.device_id)
                    target = _resolve(device_id, gpus, mig_uuids, alias)
                else:
                    continue
                if target is None:
                    unmatched.append(
                        UnmatchedDevice(pod.namespace, pod.name, container.name, device)
                    )
                    continue
                uuid, mig_uuid = target
                allocation = GpuAllocation(
                    uuid=uuid,
                    mig_uuid=mig_uuid,
                    namespace=pod.namespace,
                    pod=pod.name,
                    container=container.name,
                    shared_replica=replica,
                )
                allocations[allocation] = None
    return GpuMatch(allocations=tuple(allocations), unmatched=tuple(unmatched))


def _split_replica(device_id: str) -> tuple[str, int | None]:
    """`<id>::<n>` is replica n of a time-sliced device; anything else is the device itself."""
    base, separator, replica = device_id.rpartition(_REPLICA_SEPARATOR)
    if separator and base and replica.isascii() and replica.isdigit():
        return base, int(replica)
    return device_id, None


def _resolve(
    device_id: str,
    gpus: frozenset[str],
    mig_uuids: Mapping[str, str],
    aliases: Mapping[str, str] | None = None,
) -> tuple[str, str | None] | None:
    """(GPU UUID, partition id or None) for a GPU or partition id of this node, else None.
    A partition's id wins over a GPU alias: a partitioned AMD GPU's PCI address names its
    first partition."""
    if device_id in gpus:
        return device_id, None
    parent = mig_uuids.get(device_id)
    if parent is not None:
        return parent, device_id
    if aliases and device_id in aliases:
        return aliases[device_id], None
    if device_id.startswith("MIG-GPU-"):
        # Pre-R470 MIG UUIDs carry their parent: MIG-GPU-<uuid>/<gi>/<ci>.
        parent = device_id[len("MIG-") :].split("/", 1)[0]
        if parent in gpus:
            return parent, device_id
    return None

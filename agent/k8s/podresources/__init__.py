"""The kubelet's PodResources API: which devices, GPUs above all, each container was given.

`PodResourcesClient` reads the API into the records of `records`; `gpu_allocations` matches
those to the node's GPUs and MIG instances. Both are usable without the other, and only the
client needs protobuf and h2: it is imported on first use, so the records and the matching
(which the attribution stage uses on every scrape) do not cost every agent their imports.
"""

from typing import Any

from gpuscope.agent.k8s.podresources.gpus import (
    GpuAllocation,
    GpuMatch,
    UnmatchedDevice,
    gpu_allocations,
    match_gpus,
)
from gpuscope.agent.k8s.podresources.records import (
    ContainerDevices,
    Device,
    DeviceSource,
    PodDevices,
)

_CLIENT_NAMES = frozenset(
    {
        "DEFAULT_SOCKET",
        "PodResourcesClient",
        "PodResourcesGetUnsupported",
        "PodResourcesUnavailable",
    }
)


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        from gpuscope.agent.k8s.podresources import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_SOCKET",
    "ContainerDevices",
    "Device",
    "DeviceSource",
    "GpuAllocation",
    "GpuMatch",
    "PodDevices",
    "PodResourcesClient",
    "PodResourcesGetUnsupported",
    "PodResourcesUnavailable",
    "UnmatchedDevice",
    "gpu_allocations",
    "match_gpus",
]

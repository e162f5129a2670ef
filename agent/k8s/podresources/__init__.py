"""The kubelet's PodResources API: which devices, GPUs above all, each container was given.

`PodResourcesClient` reads the API into the records of `records`; `gpu_allocations` matches
those to the node's GPUs and MIG instances. Both are usable without the other.
"""

import os

# gRPC's core logs to stderr from INFO up, in its own format (a line on every kubelet restart,
# for one). The agent reports failures itself, once per change, so it keeps gRPC's errors only;
# someone debugging gRPC can still set GRPC_VERBOSITY. gRPC reads the variable when it is first
# imported, so this must run before the client module imports it.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from agent.k8s.podresources.client import (
    DEFAULT_SOCKET,
    PodResourcesClient,
    PodResourcesGetUnsupported,
    PodResourcesUnavailable,
)
from agent.k8s.podresources.gpus import (
    GpuAllocation,
    GpuMatch,
    UnmatchedDevice,
    gpu_allocations,
    match_gpus,
)
from agent.k8s.podresources.records import (
    ContainerDevices,
    Device,
    DeviceSource,
    PodDevices,
)

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

"""Immutable records of what the kubelet says it gave each container.

The kubelet answers with one entry per resource listing several device ids; these records
hold one `Device` per id instead, because everything downstream (matching a GPU, counting,
labelling a series) works per device and would otherwise have to flatten again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DeviceSource = Literal["device_plugin", "dra"]


@dataclass(frozen=True, slots=True)
class Device:
    """One device handed to a container (or, from `allocatable`, known to the kubelet).

    For a device plugin, `resource_name` is the extended resource (`nvidia.com/gpu`) and
    `device_id` the id the plugin advertised (a GPU UUID, `<uuid>::<n>` for a time-sliced
    replica, a MIG UUID). For DRA, `resource_name` is the claim's driver (the claim name when
    the kubelet names no driver) and `device_id` the fully qualified CDI device name
    (`vendor.com/class=name`), or the DRA device name when the driver uses no CDI.
    `numa_nodes` is empty when the kubelet reports no topology, and always for DRA.
    """

    resource_name: str
    device_id: str
    numa_nodes: tuple[int, ...] = ()
    source: DeviceSource = "device_plugin"


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """A container and its devices; a container with none is kept, with `devices` empty."""

    name: str
    devices: tuple[Device, ...]


@dataclass(frozen=True, slots=True)
class PodDevices:
    """A pod the kubelet knows, and each of its containers' devices."""

    namespace: str
    name: str
    containers: tuple[ContainerDevices, ...]


@dataclass(frozen=True, slots=True)
class KubeletSnapshot:
    """One answer of the kubelet's List: every pod it knows and its containers' devices."""

    pods: tuple[PodDevices, ...]
    polled_at: float  # monotonic time of the answer

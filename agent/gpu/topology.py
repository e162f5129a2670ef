"""How the node's GPUs are wired: PCIe distance between every pair, NVLink peers, and the
multi-node NVLink fabric.

PCIe and NVLink peers are read once, at discovery: they do not change while the driver is
loaded, and the GPU x GPU part is N² NVML calls. The fabric is different: a GPU's
registration with the Fabric Manager moves NOT_STARTED -> IN_PROGRESS -> COMPLETED and can
complete after the agent started, and its health changes, so `read_fabric` is cheap (one
call per GPU) and is read again on every labels round."""

from __future__ import annotations

import ctypes
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from gpuscope.agent.gpu.device import Device, nvlink_count
from gpuscope.agent.gpu.nvml import (
    FUNCTION_NOT_FOUND,
    NOT_SUPPORTED,
    GpuLost,
    Nvml,
    NvmlCallError,
    text,
)
from gpuscope.agent.gpu.records import Fabric, GpuTopology, NvLinkPeer

log = logging.getLogger("gpuscope.gpu.topology")

# nvmlGpuTopologyLevel_t -> nvidia-smi topo -m's names.
PCIE_LEVELS: Mapping[int, str] = {
    0: "x", 10: "pix", 20: "pxb", 30: "phb", 40: "node", 50: "sys"
}  # fmt: skip
REMOTE_TYPES: Mapping[int, str] = {0: "gpu", 1: "ibmnpu", 2: "switch"}
FABRIC_COMPLETED = 3  # nvmlGpuFabricState_t: 0 not supported, 1 not started, 2 in progress
ARGUMENT_VERSION_MISMATCH = 25


def read_topology(nvml: Nvml, devices: Sequence[Device]) -> GpuTopology:
    pcie: dict[tuple[int, int], str] = {}
    peers: dict[int, tuple[NvLinkPeer, ...]] = {}
    for i, a in enumerate(devices):
        try:
            for b in devices[i + 1 :]:
                level = nvml.query("nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
                if level is not None:
                    pcie[(a.identity.index, b.identity.index)] = PCIE_LEVELS.get(int(level), "sys")
            peers[a.identity.index] = _peers(nvml, a)
        except GpuLost:
            log.info("GPU %d lost while reading topology", a.identity.index)
    return GpuTopology(pcie=pcie, nvlink_peers=peers, fabric=read_fabric(nvml, devices))


def read_fabric(nvml: Nvml, devices: Sequence[Device]) -> Mapping[int, Fabric]:
    """Each fabric-attached GPU's registration, by GPU index (absent: no fabric)."""
    fabric: dict[int, Fabric] = {}
    for device in devices:
        try:
            found = _fabric(nvml, device)
        except GpuLost:
            continue
        if found is not None:
            fabric[device.identity.index] = found
    return fabric


def _peers(nvml: Nvml, device: Device) -> tuple[NvLinkPeer, ...]:
    ends: Counter[tuple[str, str]] = Counter()
    for link in range(nvlink_count(nvml, device)):
        kind = nvml.query("nvmlDeviceGetNvLinkRemoteDeviceType", device.handle, link)
        if kind is None:
            continue
        pci = nvml.query("nvmlDeviceGetNvLinkRemotePciInfo", device.handle, link)
        bus = text(pci.busId) if pci is not None else ""
        ends[(REMOTE_TYPES.get(int(kind), "unknown"), bus)] += 1
    return tuple(NvLinkPeer(kind, bus, n) for (kind, bus), n in sorted(ends.items()))


def _fabric_info(nvml: Nvml, device: Device) -> Any | None:
    """The versioned nvmlDeviceGetGpuFabricInfoV (v3, else v2) where driver and bindings
    have it; the deprecated unversioned call only where they do not."""
    lib = nvml.lib
    for struct in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t"):
        if hasattr(lib, struct) and hasattr(lib, "nvmlDeviceGetGpuFabricInfoV"):
            info = getattr(lib, struct)()
            try:
                nvml.call(
                    "nvmlDeviceGetGpuFabricInfoV",
                    device.handle,
                    ctypes.byref(info),
                    expected=frozenset({NOT_SUPPORTED, ARGUMENT_VERSION_MISMATCH}),
                )
            except NvmlCallError as exc:
                if exc.code == ARGUMENT_VERSION_MISMATCH:
                    continue  # an older driver: try the previous version
                if exc.code == FUNCTION_NOT_FOUND:
                    break
                return None
            return info
    info = lib.c_nvmlGpuFabricInfo_t()
    if nvml.query("nvmlDeviceGetGpuFabricInfo", device.handle, ctypes.byref(info)) is None:
        return None
    return info


def _fabric(nvml: Nvml, device: Device) -> Fabric | None:
    info = _fabric_info(nvml, device)
    if info is None:
        return None
    state = int(info.state)
    if state != FABRIC_COMPLETED:
        # `status` and the cluster UUID mean nothing before registration completed.
        return Fabric(cluster_uuid="", clique_id=0, completed=False, state=state)
    status = int(info.status)
    raw = bytes(info.clusterUuid)
    h = raw.hex()
    uuid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}" if any(raw) else ""
    return Fabric(
        cluster_uuid=uuid if status == 0 else "",
        clique_id=int(info.cliqueId),
        completed=True,
        state=state,
        status=status,
        health_mask=int(getattr(info, "healthMask", 0)),
    )

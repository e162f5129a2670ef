"""How the node's GPUs are wired: PCIe distance between every pair, NVLink peers, and the
multi-node NVLink fabric. Read once, at discovery: it does not change while the driver is
loaded, and the GPU x GPU part is N² NVML calls."""

from __future__ import annotations

import ctypes
import logging
from collections import Counter
from collections.abc import Mapping, Sequence

from gpuscope.agent.gpu.device import Device, nvlink_count
from gpuscope.agent.gpu.nvml import GpuLost, Nvml, text
from gpuscope.agent.gpu.records import Fabric, GpuTopology, NvLinkPeer

log = logging.getLogger("gpuscope.gpu.topology")

# nvmlGpuTopologyLevel_t -> nvidia-smi topo -m's names.
PCIE_LEVELS: Mapping[int, str] = {
    0: "x", 10: "pix", 20: "pxb", 30: "phb", 40: "node", 50: "sys"
}  # fmt: skip
REMOTE_TYPES: Mapping[int, str] = {0: "gpu", 1: "ibmnpu", 2: "switch"}
FABRIC_COMPLETED = 3


def read_topology(nvml: Nvml, devices: Sequence[Device]) -> GpuTopology:
    pcie: dict[tuple[int, int], str] = {}
    peers: dict[int, tuple[NvLinkPeer, ...]] = {}
    fabric: dict[int, Fabric] = {}
    for i, a in enumerate(devices):
        try:
            for b in devices[i + 1 :]:
                level = nvml.query("nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
                if level is not None:
                    pcie[(a.identity.index, b.identity.index)] = PCIE_LEVELS.get(int(level), "sys")
            peers[a.identity.index] = _peers(nvml, a)
            found = _fabric(nvml, a)
            if found is not None:
                fabric[a.identity.index] = found
        except GpuLost:
            log.info("GPU %d lost while reading topology", a.identity.index)
    return GpuTopology(pcie=pcie, nvlink_peers=peers, fabric=fabric)


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


def _fabric(nvml: Nvml, device: Device) -> Fabric | None:
    lib = nvml.lib
    info = lib.c_nvmlGpuFabricInfo_t()
    if nvml.query("nvmlDeviceGetGpuFabricInfo", device.handle, ctypes.byref(info)) is None:
        return None
    if int(info.status) != 0:
        return None
    raw = bytes(info.clusterUuid)
    if not any(raw):
        return None
    h = raw.hex()
    uuid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return Fabric(cluster_uuid=uuid, clique_id=int(info.cliqueId),
                  completed=int(info.state) == FABRIC_COMPLETED)  # fmt: skip

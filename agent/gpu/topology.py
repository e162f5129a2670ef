"""How the node's GPUs are wired: PCIe distance between every pair, NVLink peers, and the
multi-node NVLink fabric.

PCIe and NVLink peers are read once, at discovery: they do not change while the driver is
loaded, and the GPU x GPU part is N² NVML calls. The fabric is different: a GPU's
registration with the Fabric Manager moves NOT_STARTED -> IN_PROGRESS -> COMPLETED and can
complete after the agent started, and its health changes, so `read_fabric` is cheap (one
call per GPU) and is read again on every labels round.

Each GPU's part is read through `run` (its gate, agent/accelerators/gate.py): a GPU that does not
answer leaves out its own part, not everyone's."""

from __future__ import annotations

import ctypes
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from gpuscope.agent.accelerators.gate import Blocked, RunOnGpu, direct
from gpuscope.agent.gpu.device import Device, nvlink_count
from gpuscope.agent.gpu.nvml import (
    ARGUMENT_VERSION_MISMATCH,
    FUNCTION_NOT_FOUND,
    GpuLost,
    Nvml,
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


def read_topology(nvml: Nvml, devices: Sequence[Device], run: RunOnGpu = direct) -> GpuTopology:
    """PCIe levels of every pair (asked of the first GPU of the pair), NVLink peers and
    fabric; a GPU that does not answer (lost, or blocked in `run`) has no part of its own."""
    pcie: dict[tuple[int, int], str] = {}
    peers: dict[int, tuple[NvLinkPeer, ...]] = {}
    for i, a in enumerate(devices):
        try:
            got = run(a, partial(_device_topology, nvml, a, devices[i + 1 :]))
        except GpuLost:
            log.info("GPU %d lost while reading topology", a.identity.index)
            continue
        if isinstance(got, Blocked):
            log.info("GPU %d does not answer: its topology is left out", a.identity.index)
            continue
        pairs, peers[a.identity.index] = got
        pcie.update(pairs)
    return GpuTopology(pcie=pcie, nvlink_peers=peers, fabric=read_fabric(nvml, devices, run))


def _device_topology(
    nvml: Nvml, a: Device, later: Sequence[Device]
) -> tuple[dict[tuple[int, int], str], tuple[NvLinkPeer, ...]]:
    pcie: dict[tuple[int, int], str] = {}
    for b in later:
        level = nvml.query("nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
        if level is not None:
            pcie[(a.identity.index, b.identity.index)] = PCIE_LEVELS.get(int(level), "sys")
    return pcie, _peers(nvml, a)


def read_fabric(
    nvml: Nvml,
    devices: Sequence[Device],
    run: RunOnGpu = direct,
    previous: Mapping[int, Fabric] | None = None,
) -> Mapping[int, Fabric]:
    """Each fabric-attached GPU's registration, by GPU index (absent: no fabric). A GPU
    that does not answer in `run` keeps its `previous` entry: its fabric is unknown now,
    not gone."""
    fabric: dict[int, Fabric] = {}
    for device in devices:
        index = device.identity.index
        try:
            found = run(device, partial(_fabric, nvml, device))
        except GpuLost:
            continue
        if isinstance(found, Blocked):
            found = (previous or {}).get(index)
        if found is not None:
            fabric[index] = found
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


class _FabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t (unversioned, deprecated), as nvml.h lays it out, plus slack: the
    unversioned call carries no size, and pynvml declares `state` 4 bytes wide (32 in all),
    so a driver built that way must not write past the buffer."""

    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint8),
        ("_slack", ctypes.c_uint8 * 8),
    ]


class _FabricInfoV2(ctypes.Structure):
    """nvmlGpuFabricInfo_v2_t, as nvml.h lays it out (version = size | 2 << 24)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint8),
        ("healthMask", ctypes.c_uint32),
    ]


class _FabricInfoV3(ctypes.Structure):
    """nvmlGpuFabricInfo_v3_t: v2 plus a health summary (version = size | 3 << 24)."""

    _fields_ = [*_FabricInfoV2._fields_, ("healthSummary", ctypes.c_uint8)]


def fabric_info(nvml: Nvml, device: Device) -> Any | None:
    """The versioned nvmlDeviceGetGpuFabricInfoV (v3, else v2); the deprecated unversioned
    call only where the driver has no versioned one. The structs are the agent's own, laid
    out as nvml.h says: pynvml's are not to be trusted here (nvidia-ml-py 12.550 declares
    the cluster UUID as 80 chars instead of 16 bytes, which misreads every field after it)."""
    for struct, revision in ((_FabricInfoV3, 3), (_FabricInfoV2, 2)):
        info = struct(version=ctypes.sizeof(struct) | revision << 24)
        code = nvml.raw_call("nvmlDeviceGetGpuFabricInfoV", device.handle, ctypes.byref(info))
        if code == 0:
            return info
        if code == ARGUMENT_VERSION_MISMATCH:
            continue  # an older driver: try the previous version
        if code != FUNCTION_NOT_FOUND:
            return None
        break
    old = _FabricInfo()
    code = nvml.raw_call("nvmlDeviceGetGpuFabricInfo", device.handle, ctypes.byref(old))
    return old if code == 0 else None


def _fabric(nvml: Nvml, device: Device) -> Fabric | None:
    info = fabric_info(nvml, device)
    if info is None:
        return None
    get = ctypes.Structure.__getattribute__
    state = int(get(info, "state"))
    if state != FABRIC_COMPLETED:
        # `status` and the cluster UUID mean nothing before registration completed.
        return Fabric(cluster_uuid="", clique_id=0, completed=False, state=state)
    status = int(get(info, "status"))
    raw = bytes(get(info, "clusterUuid"))
    h = raw.hex()
    uuid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}" if any(raw) else ""
    fields = {name for name, *_ in type(info)._fields_}
    return Fabric(
        cluster_uuid=uuid if status == 0 else "",
        clique_id=int(get(info, "cliqueId")),
        completed=True,
        state=state,
        status=status,
        health_mask=int(get(info, "healthMask")) if "healthMask" in fields else 0,
    )

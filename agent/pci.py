"""Where PCI devices sit relative to each other, from the kernel's sysfs tree.

`<sysfs>/bus/pci/devices/<address>` links to the device's place in the tree,
`devices/pci<domain>:<bus>/<root port>/<bridge>/.../<address>`: the path from a host bridge
(one per root complex) down through root ports and PCIe switch ports. Comparing two such
paths gives the relationship `nvidia-smi topo -m` reports, which is what decides whether
GPUDirect RDMA between a GPU and a NIC is fast:

  pix   at most one PCIe switch between them (the GPUDirect sweet spot)
  pxb   several PCIe switches, no host bridge
  phb   through a PCIe host bridge (the CPU's root complex)
  node  across host bridges within one NUMA node
  sys   across NUMA nodes (the inter-socket link)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuscope.agent.hostfs import HostFs

SYSFS = HostFs("pci")  # one state for every caller: a failing file logs once per change

LEVELS = ("pix", "pxb", "phb", "node", "sys")


def sysfs_pci_address(bus_id: str) -> str:
    """A vendor library's `00000000:18:00.0` (NVML's 8-digit domain) -> sysfs's `0000:18:00.0`."""
    domain, _, rest = bus_id.partition(":")
    if not rest:
        return bus_id.lower()
    return f"{int(domain, 16):04x}:{rest}".lower()


@dataclass(frozen=True, slots=True)
class PciLocation:
    """A PCI device's place in the tree: its address, the path from its host bridge down to it
    (what `relationship` compares) and its NUMA node (None where sysfs gives none)."""

    address: str  # 0000:18:00.0
    path: tuple[str, ...]  # ("pci0000:14", "0000:14:01.0", ..., "0000:18:00.0")
    numa_node: int | None


def locate(sysfs: Path, address: str, fs: HostFs = SYSFS) -> PciLocation | None:
    """The device's path in the PCI tree; None when sysfs does not know the address.

    Only the link's text is used (never followed), so a link pointing into a loop costs
    only its NUMA node, read through `HostFs` (bounded, never raising)."""
    link = sysfs / "bus" / "pci" / "devices" / address.lower()
    target = fs.readlink(link)
    if target is None:
        return None
    parts = [p for p in target.split("/") if p not in ("", "..", ".")]
    if "devices" in parts:
        parts = parts[parts.index("devices") + 1 :]
    if not parts or not parts[0].startswith("pci"):
        return None
    numa = fs.read_int(link / "numa_node")
    node = numa if numa is not None else -1
    return PciLocation(
        address=address.lower(), path=tuple(parts), numa_node=node if node >= 0 else None
    )


def relationship(a: PciLocation, b: PciLocation) -> str:
    """nvidia-smi's level (pix, pxb, phb, node, sys) between two devices."""
    if a.path[0] != b.path[0]:  # different root complexes
        same_node = a.numa_node is not None and a.numa_node == b.numa_node
        return "node" if same_node else "sys"
    common = 0
    for x, y in zip(a.path, b.path, strict=False):
        if x != y:
            break
        common += 1
    if common <= 1:  # they part at the host bridge: different root ports
        return "phb"
    # Below the common bridge each side crosses its downstream port then reaches the device:
    # two hops each means one switch between them.
    hops = max(len(a.path) - common, len(b.path) - common)
    return "pix" if hops <= 2 else "pxb"


def worst(levels: list[str]) -> str:
    return max(levels, key=LEVELS.index)


def best(levels: list[str]) -> str:
    return min(levels, key=LEVELS.index)


def nic_affinity(gpus: list[PciLocation], rdma_nics: list[PciLocation]) -> str:
    """The worst, across GPUs, of each GPU's best relationship to an RDMA-capable NIC.

    `pix` means every GPU has a NIC behind its own PCIe switch, which is what GPUDirect RDMA
    jobs want; `none` means the node has no RDMA NIC (or no GPU the kernel can place).
    """
    if not gpus or not rdma_nics:
        return "none"
    return worst([best([relationship(g, n) for n in rdma_nics]) for g in gpus])

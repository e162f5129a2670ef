"""Where the RDMA NICs sit relative to the accelerators, for node labels: read from sysfs.

Takes the accelerators' PCI addresses, not their records: the network side knows no vendor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuscope.agent.net.nic import read_nics
from gpuscope.agent.pci import locate, nic_affinity, relationship, sysfs_pci_address
from gpuscope.agent.runtime.sources import SourceUnavailable


@dataclass(frozen=True, slots=True)
class NetworkPlacement:
    """Where the node's RDMA NICs sit relative to its GPUs (computed by the agent)."""

    rdma_present: bool
    nic_affinity: str  # pix | pxb | phb | node | sys | none
    # Per NIC (netdev name, RDMA-capable), its PCIe relation to each GPU in index order.
    gpu_nic: tuple[tuple[str, bool, tuple[str, ...]], ...] = ()


def network_placement(sysfs: Path, gpu_bus_ids: Sequence[str]) -> NetworkPlacement | None:
    """RDMA NICs and their PCIe distance to the GPUs (their PCI addresses in index order, ""
    where unknown); None when sysfs has no network class."""
    try:
        nics = read_nics(sysfs).nics
    except SourceUnavailable:
        return None
    gpus = [locate(sysfs, sysfs_pci_address(bus_id)) for bus_id in gpu_bus_ids if bus_id]
    located = [(n, where) for n in nics if n.pci_bus_id and (where := locate(sysfs, n.pci_bus_id))]
    gpu_nic = tuple(
        (n.device, n.rdma, tuple(relationship(g, where) if g else "" for g in gpus))
        for n, where in located
    )
    return NetworkPlacement(
        rdma_present=any(n.rdma for n in nics),
        nic_affinity=nic_affinity(
            [g for g in gpus if g is not None], [where for n, where in located if n.rdma]
        ),
        gpu_nic=gpu_nic,
    )

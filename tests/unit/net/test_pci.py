"""PCI relationships from sysfs, as nvidia-smi topo -m names them, on the generated DGX H100
sysfs tree and on small hand-made trees."""

from __future__ import annotations

import os
from pathlib import Path

from gpuscope.agent.pci import PciLocation, locate, nic_affinity, relationship

DGX_GPUS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]


def loc(sysfs: Path, bus: str) -> PciLocation:
    found = locate(sysfs, f"0000:{bus}:00.0")
    assert found is not None, bus
    return found


def test_each_dgx_gpu_shares_a_pcie_switch_with_its_nic(shared_tree: Path) -> None:
    for bus in DGX_GPUS:
        nic = f"{int(bus, 16) - 1:02x}"
        assert relationship(loc(shared_tree, bus), loc(shared_tree, nic)) == "pix"


def test_gpus_on_other_root_complexes_are_node_or_sys_by_numa(shared_tree: Path) -> None:
    assert relationship(loc(shared_tree, "18"), loc(shared_tree, "2a")) == "node"
    assert relationship(loc(shared_tree, "18"), loc(shared_tree, "db")) == "sys"
    assert loc(shared_tree, "db").numa_node == 1


def test_nic_affinity_is_the_worst_gpus_best_nic(shared_tree: Path) -> None:
    gpus = [loc(shared_tree, b) for b in DGX_GPUS]
    nics = [loc(shared_tree, f"{int(b, 16) - 1:02x}") for b in DGX_GPUS]
    assert nic_affinity(gpus, nics) == "pix"
    assert nic_affinity(gpus, nics[:4]) == "sys"  # GPUs on socket 1 have no NIC of their own
    assert nic_affinity(gpus, []) == "none"


def tree(root: Path, devices: dict[str, str]) -> Path:
    """devices: address -> path under devices/ (as the kernel lays it out)."""
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    for address, path in devices.items():
        target = root / "devices" / path
        target.mkdir(parents=True, exist_ok=True)
        (target / "numa_node").write_text("0\n")
        os.symlink(os.path.relpath(target, links), links / address)
    return root


def test_levels_on_hand_made_trees(tmp_path: Path) -> None:
    sysfs = tree(tmp_path, {
        "0000:03:00.0": "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
        "0000:04:00.0": "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0",
        "0000:07:00.0": "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0/"
                        "0000:06:00.0/0000:07:00.0",
        "0000:09:00.0": "pci0000:00/0000:00:02.0/0000:09:00.0",
        "0000:0a:00.0": "pci0000:00/0000:00:03.0/0000:0a:00.0",
        "0000:0a:00.1": "pci0000:00/0000:00:03.0/0000:0a:00.1",
    })  # fmt: skip
    a, b, deep, c, d, d1 = (
        locate(sysfs, x)
        for x in ("0000:03:00.0", "0000:04:00.0", "0000:07:00.0", "0000:09:00.0",
                  "0000:0a:00.0", "0000:0a:00.1")
    )  # fmt: skip
    assert a and b and deep and c and d and d1
    assert relationship(a, b) == "pix"  # one switch
    assert relationship(a, deep) == "pxb"  # a second switch below the first
    assert relationship(a, c) == "phb"  # different root ports
    assert relationship(d, d1) == "pix"  # two functions of one device
    assert locate(sysfs, "0000:ff:00.0") is None

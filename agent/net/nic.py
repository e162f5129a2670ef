"""The NIC source: `<sysfs>/class/net/*` -> `NicSnapshot` records, read at scrape time.

Only physical devices are reported. The rule is the kernel's own: a netdev is physical when
`class/net/<dev>/device` exists, i.e. the netdev has a parent device on a bus (PCI, or
virtio in a VM). Loopback, veth, bridges, bond masters, VLANs, macvlan, tun/tap, vxlan and
the like are created in software and live under `devices/virtual/net` with no `device`
link, so a pod churning veths never churns the NIC series. Bond slaves and SR-IOV VFs are
hardware and are reported.

Every file is read on its own and omitted on its own when unreadable: a netdev that
disappears while being read, or a driver that answers EINVAL for `speed` on a down link,
loses those values and nothing else.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuscope.agent.net.records import NicReading, NicSnapshot
from gpuscope.agent.sources import SourceUnavailable, StatelessSource

MEGABIT = 125_000  # bytes per second in one Mb/s, the unit of `speed`
SPEED_UNKNOWN = 0xFFFFFFFF  # SPEED_UNKNOWN read back through an unsigned format
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class NicSource(StatelessSource):
    """Reads sysfs afresh on every scrape."""

    name = "nic"

    def __init__(self, sysfs: Path = Path("/sys")) -> None:
        self.sysfs = sysfs

    def collect(self) -> NicSnapshot:
        return read_nics(self.sysfs)


def read_nics(sysfs: Path) -> NicSnapshot:
    """Every physical netdev under `sysfs`, sorted by name."""
    class_net = sysfs / "class" / "net"
    if not class_net.is_dir():
        raise SourceUnavailable(
            f"{class_net} does not exist: is the host's /sys mounted at {sysfs}? (--sysfs)"
        )
    rdma = rdma_netdevs(sysfs)
    nics = [read_nic(entry, rdma) for entry in list_dir(class_net) if is_physical(entry)]
    return NicSnapshot(nics=tuple(nics))


def is_physical(netdev: Path) -> bool:
    return (netdev / "device").exists()


def read_nic(netdev: Path, rdma_names: frozenset[str] = frozenset()) -> NicReading:
    """One netdev directory (`class/net/<dev>`) -> a reading."""
    device = netdev / "device"
    stats = netdev / "statistics"
    function = pci_function(device)
    numa = read_int((function or device) / "numa_node")
    return NicReading(
        device=netdev.name,
        driver=link_name(device / "driver"),
        pci_bus_id=function.name if function is not None else "",
        numa_node=numa if numa is not None and numa >= 0 else None,
        rdma=netdev.name in rdma_names or bool(list_dir(device / "infiniband")),
        operstate=read_text(netdev / "operstate"),
        speed_bytes_per_second=_speed(read_int(netdev / "speed")),
        mtu_bytes=read_int(netdev / "mtu"),
        transmit_bytes=read_int(stats / "tx_bytes"),
        receive_bytes=read_int(stats / "rx_bytes"),
        transmit_packets=read_int(stats / "tx_packets"),
        receive_packets=read_int(stats / "rx_packets"),
        transmit_errors=read_int(stats / "tx_errors"),
        receive_errors=read_int(stats / "rx_errors"),
        transmit_dropped=read_int(stats / "tx_dropped"),
        receive_dropped=read_int(stats / "rx_dropped"),
    )


def _speed(megabits: int | None) -> int | None:
    """A down link reads -1 (or fails with EINVAL on older kernels): no speed, not 0."""
    if megabits is None or megabits <= 0 or megabits == SPEED_UNKNOWN:
        return None
    return megabits * MEGABIT


def rdma_netdevs(sysfs: Path) -> frozenset[str]:
    """Netdevs that an RDMA device sits on, seen from the RDMA side.

    Two views, because drivers differ in where they hang the RDMA device: its parent's
    `net/` directory (mlx5 and irdma parent it on the PCI function that owns the netdev),
    and the netdev of each port's default GID (RoCE; works whatever the parent is).
    `read_nic` also checks the netdev's own `device/infiniband/`.
    """
    found: set[str] = set()
    for ibdev in list_dir(sysfs / "class" / "infiniband"):
        found.update(entry.name for entry in list_dir(ibdev / "device" / "net"))
        for port in list_dir(ibdev / "ports"):
            name = read_text(port / "gid_attrs" / "ndevs" / "0")
            if name:
                found.add(name)
    return frozenset(found)


def pci_function(device: Path) -> Path | None:
    """The PCI function behind a netdev's `device` link: the device itself, or its parent
    when the device is a bus of its own on one function (virtio0 in a VM); None otherwise
    (USB, platform devices)."""
    try:
        resolved = Path(os.path.realpath(device, strict=True))
    except OSError:
        return None
    for candidate in (resolved, resolved.parent):
        if PCI_ADDRESS.match(candidate.name):
            return candidate
    return None


def link_name(link: Path) -> str:
    """The last component of a symlink's target (a driver's name), or "" if it is no link."""
    try:
        return Path(os.readlink(link)).name
    except OSError:
        return ""


def list_dir(directory: Path) -> list[Path]:
    """Entries sorted by name; [] when the directory is absent or unreadable."""
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    """A decimal (or 0x hex) integer file; None when absent, unreadable or not a number."""
    text = read_text(path)
    if not text:
        return None
    try:
        return int(text, 0) if text.startswith(("0x", "-0x")) else int(text)
    except ValueError:
        return None

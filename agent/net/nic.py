"""The NIC source: `<sysfs>/class/net/*` -> `NicSnapshot` records, read at scrape time.

Only physical devices are reported. The rule is the kernel's own: a netdev is physical when
`class/net/<dev>/device` exists, i.e. the netdev has a parent device on a bus (PCI, or
virtio in a VM). Loopback, veth, bridges, bond masters, VLANs, macvlan, tun/tap, vxlan and
the like are created in software and live under `devices/virtual/net` with no `device`
link, so a pod churning veths never churns the NIC series. Bond slaves and SR-IOV VFs are
hardware and are reported.

Every file is read on its own and omitted on its own when unreadable: a netdev that
disappears while being read, or a driver that answers EINVAL for `speed` on a down link,
loses those values and nothing else. Reads go through `HostFs` (agent/hostfs.py): bounded,
never raising, a symlink loop or a denied file logged once per change of state. A netdev
name holding bytes that are not UTF-8 is reported with those bytes written `\\xNN`, the
same text a `gid_attrs/ndevs` file naming it reads as.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from gpuscope.agent.hostfs import HostFs, label_text
from gpuscope.agent.net.records import NicReading, NicSnapshot
from gpuscope.agent.runtime.sources import SourceUnavailable, StatelessSource

MEGABIT = 125_000  # bytes per second in one Mb/s, the unit of `speed`
SPEED_UNKNOWN = 0xFFFFFFFF  # SPEED_UNKNOWN read back through an unsigned format
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# Reads by callers without a source of their own (the node labels' placement, tests): one
# shared state, so a failing file logs once per change however often they read.
SYSFS = HostFs("sysfs")


class NicSource(StatelessSource):
    """Reads sysfs afresh on every scrape."""

    name = "nic"

    def __init__(self, sysfs: Path = Path("/sys")) -> None:
        self.sysfs = sysfs
        self.fs = HostFs("nic")

    def read(self) -> NicSnapshot:
        return replace(read_nics(self.sysfs, self.fs), dropped=self.fs.counts())


def read_nics(sysfs: Path, fs: HostFs = SYSFS) -> NicSnapshot:
    """Every physical netdev under `sysfs`, sorted by name."""
    class_net = sysfs / "class" / "net"
    if not class_net.is_dir():
        raise SourceUnavailable(
            f"{class_net} does not exist: is the host's /sys mounted at {sysfs}? (--sysfs)"
        )
    rdma = rdma_netdevs(sysfs, fs)
    entries = fs.list_dir(class_net)
    nics = [read_nic(entry, rdma, fs) for entry in entries if is_physical(entry, fs)]
    return NicSnapshot(nics=tuple(nics))


def is_physical(netdev: Path, fs: HostFs = SYSFS) -> bool:
    return fs.exists(netdev / "device")


def read_nic(
    netdev: Path, rdma_names: frozenset[str] = frozenset(), fs: HostFs = SYSFS
) -> NicReading:
    """One netdev directory (`class/net/<dev>`) -> a reading."""
    device = netdev / "device"
    stats = netdev / "statistics"
    function = pci_function(device, fs)
    numa = fs.read_int((function or device) / "numa_node")
    name = label_text(netdev.name)
    return NicReading(
        device=name,
        driver=link_name(device / "driver", fs),
        pci_bus_id=function.name if function is not None else "",
        numa_node=numa if numa is not None and numa >= 0 else None,
        rdma=name in rdma_names or bool(fs.list_dir(device / "infiniband")),
        operstate=fs.read_text(netdev / "operstate"),
        speed_bytes_per_second=_speed(fs.read_int(netdev / "speed")),
        mtu_bytes=fs.read_int(netdev / "mtu"),
        transmit_bytes=fs.read_counter(stats / "tx_bytes"),
        receive_bytes=fs.read_counter(stats / "rx_bytes"),
        transmit_packets=fs.read_counter(stats / "tx_packets"),
        receive_packets=fs.read_counter(stats / "rx_packets"),
        transmit_errors=fs.read_counter(stats / "tx_errors"),
        receive_errors=fs.read_counter(stats / "rx_errors"),
        transmit_dropped=fs.read_counter(stats / "tx_dropped"),
        receive_dropped=fs.read_counter(stats / "rx_dropped"),
    )


def _speed(megabits: int | None) -> int | None:
    """A down link reads -1 (or fails with EINVAL on older kernels): no speed, not 0."""
    if megabits is None or megabits <= 0 or megabits == SPEED_UNKNOWN:
        return None
    return megabits * MEGABIT


def rdma_netdevs(sysfs: Path, fs: HostFs = SYSFS) -> frozenset[str]:
    """Netdevs that an RDMA device sits on, seen from the RDMA side.

    Two views, because drivers differ in where they hang the RDMA device: its parent's
    `net/` directory (mlx5 and irdma parent it on the PCI function that owns the netdev),
    and the netdev of each port's default GID (RoCE; works whatever the parent is).
    `read_nic` also checks the netdev's own `device/infiniband/`. Names as label text.
    """
    found: set[str] = set()
    for ibdev in fs.list_dir(sysfs / "class" / "infiniband"):
        found.update(label_text(entry.name) for entry in fs.list_dir(ibdev / "device" / "net"))
        for port in fs.list_dir(ibdev / "ports"):
            name = fs.read_text(port / "gid_attrs" / "ndevs" / "0")
            if name:
                found.add(name)
    return frozenset(found)


def pci_function(device: Path, fs: HostFs = SYSFS) -> Path | None:
    """The PCI function behind a netdev's `device` link: the device itself, or its parent
    when the device is a bus of its own on one function (virtio0 in a VM); None otherwise
    (USB, platform devices)."""
    resolved = fs.realpath(device)
    if resolved is None:
        return None
    for candidate in (resolved, resolved.parent):
        if PCI_ADDRESS.match(candidate.name):
            return candidate
    return None


def link_name(link: Path, fs: HostFs = SYSFS) -> str:
    """The last component of a symlink's target (a driver's name), or "" if it is no link."""
    target = fs.readlink(link)
    return label_text(Path(target).name) if target is not None else ""

#!/usr/bin/env python3
"""Generate a fake sysfs tree of a GPU node, the way the kernel lays it out.

Tests build it into `tmp_path` (hundreds of tiny files are cheaper to generate than to
review in git); for the demo, write it once and point the agent at it:

    python tests/doubles/make_sysfs.py /tmp/sysfs
    gpuscope --sysfs /tmp/sysfs --collectors nic,rdma

The tree is real files and relative symlinks, like the kernel's: `class/net/<dev>` and
`class/infiniband/<dev>` link into `devices/pci0000:XX/...`, every netdev's `device` links
to its PCI function, whose `driver` links into `bus/pci/drivers`; virtual netdevs live in
`devices/virtual/net`. Counter values are random but seeded, so every run writes the same
bytes, and tests compare what the agent reads with the specs below rather than with
constants.

The default node (`gpu_node`) is a DGX H100-like node matching the fake NVML `dgx-h100`
profile: each of its 8 GPUs shares a PCIe switch with one ConnectX-7 (mlx5_0..mlx5_7; GPU
and NIC on adjacent buses, 4 pairs per socket), plus two onboard 10GbE ports (ixgbe, no
RDMA), an Intel E810 with irdma (RoCE), and the virtual netdevs of a Kubernetes node. To
extend it, build a `Node` from the same pieces (`dgx_h100_pairs`, `NicSpec`, `PciSpec`).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

ETHER = 1  # ARPHRD_ETHER
INFINIBAND = 32  # ARPHRD_INFINIBAND (IPoIB)

# DGX H100-like: the GPU bus of each GPU/NIC pair, as in tests/doubles/fakenvml/profiles/dgx-h100.
DGX_H100_GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

NET_STATS = (
    "rx_bytes",
    "tx_bytes",
    "rx_packets",
    "tx_packets",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
    "multicast",
    "collisions",
    "rx_crc_errors",
    "rx_missed_errors",
)
MLX5_PORT_COUNTERS = (
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "VL15_dropped",
)
MLX5_HW_COUNTERS = (
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rx_dct_connect",
)
MLX5_ROCE_HW_COUNTERS = (
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rx_icrc_encapsulated",
)
IRDMA_HW_COUNTERS = (
    "ip4InDiscards",
    "ip4InTruncatedPkts",
    "ip4OutNoRoutes",
    "ip6InDiscards",
    "ip6InTruncatedPkts",
    "ip6OutNoRoutes",
    "tcpRetransSegs",
    "tcpInOptErrors",
    "tcpInProtoErrors",
    "rxVlanErrors",
    "ip4InOctets",
    "ip4InPkts",
    "ip4OutOctets",
    "ip4OutPkts",
    "ip6InOctets",
    "ip6InPkts",
    "ip6OutOctets",
    "ip6OutPkts",
    "iwInRdmaReads",
    "iwInRdmaSends",
    "iwInRdmaWrites",
    "iwOutRdmaReads",
    "iwOutRdmaSends",
    "iwOutRdmaWrites",
    "cnpHandled",
    "cnpIgnored",
    "cnpSent",
    "RxUDP",
    "TxUDP",
    "RxECNMrkd",
)


@dataclass(frozen=True)
class PciSpec:
    """A PCI function and the bridges above it, root port first."""

    address: str  # 0000:17:00.0
    bridges: tuple[str, ...]  # 0000:14:01.0, 0000:15:00.0, 0000:16:00.0
    numa_node: int
    driver: str
    vendor: str  # 0x15b3
    device: str  # 0x1021
    pci_class: str  # 0x020700

    @property
    def root_complex(self) -> str:
        first = self.bridges[0] if self.bridges else self.address
        return "pci" + first.rsplit(":", 1)[0]

    @property
    def sysfs_path(self) -> str:
        """Relative to the sysfs root: devices/pci0000:14/0000:14:01.0/.../0000:17:00.0."""
        return "/".join(("devices", self.root_complex, *self.bridges, self.address))


@dataclass(frozen=True)
class RdmaSpec:
    """An RDMA device with one port, as class/infiniband/<name> shows it."""

    name: str
    link_layer: str  # InfiniBand or Ethernet
    node_guid: str
    fw_ver: str
    hca_type: str | None = "MT4129"  # ConnectX-7; None: the driver has no such file
    board_id: str | None = "MT_0000000838"
    state: str = "4: ACTIVE"
    phys_state: str = "5: LinkUp"
    rate: str = "400 Gb/sec (4X NDR)"
    counters: Mapping[str, int] | None = None  # None: no counters/ directory (irdma)
    hw_counters: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class NicSpec:
    """A physical netdev on a PCI function, maybe with an RDMA device on the same function."""

    netdev: str
    pci: PciSpec
    address: str  # MAC or IPoIB hardware address
    operstate: str = "up"
    speed_mbps: int = -1  # what the kernel writes for a down link
    mtu: int = 1500
    net_type: int = ETHER
    dev_port: int = 0
    stats: Mapping[str, int] = field(default_factory=dict)
    rdma: RdmaSpec | None = None


@dataclass(frozen=True)
class VirtualSpec:
    """A software netdev (devices/virtual/net): never reported as a NIC."""

    netdev: str
    kind: str  # loopback, veth, bridge
    mtu: int = 1500
    operstate: str = "up"
    stats: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Node:
    nics: tuple[NicSpec, ...]
    virtual: tuple[VirtualSpec, ...] = ()
    other_pci: tuple[PciSpec, ...] = ()  # GPUs and other functions without a netdev

    def nic(self, netdev: str) -> NicSpec:
        return next(n for n in self.nics if n.netdev == netdev)

    def rdma(self, name: str) -> RdmaSpec:
        return next(n.rdma for n in self.nics if n.rdma is not None and n.rdma.name == name)

    def rdma_nics(self) -> tuple[NicSpec, ...]:
        return tuple(n for n in self.nics if n.rdma is not None)


# --- counter values ---------------------------------------------------------------------


def net_stats(seed: str, scale: int, errors: int = 0) -> dict[str, int]:
    """Netdev statistics for a link that has moved about `scale` bytes since boot."""
    rng = random.Random(seed)
    packets = scale // rng.randrange(700, 1400)
    return {
        "rx_bytes": scale + rng.randrange(scale // 3 + 1),
        "tx_bytes": scale - rng.randrange(scale // 3 + 1),
        "rx_packets": packets + rng.randrange(packets // 3 + 1),
        "tx_packets": packets - rng.randrange(packets // 3 + 1),
        "rx_errors": errors,
        "tx_errors": 0,
        "rx_dropped": rng.randrange(40),
        "tx_dropped": 0,
        "multicast": rng.randrange(10_000),
        "collisions": 0,
        "rx_crc_errors": errors,
        "rx_missed_errors": 0,
    }


def mlx5_port_counters(seed: str, words: int, errors: Mapping[str, int]) -> dict[str, int]:
    """PortCounters of an NDR port that moved about `words` 4-byte words each way."""
    rng = random.Random(seed)
    values = dict.fromkeys(MLX5_PORT_COUNTERS, 0)
    values["port_xmit_data"] = words + rng.randrange(words // 4 + 1)
    values["port_rcv_data"] = words - rng.randrange(words // 4 + 1)
    values["port_xmit_packets"] = values["port_xmit_data"] // 1024
    values["port_rcv_packets"] = values["port_rcv_data"] // 1024
    values["unicast_xmit_packets"] = values["port_xmit_packets"] - 1_000
    values["unicast_rcv_packets"] = values["port_rcv_packets"] - 1_200
    values["multicast_xmit_packets"] = 1_000
    values["multicast_rcv_packets"] = 1_200
    values["port_xmit_wait"] = words // 97 + rng.randrange(1_000_000)
    values.update(errors)
    return values


def mlx5_hw_counters(seed: str, roce: bool, errors: Mapping[str, int]) -> dict[str, int]:
    rng = random.Random(seed)
    names = MLX5_HW_COUNTERS + (MLX5_ROCE_HW_COUNTERS if roce else ())
    values = dict.fromkeys(names, 0)
    values["rx_write_requests"] = rng.randrange(10**9, 10**10)
    values["rx_read_requests"] = rng.randrange(10**6, 10**7)
    values["rx_atomic_requests"] = rng.randrange(1_000)
    values["rx_dct_connect"] = rng.randrange(100)
    if roce:
        values["np_cnp_sent"] = rng.randrange(10**5, 10**7)
        values["rp_cnp_handled"] = rng.randrange(10**5, 10**7)
        values["np_ecn_marked_roce_packets"] = values["np_cnp_sent"] + rng.randrange(1_000)
    values.update(errors)
    return values


def irdma_hw_counters(seed: str) -> dict[str, int]:
    rng = random.Random(seed)
    values = dict.fromkeys(IRDMA_HW_COUNTERS, 0)
    for name in ("ip4InOctets", "ip4OutOctets"):
        values[name] = rng.randrange(10**12, 10**13)
    for name in ("ip4InPkts", "ip4OutPkts", "RxUDP", "TxUDP"):
        values[name] = rng.randrange(10**9, 10**10)
    for name in ("iwInRdmaWrites", "iwOutRdmaWrites", "iwInRdmaSends", "iwOutRdmaSends"):
        values[name] = rng.randrange(10**6, 10**8)
    values["cnpSent"] = 52_118
    values["cnpHandled"] = 48_007
    values["RxECNMrkd"] = 52_130
    values["ip4InDiscards"] = 3
    return values


# --- the default node -------------------------------------------------------------------


def _h100(gpu_bus: int, upstream: tuple[str, str], numa: int) -> PciSpec:
    """The H100 on bus G, behind its switch's downstream port (G-2):01.0."""
    r = gpu_bus - 4
    return PciSpec(
        address=f"0000:{gpu_bus:02x}:00.0",
        bridges=(*upstream, f"0000:{r + 2:02x}:01.0"),
        numa_node=numa,
        driver="nvidia",
        vendor="0x10de",
        device="0x2330",
        pci_class="0x030200",
    )


def _cx7(i: int, gpu_bus: int, upstream: tuple[str, str], numa: int, link_layer: str) -> NicSpec:
    """ConnectX-7 mlx5_<i> on bus G-1, behind (G-2):00.0: an ibp... netdev on InfiniBand, an
    enp...np0 one on RoCE (Ethernet), with counters seeded by its name."""
    r = gpu_bus - 4
    nic_bus = gpu_bus - 1
    roce = link_layer == "Ethernet"
    pci = PciSpec(
        address=f"0000:{nic_bus:02x}:00.0",
        bridges=(*upstream, f"0000:{r + 2:02x}:00.0"),
        numa_node=numa,
        driver="mlx5_core",
        vendor="0x15b3",
        device="0x1021",
        pci_class="0x020000" if roce else "0x020700",
    )
    guid = f"a088:c203:00{0x3A + i:02x}:{0x5C10 + 0x111 * i:04x}"
    mac = f"a0:88:c2:{0x3A + i:02x}:{0x5C + i:02x}:10"
    seed = f"mlx5_{i}"
    rdma = RdmaSpec(
        name=f"mlx5_{i}",
        link_layer=link_layer,
        node_guid=guid,
        fw_ver="28.39.1002",
        counters=mlx5_port_counters(seed, 9_000_000_000_000 + i * 137_000_000_000, {}),
        hw_counters=mlx5_hw_counters(seed, roce, {}),
    )
    if roce:
        return NicSpec(
            netdev=f"enp{nic_bus}s0np0",
            pci=pci,
            address=mac,
            speed_mbps=400_000,
            mtu=9000,
            stats=net_stats(seed, 40_000_000_000),
            rdma=rdma,
        )
    return NicSpec(
        netdev=f"ibp{nic_bus}s0",
        pci=pci,
        address="00:00:10:29:fe:80:00:00:00:00:00:00:" + _guid_bytes(guid),
        speed_mbps=400_000,
        mtu=4092,
        net_type=INFINIBAND,
        stats=net_stats(seed, 90_000_000),
        rdma=rdma,
    )


def dgx_h100_pairs(
    link_layers: tuple[str, ...] = ("InfiniBand",) * 8,
) -> tuple[tuple[NicSpec, ...], tuple[PciSpec, ...]]:
    """8 ConnectX-7 (mlx5_0..7) and 8 H100, each pair behind one PCIe switch.

    Per pair, with G the GPU's bus: root port (G-4):01.0 -> switch upstream (G-3):00.0 ->
    downstream ports (G-2):00.0 (NIC on bus G-1) and (G-2):01.0 (GPU on bus G). Buses below
    0x80 are on socket 0 (NUMA 0), the rest on socket 1.
    """
    nics: list[NicSpec] = []
    gpus: list[PciSpec] = []
    for i, gpu_bus in enumerate(DGX_H100_GPU_BUSES):
        r = gpu_bus - 4
        numa = 0 if gpu_bus < 0x80 else 1
        upstream = (f"0000:{r:02x}:01.0", f"0000:{r + 1:02x}:00.0")
        gpus.append(_h100(gpu_bus, upstream, numa))
        nics.append(_cx7(i, gpu_bus, upstream, numa, link_layers[i]))
    return tuple(nics), tuple(gpus)


def _with_faults(cx7: tuple[NicSpec, ...]) -> list[NicSpec]:
    """The fixture's faults: mlx5_2 symbol errors and a link recovery, mlx5_5 RoCE
    transport errors, mlx5_6 link down (as mlx5 shows a down port)."""
    nics = list(cx7)
    nics[2] = _with_errors(
        nics[2], port={"symbol_error": 17, "link_error_recovery": 2, "port_rcv_errors": 5}
    )
    nics[5] = _with_errors(
        nics[5], hw={"out_of_sequence": 311, "packet_seq_err": 12, "local_ack_timeout_err": 4}
    )
    down = nics[6]
    assert down.rdma is not None
    nics[6] = replace(
        down,
        operstate="down",
        speed_mbps=-1,
        rdma=replace(
            down.rdma,
            state="1: DOWN",
            phys_state="3: Disabled",
            rate="40 Gb/sec (4X QDR)",  # what mlx5 shows for a down port: not the link's
            counters={**(down.rdma.counters or {}), "link_downed": 1},
        ),
    )
    return nics


def _host_nics() -> list[NicSpec]:
    """Not for the GPUs: two onboard ixgbe ports (eno2 down, no cable) and an E810 (ice)
    with an irdma device, whose counters differ from mlx5's."""
    lom = ("0000:00:1c.0",)
    ixgbe = {"driver": "ixgbe", "vendor": "0x8086", "device": "0x10fb", "pci_class": "0x020000"}
    eno1 = NicSpec(
        netdev="eno1",
        pci=PciSpec(address="0000:03:00.0", bridges=lom, numa_node=0, **ixgbe),
        address="3c:ec:ef:6a:10:2e",
        speed_mbps=10_000,
        stats=net_stats("eno1", 3_500_000_000_000, errors=2),
    )
    eno2 = NicSpec(
        netdev="eno2",
        pci=PciSpec(address="0000:03:00.1", bridges=lom, numa_node=0, **ixgbe),
        address="3c:ec:ef:6a:10:2f",
        operstate="down",
        speed_mbps=-1,
        stats=dict.fromkeys(NET_STATS, 0),
    )
    e810 = NicSpec(
        netdev="enp75s0f0",
        pci=PciSpec(
            address="0000:4b:00.0",
            bridges=("0000:4a:02.0",),
            numa_node=0,
            driver="ice",
            vendor="0x8086",
            device="0x1592",
            pci_class="0x020000",
        ),
        address="b4:96:91:a5:3c:10",
        speed_mbps=100_000,
        mtu=9000,
        stats=net_stats("enp75s0f0", 800_000_000_000),
        rdma=RdmaSpec(
            name="irdma0",
            link_layer="Ethernet",
            node_guid="b696:91ff:fea5:3c10",
            fw_ver="1.71",
            hca_type=None,
            board_id=None,
            rate="100 Gb/sec (4X EDR)",
            counters=None,
            hw_counters=irdma_hw_counters("irdma0"),
        ),
    )
    return [eno1, eno2, e810]


def gpu_node() -> Node:
    """The fixture the tests use. mlx5_0..3 run InfiniBand (ibp...), mlx5_4..7 RoCE
    (enp...np0), so that one tree exercises both link layers; mlx5_6 has its link down.
    mlx5_2 has taken symbol errors and a link recovery; mlx5_5 has RoCE transport errors."""
    layers = ("InfiniBand",) * 4 + ("Ethernet",) * 4
    cx7, gpus = dgx_h100_pairs(layers)
    nics = [*_with_faults(cx7), *_host_nics()]
    virtual = (
        VirtualSpec("lo", "loopback", mtu=65536, operstate="unknown", stats=_small("lo")),
        VirtualSpec("cni0", "bridge", stats=_small("cni0")),
        VirtualSpec("veth3f2a9c1e", "veth", stats=_small("veth3f2a9c1e")),
        VirtualSpec("veth8b07d4a2", "veth", stats=_small("veth8b07d4a2")),
    )
    return Node(nics=tuple(nics), virtual=virtual, other_pci=gpus)


def _with_errors(
    nic: NicSpec, port: Mapping[str, int] | None = None, hw: Mapping[str, int] | None = None
) -> NicSpec:
    assert nic.rdma is not None
    rdma = replace(
        nic.rdma,
        counters={**(nic.rdma.counters or {}), **(port or {})},
        hw_counters={**nic.rdma.hw_counters, **(hw or {})},
    )
    return replace(nic, rdma=rdma)


def _small(seed: str) -> dict[str, int]:
    return net_stats(seed, 50_000_000)


def _guid_bytes(guid: str) -> str:
    digits = guid.replace(":", "")
    return ":".join(digits[i : i + 2] for i in range(0, 16, 2))


# --- writing the tree -------------------------------------------------------------------


def write_tree(root: Path, node: Node | None = None) -> Path:
    """Write `node` (default: `gpu_node()`) as a sysfs tree under `root`; returns `root`."""
    node = node or gpu_node()
    for sub in ("class/net", "class/infiniband", "bus/pci/devices", "devices/virtual/net"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    # Present whenever the bonding module is loaded: a file in class/net, not a device.
    _write(root / "class/net/bonding_masters", "")
    for pci in node.other_pci:
        write_pci(root, pci)
    for nic in node.nics:
        _write_nic(root, nic)
    for virtual in node.virtual:
        _write_virtual(root, virtual)
    return root


def write_pci(root: Path, pci: PciSpec) -> Path:
    """A PCI function with its bridges, driver link and bus/pci/devices entry."""
    path = root / "devices" / pci.root_complex
    for bridge in pci.bridges:
        path = path / bridge
        if not path.is_dir():
            _pci_files(root, path, pci.numa_node, "pcieport", "0x8086", "0x0000", "0x060400")
            _link(root / "bus/pci/devices" / bridge, path)
    path = path / pci.address
    _pci_files(root, path, pci.numa_node, pci.driver, pci.vendor, pci.device, pci.pci_class)
    _link(root / "bus/pci/devices" / pci.address, path)
    return path


def _pci_files(
    root: Path, path: Path, numa: int, driver: str, vendor: str, device: str, cls: str
) -> None:
    path.mkdir(parents=True, exist_ok=True)
    _write(path / "numa_node", str(numa))
    _write(path / "vendor", vendor)
    _write(path / "device", device)
    _write(path / "class", cls)
    drivers = root / "bus/pci/drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    _link(path / "driver", drivers)


def _write_nic(root: Path, nic: NicSpec) -> None:
    function = write_pci(root, nic.pci)
    netdir = function / "net" / nic.netdev
    _netdev_files(netdir, nic.address, nic.mtu, nic.operstate, nic.stats, nic.net_type)
    _write(netdir / "speed", str(nic.speed_mbps))
    _write(netdir / "carrier", "1" if nic.operstate == "up" else "0")
    _write(netdir / "dev_port", str(nic.dev_port))
    _link(netdir / "device", function)
    _link(root / "class/net" / nic.netdev, netdir)
    if nic.rdma is not None:
        _write_rdma(root, function, nic, nic.rdma)


def _write_rdma(root: Path, function: Path, nic: NicSpec, rdma: RdmaSpec) -> None:
    ibdir = function / "infiniband" / rdma.name
    ibdir.mkdir(parents=True)
    _write(ibdir / "node_guid", rdma.node_guid)
    _write(ibdir / "sys_image_guid", rdma.node_guid)
    _write(ibdir / "fw_ver", rdma.fw_ver)
    _write(ibdir / "node_type", "1: CA")
    _write(ibdir / "node_desc", f"gpu-node-01 {rdma.name}")
    if rdma.hca_type is not None:
        _write(ibdir / "hca_type", rdma.hca_type)
    if rdma.board_id is not None:
        _write(ibdir / "board_id", rdma.board_id)
    _link(ibdir / "device", function)
    port = ibdir / "ports" / "1"
    port.mkdir(parents=True)
    _write(port / "state", rdma.state)
    _write(port / "phys_state", rdma.phys_state)
    _write(port / "rate", rdma.rate)
    _write(port / "link_layer", rdma.link_layer)
    _write(port / "lid", "0x0" if rdma.link_layer == "Ethernet" else "0x1a")
    _write(port / "cap_mask", "0xa651e84a" if rdma.link_layer == "InfiniBand" else "0x04010000")
    if rdma.link_layer == "Ethernet":
        # RoCE: the default GID belongs to the netdev.
        _write(port / "gid_attrs/ndevs/0", nic.netdev)
        _write(port / "gid_attrs/types/0", "IB/RoCE v1")
    if rdma.counters is not None:
        for name, value in rdma.counters.items():
            _write(port / "counters" / name, str(value))
    if rdma.hw_counters:
        for name, value in rdma.hw_counters.items():
            _write(port / "hw_counters" / name, str(value))
        _write(port / "hw_counters/lifespan", "10")
    _link(root / "class/infiniband" / rdma.name, ibdir)


def _write_virtual(root: Path, v: VirtualSpec) -> None:
    netdir = root / "devices/virtual/net" / v.netdev
    net_type = 772 if v.kind == "loopback" else ETHER  # ARPHRD_LOOPBACK
    address = "00:00:00:00:00:00" if v.kind == "loopback" else "86:1f:3a:c2:9e:01"
    _netdev_files(netdir, address, v.mtu, v.operstate, v.stats, net_type)
    if v.kind == "bridge":
        _write(netdir / "bridge/stp_state", "0")
    if v.kind == "veth":
        _write(netdir / "speed", "10000")  # veth reports a speed too: filtering must not rely on it
    _link(root / "class/net" / v.netdev, netdir)


def _netdev_files(
    netdir: Path, address: str, mtu: int, operstate: str, stats: Mapping[str, int], net_type: int
) -> None:
    netdir.mkdir(parents=True, exist_ok=True)
    _write(netdir / "address", address)
    _write(netdir / "mtu", str(mtu))
    _write(netdir / "operstate", operstate)
    _write(netdir / "type", str(net_type))
    for name in NET_STATS:
        _write(netdir / "statistics" / name, str(stats.get(name, 0)))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _link(link: Path, target: Path) -> None:
    """A relative symlink, as the kernel makes them (they survive moving the tree)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        return
    relative = os.path.relpath(target, link.parent)
    if set(Path(relative).parts) == {
        ".."
    }:  # an ancestor: the kernel names it, ../../../0000:17:00.0
        relative = os.path.join(relative, "..", target.name)
    link.symlink_to(relative)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where to write the tree (its sysfs root)")
    parser.add_argument("--force", action="store_true", help="replace the directory if it exists")
    args = parser.parse_args(argv)
    target: Path = args.directory
    if target.exists():
        if not args.force:
            parser.error(f"{target} exists (use --force to replace it)")
        shutil.rmtree(target)
    write_tree(target)
    print(f"wrote a GPU node's sysfs to {target}: gpuscope --sysfs {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The RDMA source: `<sysfs>/class/infiniband/<dev>/ports/<n>/` -> `RdmaSnapshot` records.

Read at scrape time, every file on its own, through `HostFs` (bounded, never raising, a loop
or a denied file logged once per change): an unreadable counter is omitted, the rest of
the port is still reported. Device and netdev names holding bytes that are not UTF-8 are
reported with those bytes written `\\xNN`. A node without RDMA has no `class/infiniband`
at all; that is a feature being absent, not a failure, so the source succeeds with no
devices. Only when `class/net` is missing too does it fail, because then `--sysfs` points
at no sysfs.

Values leave this module in base units: `port_xmit_data`/`port_rcv_data` count 4-byte
words (the InfiniBand PortCounters convention, kept by the kernel for RoCE too) and are
multiplied by 4; `rate` ("400 Gb/sec (4X NDR)") becomes bytes per second.

Drivers name their `hw_counters` differently and keep adding to them, so every one that
exists is read into `RdmaPort.hw_counters` under its own name, and the allow-list
`HW_COUNTERS` below picks the error and congestion counters worth exporting, under
normalized lower_snake names. Congestion signals (CNPs, ECN marks, IB transmit wait) are
kept apart from errors: on a healthy RoCE fabric they rise all day, and an alert on errors
must not fire on them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal

from gpuscope.agent.hostfs import HostFs, label_text
from gpuscope.agent.net.nic import SYSFS
from gpuscope.agent.net.records import RdmaDevice, RdmaPort, RdmaSnapshot
from gpuscope.agent.runtime.sources import SourceUnavailable, StatelessSource

Kind = Literal["error", "congestion"]
ERROR: Kind = "error"
CONGESTION: Kind = "congestion"

# IB PortInfo PortState, as `ports/<n>/state` spells it ("4: ACTIVE").
PORT_STATES: Mapping[int, str] = {
    0: "NOP",
    1: "DOWN",
    2: "INIT",
    3: "ARMED",
    4: "ACTIVE",
    5: "ACTIVE_DEFER",
}
PHYS_STATE_LINK_UP = 5  # "5: LinkUp"

# `ports/<n>/counters/*` (the IB PortCounters set) that count errors or congestion.
# Exported under the kernel's names, lower-cased (VL15_dropped -> vl15_dropped).
PORT_COUNTERS: Mapping[str, Kind] = {
    "symbol_error": ERROR,
    "link_error_recovery": ERROR,
    "link_downed": ERROR,
    "port_rcv_errors": ERROR,
    "port_rcv_remote_physical_errors": ERROR,
    "port_rcv_switch_relay_errors": ERROR,
    "port_xmit_discards": ERROR,
    "port_xmit_constraint_errors": ERROR,
    "port_rcv_constraint_errors": ERROR,
    "local_link_integrity_errors": ERROR,
    "excessive_buffer_overrun_errors": ERROR,
    "VL15_dropped": ERROR,
    # Ticks in which the port had data to send and no flow-control credit: InfiniBand's
    # congestion signal (it has no CNPs). A tick's length is device-specific.
    "port_xmit_wait": CONGESTION,
}

# The allow-list of `ports/<n>/hw_counters/*`: kernel name -> (exported name, kind).
# Counters that mean the same on every driver share one name, so one query covers a mixed
# fleet; the rest keep their driver's name in lower_snake case.
HW_COUNTERS: Mapping[str, tuple[str, Kind]] = {
    # RoCE congestion control (DCQCN), mlx5 and irdma.
    "np_cnp_sent": ("cnp_sent", CONGESTION),
    "cnpSent": ("cnp_sent", CONGESTION),
    "rp_cnp_handled": ("cnp_handled", CONGESTION),
    "cnpHandled": ("cnp_handled", CONGESTION),
    "rp_cnp_ignored": ("cnp_ignored", CONGESTION),
    "cnpIgnored": ("cnp_ignored", CONGESTION),
    "np_ecn_marked_roce_packets": ("ecn_marked_packets", CONGESTION),
    "RxECNMrkd": ("ecn_marked_packets", CONGESTION),
    # mlx5: transport errors, retransmissions and drops.
    "out_of_buffer": ("out_of_buffer", ERROR),
    "out_of_sequence": ("out_of_sequence", ERROR),
    "duplicate_request": ("duplicate_request", ERROR),
    "packet_seq_err": ("packet_seq_err", ERROR),
    "implied_nak_seq_err": ("implied_nak_seq_err", ERROR),
    "local_ack_timeout_err": ("local_ack_timeout_err", ERROR),
    "rnr_nak_retry_err": ("rnr_nak_retry_err", ERROR),
    "req_cqe_error": ("req_cqe_error", ERROR),
    "resp_cqe_error": ("resp_cqe_error", ERROR),
    "req_remote_access_errors": ("req_remote_access_errors", ERROR),
    "req_remote_invalid_request": ("req_remote_invalid_request", ERROR),
    "resp_remote_access_errors": ("resp_remote_access_errors", ERROR),
    "resp_local_length_error": ("resp_local_length_error", ERROR),
    "req_transport_retries_exceeded": ("req_transport_retries_exceeded", ERROR),
    "req_rnr_retries_exceeded": ("req_rnr_retries_exceeded", ERROR),
    "roce_adp_retrans": ("roce_adp_retrans", ERROR),
    "roce_adp_retrans_to": ("roce_adp_retrans_to", ERROR),
    "roce_slow_restart": ("roce_slow_restart", ERROR),
    "rx_icrc_encapsulated": ("rx_icrc_encapsulated", ERROR),
    # irdma (Intel E810/X722). Older kernels prefix the TCP (iWARP) ones with "tcp".
    "ip4InDiscards": ("ip4_in_discards", ERROR),
    "ip6InDiscards": ("ip6_in_discards", ERROR),
    "ip4InTruncatedPkts": ("ip4_in_truncated_pkts", ERROR),
    "ip6InTruncatedPkts": ("ip6_in_truncated_pkts", ERROR),
    "ip4OutNoRoutes": ("ip4_out_no_routes", ERROR),
    "ip6OutNoRoutes": ("ip6_out_no_routes", ERROR),
    "rxVlanErrors": ("rx_vlan_errors", ERROR),
    "tcpRetransSegs": ("tcp_retrans_segs", ERROR),
    "RetransSegs": ("tcp_retrans_segs", ERROR),
    "tcpInOptErrors": ("tcp_in_opt_errors", ERROR),
    "InOptErrors": ("tcp_in_opt_errors", ERROR),
    "tcpInProtoErrors": ("tcp_in_proto_errors", ERROR),
    "InProtoErrors": ("tcp_in_proto_errors", ERROR),
    "Nak Sequence Error": ("nak_sequence_error", ERROR),
    "Nak Sequence Error Implied": ("nak_sequence_error_implied", ERROR),
    "RTO": ("rto", ERROR),
    "Rcvd Out of order packets": ("rcvd_out_of_order_packets", ERROR),
    "CRC errors": ("crc_errors", ERROR),
}

_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([GMK]?)b/sec", re.IGNORECASE)
_RATE_UNIT = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}
_STATE = re.compile(r"^\s*([0-9]+)\s*:\s*(\S*)")


class RdmaSource(StatelessSource):
    """Reads sysfs afresh on every scrape."""

    name = "rdma"

    def __init__(self, sysfs: Path = Path("/sys")) -> None:
        self.sysfs = sysfs
        self.fs = HostFs("rdma")

    def read(self) -> RdmaSnapshot:
        return replace(read_rdma(self.sysfs, self.fs), dropped=self.fs.counts())


def read_rdma(sysfs: Path, fs: HostFs = SYSFS) -> RdmaSnapshot:
    """Every RDMA device under `sysfs`, sorted by name; none when the node has no RDMA."""
    class_ib = sysfs / "class" / "infiniband"
    if not class_ib.is_dir():
        if not (sysfs / "class" / "net").is_dir():
            raise SourceUnavailable(
                f"{sysfs / 'class'} has no net or infiniband class: "
                f"is the host's /sys mounted at {sysfs}? (--sysfs)"
            )
        return RdmaSnapshot(devices=())
    return RdmaSnapshot(devices=tuple(read_device(d, fs) for d in fs.list_dir(class_ib)))


def read_device(ibdev: Path, fs: HostFs = SYSFS) -> RdmaDevice:
    """One `class/infiniband/<dev>` directory -> a device with its ports, sorted by number."""
    ports = [
        read_port(ibdev, entry, int(entry.name), fs)
        for entry in fs.list_dir(ibdev / "ports")
        # "²".isdigit() but is no int; a port directory that is a loop has nothing to read
        if entry.name.isascii() and entry.name.isdigit() and fs.exists(entry)
    ]
    ports.sort(key=lambda p: p.port)
    return RdmaDevice(
        name=label_text(ibdev.name),
        node_guid=fs.read_text(ibdev / "node_guid") or "",
        fw_version=fs.read_text(ibdev / "fw_ver") or "",
        hca_type=fs.read_text(ibdev / "hca_type") or "",
        board_id=fs.read_text(ibdev / "board_id") or "",
        ports=tuple(ports),
    )


def read_port(ibdev: Path, port_dir: Path, port: int, fs: HostFs = SYSFS) -> RdmaPort:
    counters, unread = _read_counters(port_dir / "counters", fs)
    hw, hw_unread = _read_counters(port_dir / "hw_counters", fs, skip=("lifespan",))
    errors: dict[str, int] = {}
    congestion: dict[str, int] = {}
    for raw, kind in PORT_COUNTERS.items():
        if raw in counters:
            (errors if kind == ERROR else congestion)[raw.lower()] = counters[raw]
    for raw, value in hw.items():
        known = HW_COUNTERS.get(raw)
        if known is not None:
            name, kind = known
            (errors if kind == ERROR else congestion)[name] = value
    missed = [PORT_COUNTERS.get(raw) for raw in unread]
    missed += [HW_COUNTERS[raw][1] for raw in hw_unread if raw in HW_COUNTERS]
    state, state_name = parse_state(fs.read_text(port_dir / "state"))
    phys, phys_name = parse_state(fs.read_text(port_dir / "phys_state"))
    rate = parse_rate(fs.read_text(port_dir / "rate"))
    if phys is not None and phys != PHYS_STATE_LINK_UP:
        rate = None  # a down port still shows a rate: the last, or the slowest, not a fact
    return RdmaPort(
        port=port,
        link_layer=fs.read_text(port_dir / "link_layer") or "",
        netdev=port_netdev(ibdev, port_dir, port, fs),
        state=state,
        state_name=state_name,
        physical_state=phys,
        physical_state_name=phys_name,
        rate_bytes_per_second=rate,
        transmit_bytes=_words(counters.get("port_xmit_data")),
        receive_bytes=_words(counters.get("port_rcv_data")),
        transmit_packets=counters.get("port_xmit_packets"),
        receive_packets=counters.get("port_rcv_packets"),
        errors=dict(sorted(errors.items())),
        errors_complete=ERROR not in missed,
        congestion=dict(sorted(congestion.items())),
        counters=counters,
        hw_counters=hw,
    )


def port_netdev(ibdev: Path, port_dir: Path, port: int, fs: HostFs = SYSFS) -> str:
    """The netdev of a port: its default GID's (RoCE), else its parent's only netdev (or
    the one whose `dev_port` is this port, on multi-port functions); "" if none."""
    ndev = fs.read_text(port_dir / "gid_attrs" / "ndevs" / "0")
    if ndev:
        return ndev
    nets = fs.list_dir(ibdev / "device" / "net")
    if len(nets) == 1:
        return label_text(nets[0].name)
    for net in nets:
        if fs.read_int(net / "dev_port") == port - 1:
            return label_text(net.name)
    return ""


def parse_state(text: str | None) -> tuple[int | None, str]:
    """`4: ACTIVE` -> (4, "ACTIVE"); unreadable or malformed -> (None, "")."""
    match = _STATE.match(text or "")
    if match is None:
        return None, ""
    return int(match.group(1)), match.group(2)


def parse_rate(text: str | None) -> int | None:
    """`400 Gb/sec (4X NDR)` -> 50_000_000_000 bytes per second; None if it does not parse."""
    match = _RATE.match(text or "")
    if match is None:
        return None
    bits = float(match.group(1)) * _RATE_UNIT[match.group(2).upper()]
    return round(bits / 8) if bits > 0 else None


def _words(value: int | None) -> int | None:
    return value * 4 if value is not None else None


def _read_counters(
    directory: Path, fs: HostFs, skip: tuple[str, ...] = ()
) -> tuple[dict[str, int], frozenset[str]]:
    """Every counter file in a counter directory, by name (as label text); unreadable ones,
    and values no u64 counter holds (counted as invalid), are left out, and named in the
    second value (by file name): a sum over the counters must know when it misses a part."""
    values: dict[str, int] = {}
    unread: set[str] = set()
    for entry in fs.list_dir(directory):
        if entry.name in skip:
            continue
        value = fs.read_counter(entry)
        if value is None:
            unread.add(entry.name)
        else:
            values[label_text(entry.name)] = value
    return values, frozenset(unread)

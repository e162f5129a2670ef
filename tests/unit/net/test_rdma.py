"""The rdma source reads class/infiniband ports from a sysfs tree; the exporter renders
them. mlx5_0..3 run InfiniBand, mlx5_4..7 RoCE (mlx5_6 down), irdma0 is an E810 (RoCE)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from gpuscope.agent.app.exposition import catalog
from gpuscope.agent.net.nic import NicSource, read_nics
from gpuscope.agent.net.rdma import (
    HW_COUNTERS,
    RdmaDevice,
    RdmaPort,
    RdmaSnapshot,
    RdmaSource,
    parse_rate,
    parse_state,
    read_rdma,
)
from gpuscope.agent.runtime.sources import SourceRunner, SourceUnavailable
from gpuscope.exporters.prometheus.detail import MetricSelection
from gpuscope.exporters.prometheus.families import Families
from gpuscope.exporters.prometheus.net_devices import render_nic, render_rdma
from tests.doubles.make_sysfs import MLX5_HW_COUNTERS, gpu_node
from tests.support import GOLDEN_DIR, assert_golden
from tests.support.netmetrics import promtool_check, render, scrape
from tests.support.promtext import Exposition

NODE = gpu_node()
MLX5 = [f"mlx5_{i}" for i in range(8)]


@pytest.fixture(scope="module")
def snapshot(shared_tree: Path) -> RdmaSnapshot:
    return read_rdma(shared_tree)


def device(snapshot: RdmaSnapshot, name: str) -> RdmaDevice:
    return next(d for d in snapshot.devices if d.name == name)


def port1(snapshot: RdmaSnapshot, name: str) -> RdmaPort:
    ports = device(snapshot, name).ports
    assert [p.port for p in ports] == [1]
    return ports[0]


def port_dir(sysfs: Path, name: str, port: int = 1) -> Path:
    return sysfs / "class/infiniband" / name / "ports" / str(port)


# --- devices ----------------------------------------------------------------------------


def test_every_device_is_read_in_name_order(snapshot: RdmaSnapshot) -> None:
    assert [d.name for d in snapshot.devices] == ["irdma0", *MLX5]


def test_device_identity(snapshot: RdmaSnapshot) -> None:
    mlx = device(snapshot, "mlx5_0")
    assert (mlx.hca_type, mlx.board_id, mlx.fw_version, mlx.node_guid) == (
        "MT4129",
        "MT_0000000838",
        "28.39.1002",
        "a088:c203:003a:5c10",
    )
    irdma = device(snapshot, "irdma0")
    assert (irdma.hca_type, irdma.board_id, irdma.fw_version) == ("", "", "1.71")
    assert irdma.node_guid == "b696:91ff:fea5:3c10"


def test_link_layer_and_netdev_of_each_port(snapshot: RdmaSnapshot) -> None:
    seen = {
        d.name: (port1(snapshot, d.name).link_layer, port1(snapshot, d.name).netdev)
        for d in snapshot.devices
    }
    assert seen == {
        "mlx5_0": ("InfiniBand", "ibp23s0"),
        "mlx5_1": ("InfiniBand", "ibp41s0"),
        "mlx5_2": ("InfiniBand", "ibp57s0"),
        "mlx5_3": ("InfiniBand", "ibp92s0"),
        "mlx5_4": ("Ethernet", "enp153s0np0"),
        "mlx5_5": ("Ethernet", "enp170s0np0"),
        "mlx5_6": ("Ethernet", "enp185s0np0"),
        "mlx5_7": ("Ethernet", "enp218s0np0"),
        "irdma0": ("Ethernet", "enp75s0f0"),
    }


# --- state and rate ---------------------------------------------------------------------


def test_active_ports_report_state_and_rate_in_bytes_per_second(snapshot: RdmaSnapshot) -> None:
    for name in ("mlx5_0", "mlx5_4", "mlx5_7"):
        port = port1(snapshot, name)
        assert (port.state, port.state_name) == (4, "ACTIVE")
        assert (port.physical_state, port.physical_state_name) == (5, "LinkUp")
        assert port.rate_bytes_per_second == 50_000_000_000  # 400 Gb/sec (4X NDR)
    assert port1(snapshot, "irdma0").rate_bytes_per_second == 12_500_000_000


def test_a_down_port_reports_its_state_and_no_rate(snapshot: RdmaSnapshot) -> None:
    port = port1(snapshot, "mlx5_6")
    assert (port.state, port.state_name) == (1, "DOWN")
    assert (port.physical_state, port.physical_state_name) == (3, "Disabled")
    assert port.rate_bytes_per_second is None  # sysfs says 40 Gb/sec: not the link's
    assert port.errors["link_downed"] == 1
    assert port.transmit_bytes is not None  # counters survive the link


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)", 50_000_000_000),
        ("200 Gb/sec (4X HDR)", 25_000_000_000),
        ("100 Gb/sec (4X EDR)", 12_500_000_000),
        ("56 Gb/sec (4X FDR)", 7_000_000_000),
        ("14.0625 Gb/sec (1X FDR)", 1_757_812_500),
        ("2.5 Gb/sec (1X SDR)", 312_500_000),
        ("800 Gb/sec (4X XDR)", 100_000_000_000),
        ("100 Mb/sec", 12_500_000),
        ("0 Gb/sec", None),
        ("", None),
        ("invalid", None),
        (None, None),
    ],
)
def test_parse_rate(text: str | None, expected: int | None) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4: ACTIVE", (4, "ACTIVE")),
        ("1: DOWN", (1, "DOWN")),
        ("2: INIT", (2, "INIT")),
        ("5: LinkUp", (5, "LinkUp")),
        ("ACTIVE", (None, "")),
        ("", (None, "")),
        (None, (None, "")),
    ],
)
def test_parse_state(text: str | None, expected: tuple[int | None, str]) -> None:
    assert parse_state(text) == expected


# --- counters ---------------------------------------------------------------------------


def test_data_counters_are_4_byte_words(snapshot: RdmaSnapshot) -> None:
    for name in MLX5:
        counters = NODE.rdma(name).counters
        assert counters is not None
        port = port1(snapshot, name)
        assert port.transmit_bytes == counters["port_xmit_data"] * 4
        assert port.receive_bytes == counters["port_rcv_data"] * 4
        assert port.transmit_packets == counters["port_xmit_packets"]
        assert port.receive_packets == counters["port_rcv_packets"]


def test_port_error_counters_keep_their_kernel_names_lower_cased(snapshot: RdmaSnapshot) -> None:
    errors = port1(snapshot, "mlx5_2").errors
    assert errors["symbol_error"] == 17
    assert errors["link_error_recovery"] == 2
    assert errors["port_rcv_errors"] == 5
    assert errors["vl15_dropped"] == 0
    # Traffic counters are not errors.
    for name in ("port_xmit_data", "port_rcv_packets", "unicast_xmit_packets", "port_xmit_wait"):
        assert name not in errors


def test_hw_counters_are_all_read_and_only_the_allow_list_exported(
    snapshot: RdmaSnapshot,
) -> None:
    port = port1(snapshot, "mlx5_5")
    assert set(port.hw_counters) == set(NODE.rdma("mlx5_5").hw_counters)
    assert "lifespan" not in port.hw_counters  # the cache period, not a counter
    assert port.errors["out_of_sequence"] == 311
    assert port.errors["packet_seq_err"] == 12
    assert port.errors["local_ack_timeout_err"] == 4
    for name in ("rx_write_requests", "rx_read_requests", "rx_dct_connect", "req_cqe_flush_error"):
        assert name in port.hw_counters
        assert name not in port.errors and name not in port.congestion
    exported = {HW_COUNTERS[raw][0] for raw in port.hw_counters if raw in HW_COUNTERS}
    assert exported <= set(port.errors) | set(port.congestion)


def test_congestion_counters_have_one_name_on_mlx5_and_irdma(snapshot: RdmaSnapshot) -> None:
    mlx = port1(snapshot, "mlx5_4")
    hw = NODE.rdma("mlx5_4").hw_counters
    assert mlx.congestion["cnp_sent"] == hw["np_cnp_sent"]
    assert mlx.congestion["cnp_handled"] == hw["rp_cnp_handled"]
    assert mlx.congestion["ecn_marked_packets"] == hw["np_ecn_marked_roce_packets"]
    irdma = port1(snapshot, "irdma0")
    assert irdma.congestion == {
        "cnp_handled": 48_007,
        "cnp_ignored": 0,
        "cnp_sent": 52_118,
        "ecn_marked_packets": 52_130,
    }
    assert "cnp_sent" not in mlx.errors


def test_infiniband_ports_have_transmit_wait_and_no_roce_counters(snapshot: RdmaSnapshot) -> None:
    port = port1(snapshot, "mlx5_0")
    counters = NODE.rdma("mlx5_0").counters
    assert counters is not None
    assert port.congestion == {"port_xmit_wait": counters["port_xmit_wait"]}
    assert set(port.hw_counters) == set(MLX5_HW_COUNTERS)


def test_irdma_has_no_port_counters_but_its_hw_counters(snapshot: RdmaSnapshot) -> None:
    port = port1(snapshot, "irdma0")
    assert port.counters == {}
    assert port.transmit_bytes is None and port.receive_packets is None
    assert port.errors["ip4_in_discards"] == 3
    assert port.errors["tcp_retrans_segs"] == 0
    assert port.hw_counters["ip4InOctets"] > 0


def test_newer_irdma_names_with_spaces_are_normalized(tree: Path) -> None:
    hw = port_dir(tree, "irdma0") / "hw_counters"
    (hw / "tcpRetransSegs").rename(hw / "RetransSegs")
    (hw / "Nak Sequence Error").write_text("9\n")
    (hw / "CRC errors").write_text("1\n")
    (hw / "Rx atomics").write_text("100\n")
    port = port1(read_rdma(tree), "irdma0")
    assert port.errors["nak_sequence_error"] == 9
    assert port.errors["crc_errors"] == 1
    assert port.errors["tcp_retrans_segs"] == 0
    assert port.hw_counters["Rx atomics"] == 100
    assert "rx_atomics" not in port.errors


def test_unreadable_counters_are_omitted_one_by_one(tree: Path) -> None:
    port = port_dir(tree, "mlx5_2")
    (port / "counters/port_xmit_data").unlink()
    (port / "counters/port_xmit_data").mkdir()  # a read error (EIO from a firmware query)
    (port / "counters/symbol_error").write_text("N/A\n")
    (port / "hw_counters/out_of_sequence").unlink()
    (port / "rate").unlink()
    (port / "state").write_text("\n")
    got = port1(read_rdma(tree), "mlx5_2")
    counters = NODE.rdma("mlx5_2").counters
    assert counters is not None
    assert got.transmit_bytes is None
    assert got.receive_bytes == counters["port_rcv_data"] * 4
    assert "symbol_error" not in got.errors
    assert got.errors["link_error_recovery"] == 2
    assert "out_of_sequence" not in got.errors
    assert got.errors["packet_seq_err"] == 0
    assert got.rate_bytes_per_second is None
    assert got.state is None and got.physical_state == 5
    assert not got.errors_complete  # symbol_error and out_of_sequence: no sum this time
    other = port1(read_rdma(tree), "mlx5_3")
    assert other.transmit_bytes is not None and other.errors_complete


def test_missing_counter_directories_and_identity_files(tree: Path) -> None:
    shutil.rmtree(port_dir(tree, "mlx5_1") / "hw_counters")
    shutil.rmtree(port_dir(tree, "mlx5_1") / "counters")
    (tree / "class/infiniband/mlx5_1/fw_ver").unlink()
    dev = device(read_rdma(tree), "mlx5_1")
    assert dev.fw_version == "" and dev.hca_type == "MT4129"
    assert dev.ports[0].errors == {} and dev.ports[0].transmit_bytes is None
    assert dev.ports[0].state == 4


def test_multi_port_device_matches_netdevs_by_dev_port(tree: Path) -> None:
    ibdev = tree / "class/infiniband/mlx5_0"
    shutil.copytree(ibdev / "ports/1", ibdev / "ports/2")
    net = (ibdev / "device/net").resolve()
    shutil.copytree(net / "ibp23s0", net / "ibp23s0d1", symlinks=True)
    (net / "ibp23s0d1/dev_port").write_text("1\n")
    ports = device(read_rdma(tree), "mlx5_0").ports
    assert [(p.port, p.netdev) for p in ports] == [(1, "ibp23s0"), (2, "ibp23s0d1")]


def test_an_infiniband_port_without_ipoib_has_no_netdev(tree: Path) -> None:
    net = (tree / "class/infiniband/mlx5_0/device/net").resolve()
    shutil.rmtree(net)
    assert port1(read_rdma(tree), "mlx5_0").netdev == ""


# --- absence ----------------------------------------------------------------------------


def test_no_infiniband_class_is_an_empty_success(tree: Path) -> None:
    shutil.rmtree(tree / "class/infiniband")
    assert read_rdma(tree) == RdmaSnapshot(devices=())
    runner = SourceRunner([RdmaSource(tree)])
    result = runner.collect().results["rdma"]
    assert result.success and result.records is not None and not result.records.devices
    assert render(render_rdma, result.records) == ""


def test_no_sysfs_at_all_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match=r"no net or infiniband class.*--sysfs"):
        read_rdma(tmp_path)


# --- rendering --------------------------------------------------------------------------


def test_rendered_text_passes_promtool(snapshot: RdmaSnapshot) -> None:
    promtool_check(render(render_rdma, snapshot))


def test_port_info_labels_are_exact(snapshot: RdmaSnapshot) -> None:
    m = scrape(render_rdma, snapshot)
    assert len(m.series("gpuscope_rdma_port_info")) == 9
    assert dict(next(iter(m.series("gpuscope_rdma_port_info", device="mlx5_0")))) == {
        "device": "mlx5_0",
        "port": "1",
        "link_layer": "InfiniBand",
        "hca_type": "MT4129",
        "fw_version": "28.39.1002",
        "node_guid": "a088:c203:003a:5c10",
        "netdev": "ibp23s0",
    }
    assert dict(next(iter(m.series("gpuscope_rdma_port_info", device="irdma0")))) == {
        "device": "irdma0",
        "port": "1",
        "link_layer": "Ethernet",
        "hca_type": "",
        "fw_version": "1.71",
        "node_guid": "b696:91ff:fea5:3c10",
        "netdev": "enp75s0f0",
    }


def test_port_series_in_base_units(snapshot: RdmaSnapshot) -> None:
    m = scrape(render_rdma, snapshot)
    counters = NODE.rdma("mlx5_3").counters
    assert counters is not None
    key = {"device": "mlx5_3", "port": "1"}
    assert m.value("gpuscope_rdma_port_transmit_bytes_total", **key) == pytest.approx(
        counters["port_xmit_data"] * 4
    )
    assert m.value("gpuscope_rdma_port_receive_bytes_total", **key) == pytest.approx(
        counters["port_rcv_data"] * 4
    )
    assert m.value("gpuscope_rdma_port_transmit_packets_total", **key) == pytest.approx(
        counters["port_xmit_packets"]
    )
    assert m.value("gpuscope_rdma_port_receive_packets_total", **key) == pytest.approx(
        counters["port_rcv_packets"]
    )
    assert m.value("gpuscope_rdma_port_state", **key) == 4
    assert m.value("gpuscope_rdma_port_rate_bytes_per_second", **key) == 5e10
    assert m.value("gpuscope_rdma_port_state", device="mlx5_6", port="1") == 1
    assert m.get("gpuscope_rdma_port_rate_bytes_per_second", device="mlx5_6") is None
    assert m.get("gpuscope_rdma_port_transmit_bytes_total", device="irdma0") is None


def test_errors_and_congestion_by_counter(snapshot: RdmaSnapshot) -> None:
    m = scrape(render_rdma, snapshot)
    errors = m.by_label("gpuscope_rdma_port_errors_total", "counter", device="mlx5_2", port="1")
    assert errors["symbol_error"] == 17
    assert errors["port_rcv_errors"] == 5
    roce = m.by_label("gpuscope_rdma_port_errors_total", "counter", device="mlx5_5")
    assert roce["out_of_sequence"] == 311
    congestion = m.by_label("gpuscope_rdma_port_congestion_total", "counter", device="irdma0")
    assert congestion["cnp_sent"] == 52_118
    assert m.types["gpuscope_rdma_port_errors"] == "counter"
    assert m.types["gpuscope_rdma_port_congestion"] == "counter"


def test_agent_exports_both_collectors_from_the_fixture(tree: Path) -> None:
    """The whole path: sources in a runner, rendered by the collector like a scrape."""
    agent = Agent(
        parse(["--listen", ":0", "--sysfs", str(tree)], env={}),
        sources=[NicSource(tree), RdmaSource(tree)],
    )
    agent.start()
    try:
        text = generate_latest(agent.registry).decode()
    finally:
        agent.stop()
    m = Exposition(text)
    assert m.value("gpuscope_collector_success", collector="nic") == 1
    assert m.value("gpuscope_collector_success", collector="rdma") == 1
    assert len(m.series("gpuscope_nic_info")) == 11
    assert len(m.series("gpuscope_rdma_port_info")) == 9
    promtool_check(text)


@pytest.mark.parametrize(
    ("golden", "level"), [("nic-rdma.prom", "full"), ("nic-rdma-default.prom", "default")]
)
def test_exposition_matches_golden(shared_tree: Path, golden: str, level: str) -> None:
    """Both collectors on the fixture node, byte for byte, at each detail level. After an
    intended change: GPUSCOPE_UPDATE_GOLDEN=1 pytest tests/unit/net/test_rdma.py -k golden,
    and review the diff."""
    out = Families(catalog(), MetricSelection.from_flags(level))
    render_nic(read_nics(shared_tree), out)
    render_rdma(read_rdma(shared_tree), out)
    text = out.render_text().decode()
    assert_golden(GOLDEN_DIR / golden, text, "exposition")
    promtool_check(text)

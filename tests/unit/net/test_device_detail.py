"""NIC and RDMA series at each detail level (issue #25), on the fixture node's sysfs tree.

At the default level every device serves its summary (info, state, speed, bytes, errors
summed) and a device with errors since boot also serves its detail: packets, the NIC's
MTU, and the per-counter series that are not 0. `full` serves everything. The fixture's
troubled devices: mlx5_2 (symbol errors, a link recovery, receive errors), mlx5_5 (RoCE
transport errors), mlx5_6 (link down, one link_downed), irdma0 (3 ip4InDiscards) and eno1
(2 receive errors); every other port and NIC is healthy, though each has congestion
signals or received drops.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.agent.net.nic import read_nics
from gpuscope.agent.net.rdma import read_rdma
from gpuscope.exporters.prometheus.detail import MetricSelection
from gpuscope.exporters.prometheus.net_devices import render_nic, render_rdma
from tests.support.netmetrics import promtool_check, render, scrape
from tests.support.promtext import Exposition

DEFAULT = MetricSelection.from_flags("default")
FULL = MetricSelection.from_flags("full")
TROUBLED_PORTS = {"mlx5_2", "mlx5_5", "mlx5_6", "irdma0"}
PORT_SUMMARY = {
    "gpuscope_rdma_port_info",
    "gpuscope_rdma_port_transmit_bytes_total",
    "gpuscope_rdma_port_receive_bytes_total",
    "gpuscope_rdma_port_errors_summed_total",
    "gpuscope_rdma_port_state",
    "gpuscope_rdma_port_rate_bytes_per_second",
}
NIC_SUMMARY = {
    "gpuscope_nic_info",
    "gpuscope_nic_transmit_bytes_total",
    "gpuscope_nic_receive_bytes_total",
    "gpuscope_nic_errors_summed_total",
    "gpuscope_nic_speed_bytes_per_second",
    "gpuscope_nic_up",
}


def rdma(sysfs: Path, selection: MetricSelection) -> Exposition:
    return scrape(render_rdma, read_rdma(sysfs), selection)


def nic(sysfs: Path, selection: MetricSelection) -> Exposition:
    return scrape(render_nic, read_nics(sysfs), selection)


def families_of(m: Exposition, **match: str) -> set[str]:
    """The metrics with a series matching `match` (sample names, so counters end in _total)."""
    return {name for name in m.names() if m.series(name, **match)}


def test_a_healthy_port_serves_only_its_summary_at_the_default_level(shared_tree: Path) -> None:
    m = rdma(shared_tree, DEFAULT)
    for port in ("mlx5_0", "mlx5_4", "mlx5_7"):  # InfiniBand, RoCE, RoCE
        assert families_of(m, device=port) == PORT_SUMMARY, port
        assert m.value("gpuscope_rdma_port_errors_summed_total", device=port) == 0
    # Congestion signals alone are no trouble: mlx5_4 has sent CNPs and waited for credit.
    full = rdma(shared_tree, FULL)
    assert full.value("gpuscope_rdma_port_congestion_total", device="mlx5_4", counter="cnp_sent")
    assert not m.series("gpuscope_rdma_port_congestion_total", device="mlx5_4")


def test_a_port_with_errors_serves_the_counters_that_have_counted(shared_tree: Path) -> None:
    m = rdma(shared_tree, DEFAULT)
    assert {dict(k)["device"] for k in m.series("gpuscope_rdma_port_errors_total")} == (
        TROUBLED_PORTS
    )
    assert m.by_label("gpuscope_rdma_port_errors_total", "counter", device="mlx5_2") == {
        "symbol_error": 17, "link_error_recovery": 2, "port_rcv_errors": 5,
    }  # fmt: skip
    assert m.value("gpuscope_rdma_port_errors_summed_total", device="mlx5_2") == 24
    assert m.by_label("gpuscope_rdma_port_errors_total", "counter", device="mlx5_6") == {
        "link_downed": 1
    }
    # Its congestion signals and packets too (an error ratio's denominator), zeros left out.
    congestion = m.by_label("gpuscope_rdma_port_congestion_total", "counter", device="mlx5_5")
    assert set(congestion) == {"cnp_sent", "cnp_handled", "ecn_marked_packets", "port_xmit_wait"}
    assert "cnp_ignored" not in congestion  # 0 since boot
    assert m.get("gpuscope_rdma_port_transmit_packets_total", device="mlx5_5")
    assert set(m.by_label("gpuscope_rdma_port_congestion_total", "counter", device="irdma0")) == {
        "cnp_sent", "cnp_handled", "ecn_marked_packets",
    }  # fmt: skip
    assert not m.series("gpuscope_rdma_port_transmit_packets_total", device="irdma0")  # none


def test_a_nic_serves_its_summary_and_with_errors_its_detail(shared_tree: Path) -> None:
    m = nic(shared_tree, DEFAULT)
    for device in ("ibp23s0", "enp153s0np0", "eno2"):  # eno2: down, no speed
        want = NIC_SUMMARY - (
            {"gpuscope_nic_speed_bytes_per_second"} if device == "eno2" else set()
        )
        assert families_of(m, device=device) == want, device
    # enp153s0np0 has dropped 38 received frames: drops are no errors, and not served.
    assert m.value("gpuscope_nic_errors_summed_total", device="enp153s0np0") == 0
    assert not m.series("gpuscope_nic_dropped_total", device="enp153s0np0")
    # eno1 has 2 receive errors: its packets, MTU, and the directions that have counted.
    assert families_of(m, device="eno1") == NIC_SUMMARY | {
        "gpuscope_nic_transmit_packets_total",
        "gpuscope_nic_receive_packets_total",
        "gpuscope_nic_mtu_bytes",
        "gpuscope_nic_errors_total",
        "gpuscope_nic_dropped_total",
    }
    assert m.by_label("gpuscope_nic_errors_total", "direction", device="eno1") == {"receive": 2}
    assert m.by_label("gpuscope_nic_dropped_total", "direction", device="eno1") == {"receive": 1}
    assert m.value("gpuscope_nic_errors_summed_total", device="eno1") == 2


@pytest.mark.parametrize("which", ["nic", "rdma"])
def test_full_serves_every_series_and_default_a_subset(shared_tree: Path, which: str) -> None:
    renderer, records = (
        (render_nic, read_nics(shared_tree))
        if which == "nic"
        else (render_rdma, read_rdma(shared_tree))
    )
    full = scrape(renderer, records, FULL)
    everything = scrape(renderer, records)  # the renderer tests' selection: no filter at all
    default = scrape(renderer, records, DEFAULT)
    assert full.samples == everything.samples
    assert default.samples.items() <= full.samples.items()
    assert len(default.samples) < len(full.samples) / 2
    promtool_check(render(renderer, records, DEFAULT))


def test_full_serves_every_counter_of_every_port(shared_tree: Path) -> None:
    m = rdma(shared_tree, FULL)
    assert len(m.series("gpuscope_rdma_port_errors_total")) == 238
    assert m.value("gpuscope_rdma_port_errors_total", device="mlx5_0", counter="symbol_error") == 0
    assert len(m.series("gpuscope_rdma_port_transmit_packets_total")) == 8
    assert len(nic(shared_tree, FULL).series("gpuscope_nic_dropped_total")) == 22


def test_include_serves_one_detail_family_whole(shared_tree: Path) -> None:
    """A RoCE site that watches DCQCN on every port, at the default level."""
    selection = MetricSelection.from_flags("default", "gpuscope_rdma_port_congestion_total")
    m = rdma(shared_tree, selection)
    assert len(m.series("gpuscope_rdma_port_congestion_total")) == 28  # zeros included
    assert len(m.series("gpuscope_rdma_port_errors_total")) == 8  # still the default's


def test_a_port_serves_its_detail_from_its_first_error(tree: Path) -> None:
    counters = tree / "class/infiniband/mlx5_0/ports/1/counters"
    assert not rdma(tree, DEFAULT).series("gpuscope_rdma_port_errors_total", device="mlx5_0")
    (counters / "port_xmit_discards").write_text("1\n")
    m = rdma(tree, DEFAULT)
    assert m.by_label("gpuscope_rdma_port_errors_total", "counter", device="mlx5_0") == {
        "port_xmit_discards": 1
    }
    assert set(m.by_label("gpuscope_rdma_port_congestion_total", "counter", device="mlx5_0")) == {
        "port_xmit_wait"
    }
    assert m.get("gpuscope_rdma_port_receive_packets_total", device="mlx5_0")
    assert m.value("gpuscope_rdma_port_errors_summed_total", device="mlx5_0") == 1


def test_the_sum_is_left_out_rather_than_dip_when_an_error_counter_is_unreadable(
    tree: Path,
) -> None:
    """A sum missing a part would fall, and Prometheus would take the fall for a reset."""
    port = tree / "class/infiniband/mlx5_2/ports/1"
    (port / "counters/symbol_error").unlink()
    (port / "counters/symbol_error").mkdir()  # a read error (EIO from a firmware query)
    (port / "counters/port_xmit_wait").write_text("N/A\n")  # congestion: no part of the sum
    m = rdma(tree, DEFAULT)
    assert m.get("gpuscope_rdma_port_errors_summed_total", device="mlx5_2") is None
    assert m.by_label("gpuscope_rdma_port_errors_total", "counter", device="mlx5_2") == {
        "link_error_recovery": 2, "port_rcv_errors": 5,
    }  # fmt: skip
    assert m.value("gpuscope_rdma_port_errors_summed_total", device="mlx5_3") == 0
    rx_errors = tree / "class/net/eno1/statistics/rx_errors"
    rx_errors.write_text("N/A\n")
    assert nic(tree, DEFAULT).get("gpuscope_nic_errors_summed_total", device="eno1") is None

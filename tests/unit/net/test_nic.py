"""The nic source reads physical netdevs from a sysfs tree; the exporter renders them."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuscope.agent.app.exposition import catalog
from gpuscope.agent.net.nic import NicReading, NicSnapshot, NicSource, read_nics
from gpuscope.agent.runtime.sources import SourceRunner, SourceUnavailable
from gpuscope.exporters.prometheus.families import Families
from gpuscope.exporters.prometheus.net_devices import render_nic
from tests.doubles.make_sysfs import Node, gpu_node, write_tree
from tests.support.netmetrics import promtool_check, render, scrape

NODE = gpu_node()
PHYSICAL = sorted(n.netdev for n in NODE.nics)
VIRTUAL = ("lo", "cni0", "veth3f2a9c1e", "veth8b07d4a2")


@pytest.fixture(scope="module")
def snapshot(shared_tree: Path) -> NicSnapshot:
    return read_nics(shared_tree)


def by_name(snapshot: NicSnapshot) -> dict[str, NicReading]:
    return {n.device: n for n in snapshot.nics}


def one(sysfs: Path, device: str) -> NicReading:
    return by_name(read_nics(sysfs))[device]


def netdev_dir(sysfs: Path, device: str) -> Path:
    return (sysfs / "class/net" / device).resolve()


# --- which devices ----------------------------------------------------------------------


def test_only_physical_devices_are_reported_in_name_order(snapshot: NicSnapshot) -> None:
    assert [n.device for n in snapshot.nics] == PHYSICAL
    assert len(PHYSICAL) == 11  # 8 ConnectX-7, 2 onboard ports, 1 E810
    for name in (*VIRTUAL, "bonding_masters"):
        assert name not in by_name(snapshot)


def test_virtual_devices_are_skipped_even_with_a_speed_and_statistics(shared_tree: Path) -> None:
    veth = shared_tree / "class/net/veth3f2a9c1e"
    assert (veth / "speed").read_text().strip() == "10000"
    assert (veth / "statistics/tx_bytes").is_file()
    assert "veth3f2a9c1e" not in by_name(read_nics(shared_tree))


def test_a_node_with_only_virtual_devices_has_no_nics(tmp_path: Path) -> None:
    write_tree(tmp_path, Node(nics=(), virtual=gpu_node().virtual))
    assert read_nics(tmp_path) == NicSnapshot(nics=())


# --- identity ---------------------------------------------------------------------------


def test_identity_of_an_infiniband_nic(snapshot: NicSnapshot) -> None:
    nic = by_name(snapshot)["ibp23s0"]
    assert (nic.driver, nic.pci_bus_id, nic.numa_node, nic.rdma) == (
        "mlx5_core",
        "0000:17:00.0",
        0,
        True,
    )


def test_identity_of_every_nic_matches_the_tree(snapshot: NicSnapshot) -> None:
    for nic in snapshot.nics:
        spec = NODE.nic(nic.device)
        assert nic.driver == spec.pci.driver
        assert nic.pci_bus_id == spec.pci.address
        assert nic.numa_node == spec.pci.numa_node
        assert nic.rdma == (spec.rdma is not None), nic.device


def test_connectx7_numa_nodes_split_four_and_four(snapshot: NicSnapshot) -> None:
    numa = {n.device: n.numa_node for n in snapshot.nics if n.driver == "mlx5_core"}
    assert sorted(v for v in numa.values() if v is not None) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert numa["enp218s0np0"] == 1


def test_onboard_ethernet_is_not_rdma(snapshot: NicSnapshot) -> None:
    eno1 = by_name(snapshot)["eno1"]
    assert (eno1.driver, eno1.pci_bus_id, eno1.rdma) == ("ixgbe", "0000:03:00.0", False)


def test_numa_node_minus_one_is_omitted(tree: Path) -> None:
    (netdev_dir(tree, "eno1") / "device/numa_node").write_text("-1\n")
    assert one(tree, "eno1").numa_node is None


def test_no_driver_bound(tree: Path) -> None:
    eno1 = netdev_dir(tree, "eno1")
    (eno1 / "device/driver").unlink()
    assert one(tree, "eno1").driver == ""


def add_netdev(tree: Path, parent: str, name: str) -> None:
    """A netdev whose `device` is `devices/<parent>`."""
    netdir = tree / "devices" / parent / "net" / name
    (netdir / "statistics").mkdir(parents=True)
    (netdir / "device").symlink_to("../../../" + parent.rsplit("/", 1)[-1])
    (tree / "class/net" / name).symlink_to(f"../../devices/{parent}/net/{name}")


def test_a_virtio_nic_reports_the_pci_function_it_sits_on(tree: Path) -> None:
    function = tree / "devices/pci0000:00/0000:00:03.0"
    (function / "virtio0").mkdir(parents=True)
    (function / "numa_node").write_text("1\n")
    (function / "virtio0/driver").symlink_to("../../../../bus/virtio/drivers/virtio_net")
    add_netdev(tree, "pci0000:00/0000:00:03.0/virtio0", "eth0")
    eth0 = one(tree, "eth0")
    assert (eth0.pci_bus_id, eth0.driver, eth0.numa_node, eth0.rdma) == (
        "0000:00:03.0",
        "virtio_net",
        1,
        False,
    )


def test_a_nic_off_pci_is_physical_without_a_bus_id(tree: Path) -> None:
    (tree / "devices/platform/soc/30be0000.ethernet").mkdir(parents=True)
    add_netdev(tree, "platform/soc/30be0000.ethernet", "end0")
    end0 = one(tree, "end0")
    assert (end0.pci_bus_id, end0.driver, end0.numa_node) == ("", "", None)


# --- RDMA detection ---------------------------------------------------------------------


def move_irdma_under_auxiliary_device(tree: Path) -> None:
    """Parent irdma0 on the ice auxiliary device, as some irdma versions do: then neither
    the netdev's `device/infiniband` nor the RDMA device's `device/net` links the two, and
    only the GID table's netdev does."""
    function = netdev_dir(tree, "enp75s0f0") / "device"
    function = function.resolve()
    aux = function / "ice.roce.0"
    (aux / "infiniband").mkdir(parents=True)
    (function / "infiniband/irdma0").rename(aux / "infiniband/irdma0")
    (function / "infiniband").rmdir()
    ibdev = aux / "infiniband/irdma0"
    (ibdev / "device").unlink()
    (ibdev / "device").symlink_to("../../../ice.roce.0")
    link = tree / "class/infiniband/irdma0"
    link.unlink()
    link.symlink_to(
        "../../devices/pci0000:4a/0000:4a:02.0/0000:4b:00.0/ice.roce.0/infiniband/irdma0"
    )


def test_rdma_found_through_the_gid_table_when_parented_elsewhere(tree: Path) -> None:
    move_irdma_under_auxiliary_device(tree)
    assert one(tree, "enp75s0f0").rdma is True
    ndev = tree / "class/infiniband/irdma0/ports/1/gid_attrs/ndevs/0"
    ndev.unlink()
    assert one(tree, "enp75s0f0").rdma is False


def test_rdma_found_through_the_rdma_devices_parent(tree: Path) -> None:
    """InfiniBand ports have no netdev in their GID table; the shared PCI function links."""
    assert one(tree, "ibp23s0").rdma is True
    shutil.rmtree(tree / "class/infiniband")
    assert one(tree, "ibp23s0").rdma is True  # device/infiniband/mlx5_0 still says so
    shutil.rmtree(netdev_dir(tree, "ibp23s0") / "device/infiniband")
    assert one(tree, "ibp23s0").rdma is False


# --- values -----------------------------------------------------------------------------


def test_statistics_match_the_tree(snapshot: NicSnapshot) -> None:
    for nic in snapshot.nics:
        stats = NODE.nic(nic.device).stats
        assert nic.transmit_bytes == stats["tx_bytes"]
        assert nic.receive_bytes == stats["rx_bytes"]
        assert nic.transmit_packets == stats["tx_packets"]
        assert nic.receive_packets == stats["rx_packets"]
        assert nic.transmit_errors == stats["tx_errors"]
        assert nic.receive_errors == stats["rx_errors"]
        assert nic.transmit_dropped == stats["tx_dropped"]
        assert nic.receive_dropped == stats["rx_dropped"]


def test_speed_is_converted_from_megabits_to_bytes_per_second(snapshot: NicSnapshot) -> None:
    nics = by_name(snapshot)
    assert nics["ibp23s0"].speed_bytes_per_second == 50_000_000_000  # 400 Gb/s NDR
    assert nics["enp75s0f0"].speed_bytes_per_second == 12_500_000_000  # 100 GbE
    assert nics["eno1"].speed_bytes_per_second == 1_250_000_000  # 10 GbE


def test_mtu_and_operstate(snapshot: NicSnapshot) -> None:
    nics = by_name(snapshot)
    assert (nics["ibp23s0"].mtu_bytes, nics["ibp23s0"].operstate) == (4092, "up")
    assert (nics["enp153s0np0"].mtu_bytes, nics["eno1"].mtu_bytes) == (9000, 1500)


def test_a_down_link_has_no_speed_and_is_down(snapshot: NicSnapshot) -> None:
    for name in ("eno2", "enp185s0np0"):
        nic = by_name(snapshot)[name]
        assert nic.operstate == "down"
        assert nic.speed_bytes_per_second is None
        assert nic.transmit_bytes is not None  # still reported, with its counters


@pytest.mark.parametrize("content", ["-1", "0", "4294967295", "", "unknown"])
def test_unknown_speeds_are_omitted(tree: Path, content: str) -> None:
    (netdev_dir(tree, "eno1") / "speed").write_text(content + "\n")
    assert one(tree, "eno1").speed_bytes_per_second is None


def test_a_counter_no_kernel_can_hold_is_omitted_and_counted_as_invalid(tree: Path) -> None:
    """netdev statistics are u64: a value past 2**64-1 is not served as a counter (it would
    ruin every rate() over it) but dropped and counted; 2**64-1 itself reads."""
    from gpuscope.agent.hostfs import HostFs

    eno1 = netdev_dir(tree, "eno1")
    (eno1 / "statistics/tx_bytes").write_text("184467440737095516159999999\n")
    (eno1 / "statistics/rx_bytes").write_text(f"{2**64 - 1}\n")
    fs = HostFs("nic")
    nic = by_name(read_nics(tree, fs))["eno1"]
    assert nic.transmit_bytes is None
    assert nic.receive_bytes == 2**64 - 1
    assert nic.transmit_packets == NODE.nic("eno1").stats["tx_packets"]
    assert fs.counts()["invalid"] == 1


def test_unreadable_files_are_omitted_one_by_one(tree: Path) -> None:
    eno1 = netdev_dir(tree, "eno1")
    # EINVAL/EIO stand-ins (tests run as root, so chmod would not do): a directory where
    # the file should be, a file that vanished, a value that is not a number.
    (eno1 / "speed").unlink()
    (eno1 / "speed").mkdir()  # read fails like EINVAL on a down link with old drivers
    (eno1 / "statistics/tx_bytes").unlink()
    (eno1 / "statistics/rx_errors").write_text("garbage\n")
    (eno1 / "operstate").unlink()
    nic = one(tree, "eno1")
    stats = NODE.nic("eno1").stats
    assert nic.speed_bytes_per_second is None
    assert nic.transmit_bytes is None
    assert nic.receive_errors is None
    assert nic.operstate is None
    assert nic.receive_bytes == stats["rx_bytes"]
    assert nic.transmit_packets == stats["tx_packets"]
    assert nic.mtu_bytes == 1500
    assert nic.driver == "ixgbe"


def test_a_netdev_without_statistics_is_still_reported(tree: Path) -> None:
    shutil.rmtree(netdev_dir(tree, "eno1") / "statistics")
    nic = one(tree, "eno1")
    assert nic.transmit_bytes is None and nic.receive_dropped is None
    assert nic.pci_bus_id == "0000:03:00.0"


def test_no_class_net_means_the_source_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match=r"class/net does not exist.*--sysfs"):
        read_nics(tmp_path)


def test_source_reads_at_each_collection(tree: Path) -> None:
    source = NicSource(tree)
    assert source.name == "nic"
    runner = SourceRunner([source])
    runner.start()
    first = runner.collect().results["nic"]
    assert first.success and isinstance(first.records, NicSnapshot)
    (netdev_dir(tree, "eno1") / "statistics/tx_bytes").write_text("123\n")
    records = runner.collect().results["nic"].records
    assert isinstance(records, NicSnapshot)
    assert by_name(records)["eno1"].transmit_bytes == 123
    runner.stop()


def test_source_without_sysfs_fails_with_a_clear_error(tmp_path: Path) -> None:
    runner = SourceRunner([NicSource(tmp_path / "nothing")])
    result = runner.collect().results["nic"]
    assert not result.success
    assert result.error is not None and "class/net does not exist" in result.error


# --- rendering --------------------------------------------------------------------------


def test_rendered_text_passes_promtool(snapshot: NicSnapshot) -> None:
    promtool_check(render(render_nic, snapshot))


def test_info_labels_are_exact(snapshot: NicSnapshot) -> None:
    m = scrape(render_nic, snapshot)
    info = m.series("gpuscope_nic_info")
    assert len(info) == len(PHYSICAL)
    assert (
        m.value(
            "gpuscope_nic_info",
            device="ibp23s0",
            driver="mlx5_core",
            pci_bus_id="0000:17:00.0",
            numa_node="0",
            rdma="true",
        )
        == 1
    )
    assert dict(next(iter(m.series("gpuscope_nic_info", device="eno1")))) == {
        "device": "eno1",
        "driver": "ixgbe",
        "pci_bus_id": "0000:03:00.0",
        "numa_node": "0",
        "rdma": "false",
    }
    assert m.get("gpuscope_nic_info", device="enp218s0np0", numa_node="1", rdma="true") == 1


def test_counters_and_gauges_are_rendered_in_base_units(snapshot: NicSnapshot) -> None:
    m = scrape(render_nic, snapshot)
    stats = NODE.nic("eno1").stats
    assert m.value("gpuscope_nic_transmit_bytes_total", device="eno1") == stats["tx_bytes"]
    assert m.value("gpuscope_nic_receive_bytes_total", device="eno1") == stats["rx_bytes"]
    assert m.value("gpuscope_nic_transmit_packets_total", device="eno1") == stats["tx_packets"]
    assert m.value("gpuscope_nic_receive_packets_total", device="eno1") == stats["rx_packets"]
    assert m.by_label("gpuscope_nic_errors_total", "direction", device="eno1") == {
        "transmit": 0,
        "receive": 2,
    }
    assert m.by_label("gpuscope_nic_dropped_total", "direction", device="eno1") == {
        "transmit": stats["tx_dropped"],
        "receive": stats["rx_dropped"],
    }
    assert m.value("gpuscope_nic_speed_bytes_per_second", device="ibp23s0") == 5e10
    assert m.value("gpuscope_nic_mtu_bytes", device="ibp23s0") == 4092
    assert m.types["gpuscope_nic_transmit_bytes"] == "counter"


def test_a_down_link_renders_down_without_speed(snapshot: NicSnapshot) -> None:
    m = scrape(render_nic, snapshot)
    assert m.value("gpuscope_nic_up", device="enp185s0np0") == 0
    assert m.value("gpuscope_nic_up", device="enp153s0np0") == 1
    assert m.get("gpuscope_nic_speed_bytes_per_second", device="enp185s0np0") is None
    assert len(m.series("gpuscope_nic_speed_bytes_per_second")) == len(PHYSICAL) - 2
    assert m.get("gpuscope_nic_transmit_bytes_total", device="enp185s0np0") is not None


def test_unreadable_values_are_omitted_from_the_output(tree: Path) -> None:
    eno1 = netdev_dir(tree, "eno1")
    (eno1 / "statistics/tx_bytes").unlink()
    (eno1 / "operstate").unlink()
    text = render(render_nic, read_nics(tree))
    m = scrape(render_nic, read_nics(tree))
    assert m.get("gpuscope_nic_transmit_bytes_total", device="eno1") is None
    assert m.get("gpuscope_nic_up", device="eno1") is None
    assert m.get("gpuscope_nic_receive_bytes_total", device="eno1") is not None
    promtool_check(text)


def test_fast_text_is_what_prometheus_client_writes(snapshot: NicSnapshot) -> None:
    out = Families(catalog())
    render_nic(snapshot, out)

    class Fixed(Collector):
        def collect(self) -> Iterator[Metric]:
            return out.metrics()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    assert out.render_text() == generate_latest(registry)

"""A sysfs tree with hostile entries: a netdev named with a byte that is not UTF-8, symlink
loops, a huge attribute, a FIFO. Each costs its own values at most; the rest of the node is
read and rendered, and each failing file is logged once, not once per scrape."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

import pytest

from gpuscope.agent.net.nic import NicReading, NicSnapshot, NicSource, read_nics
from gpuscope.agent.net.rdma import RdmaSource, read_rdma
from gpuscope.agent.pci import locate
from gpuscope.agent.runtime.sources import SourceRunner
from gpuscope.exporters.prometheus.net_devices import render_nic, render_rdma
from tests.doubles.make_sysfs import gpu_node
from tests.support.netmetrics import promtool_check, render, scrape

NODE = gpu_node()
BAD = b"eth\xff0"  # a netdev name that is not UTF-8 (any bytes but "/" are allowed)
SHOWN = "eth\\xff0"  # how it is reported


def netdev_dir(sysfs: Path, device: str) -> Path:
    return (sysfs / "class/net" / device).resolve()


def add_netdev_like(sysfs: Path, model: str, name: bytes) -> Path:
    """A second netdev on `model`'s PCI function, named `name` (bytes)."""
    original = netdev_dir(sysfs, model)
    copy = Path(os.fsdecode(os.fsencode(original.parent) + b"/" + name))
    shutil.copytree(original, copy, symlinks=True)
    link = Path(os.fsdecode(os.fsencode(sysfs / "class/net") + b"/" + name))
    link.symlink_to(os.path.relpath(copy, link.parent))
    return copy


def by_name(snapshot: NicSnapshot) -> dict[str, NicReading]:
    return {n.device: n for n in snapshot.nics}


def test_a_netdev_named_with_a_byte_that_is_not_utf8_is_reported_and_renders(
    tree: Path,
) -> None:
    add_netdev_like(tree, "eno2", BAD)
    snapshot = read_nics(tree)
    nics = {n.device: n for n in snapshot.nics}
    assert SHOWN in nics and "eno2" in nics
    assert nics[SHOWN].transmit_bytes == nics["eno2"].transmit_bytes
    assert nics[SHOWN].pci_bus_id == "0000:03:00.1"
    text = render(render_nic, snapshot)
    assert f'device="{SHOWN.replace(chr(92), chr(92) * 2)}"' in text
    m = scrape(render_nic, snapshot)
    assert m.value("gpuscope_nic_up", device=SHOWN) == m.value("gpuscope_nic_up", device="eno2")
    assert len(m.series("gpuscope_nic_info")) == len(NODE.nics) + 1
    promtool_check(text)


def test_a_netdev_link_that_loops_is_skipped_and_logged_once(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tree / "class/net/loop9").symlink_to("loop9")
    source = NicSource(tree)
    runner = SourceRunner([source])
    runner.start()
    for _ in range(3):
        result = runner.collect().results["nic"]
        assert result.success
        assert isinstance(result.records, NicSnapshot)
        assert len(result.records.nics) == len(NODE.nics)
    runner.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuscope.hostfs"]
    assert len(lines) == 1 and lines[0].startswith("nic: cannot read") and "ELOOP" in lines[0]
    assert source.fs.counts()["loop"] == 3
    # ... and counted on /metrics, so the drop is visible without reading the log.
    m = scrape(render_nic, result.records)
    assert m.value("gpuscope_inputs_dropped_total", stage="nic", reason="loop") == 3
    assert m.value("gpuscope_inputs_dropped_total", stage="nic", reason="unreadable") == 0


def test_a_statistics_loop_costs_only_that_netdevs_counters(tree: Path) -> None:
    stats = netdev_dir(tree, "eno1") / "statistics"
    shutil.rmtree(stats)
    stats.symlink_to("statistics")
    nics = by_name(read_nics(tree))
    eno1 = nics["eno1"]
    assert eno1.transmit_bytes is None and eno1.receive_errors is None
    assert eno1.mtu_bytes == 1500 and eno1.driver == "ixgbe"
    assert nics["eno2"].transmit_bytes is not None


def test_a_device_link_into_a_loop_is_no_physical_netdev(tree: Path) -> None:
    eno1 = netdev_dir(tree, "eno1")
    (eno1 / "device").unlink()
    (eno1 / "device").symlink_to("device")
    assert "eno1" not in by_name(read_nics(tree))
    assert "eno2" in by_name(read_nics(tree))


def test_a_huge_attribute_is_read_only_up_to_the_cap(tree: Path) -> None:
    """A 50 MB sparse rx_bytes: the value is left out after reading 64 KiB, not 50 MB."""
    rx = netdev_dir(tree, "eno1") / "statistics/rx_bytes"
    os.truncate(rx, 50 * 2**20)
    eno1 = by_name(read_nics(tree))["eno1"]
    assert eno1.receive_bytes is None
    assert eno1.transmit_bytes == NODE.nic("eno1").stats["tx_bytes"]


def test_a_fifo_for_an_attribute_does_not_hang_the_collection(tree: Path) -> None:
    speed = netdev_dir(tree, "eno1") / "speed"
    speed.unlink()
    os.mkfifo(speed)
    found: list[NicSnapshot] = []
    reader = threading.Thread(target=lambda: found.append(read_nics(tree)), daemon=True)
    reader.start()
    reader.join(timeout=60)  # generous: a blocking open never returns
    assert found, "reading a FIFO blocked the collection"
    eno1 = by_name(found[0])["eno1"]
    assert eno1.speed_bytes_per_second is None and eno1.mtu_bytes == 1500


def test_rdma_names_with_bad_bytes_render_and_odd_port_names_are_ignored(tree: Path) -> None:
    ib = tree / "class/infiniband"
    original = (ib / "mlx5_0").resolve()
    copy = Path(os.fsdecode(os.fsencode(original.parent) + b"/mlx5_\xfe"))
    shutil.copytree(original, copy, symlinks=True)
    Path(os.fsdecode(os.fsencode(ib) + b"/mlx5_\xfe")).symlink_to(os.path.relpath(copy, ib))
    shutil.copytree(copy / "ports/1", copy / "ports/²")  # "²".isdigit(), yet no int
    (copy / "ports/2").symlink_to("2")  # a loop
    snapshot = read_rdma(tree)
    devices = {d.name: d for d in snapshot.devices}
    odd = devices["mlx5_\\xfe"]
    assert [p.port for p in odd.ports] == [1]
    assert odd.ports[0].transmit_bytes == devices["mlx5_0"].ports[0].transmit_bytes
    text = render(render_rdma, snapshot)
    assert 'device="mlx5_\\\\xfe"' in text
    promtool_check(text)


def test_rdma_source_survives_a_counter_directory_loop(tree: Path) -> None:
    counters = (tree / "class/infiniband/mlx5_0").resolve() / "ports/1/counters"
    shutil.rmtree(counters)
    counters.symlink_to("counters")
    source = RdmaSource(tree)
    port = next(d for d in source.read().devices if d.name == "mlx5_0").ports[0]
    assert port.transmit_bytes is None and port.counters == {}
    assert port.state_name == "ACTIVE" and port.hw_counters  # the rest of the port is read
    assert source.fs.counts()["loop"] == 1
    m = scrape(render_rdma, source.read())
    assert m.value("gpuscope_inputs_dropped_total", stage="rdma", reason="loop") == 2


def test_pci_location_with_a_huge_numa_node_has_no_numa_node(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    address = "0000:03:00.0"
    located = locate(tree, address)
    assert located is not None and located.numa_node == 0
    numa = (tree / "bus/pci/devices" / address).resolve() / "numa_node"
    os.truncate(numa, 50 * 2**20)
    located = locate(tree, address)
    assert located is not None and located.numa_node is None
    assert located.path[-1] == address
    assert "larger than 65536 bytes" in caplog.text

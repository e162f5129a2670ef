"""The series budget (issue #15): what an 8x H100 node costs in series at each detail level,
and that the default level still shows every exception an alert or a dashboard needs.

At the default level a GPU serves per-GPU summaries (NVLink links by state, NVLink errors
summed by type) and only the exceptions (a link down or erroring, a throttle reason that
applies, a stuck or fenced GPU, a refused XID registration); `--metrics-detail full` serves
every per-link and per-reason series; `--metrics-include`/`--metrics-exclude` pick families
by name in between. The node's NICs and RDMA ports follow the same levels (issue #25): a
summary per device, and the counters of the devices with errors
(tests/unit/net/test_device_detail.py).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tests.doubles.make_sysfs import write_tree
from tests.support import wait_for

BUDGET_PER_GPU = 40  # issue #15: about dcgm-exporter's default counter set, times two
BUDGET_NIC_RDMA = 150  # issue #25: the dgx-h100 node's 9 RDMA ports and 11 NICs, together
UUID = re.compile(r'\buuid="([^"]+)"')
NIC_RDMA = re.compile(r"^gpuscope_(nic|rdma)_")


def series_per_gpu(text: str) -> Counter[str]:
    """Series per GPU UUID in an exposition (comment lines skipped)."""
    return Counter(
        m.group(1)
        for line in text.splitlines()
        if line and not line.startswith("#") and (m := UUID.search(line))
    )


def test_an_h100_gpu_costs_at_most_40_series_at_the_default_level(inprocess) -> None:
    h = inprocess("dgx-h100", "--collectors", "gpu")
    h.fake.set_utilization(0, 95, 60)
    h.fake.set_throttle_reasons(0, 0x04)  # sw power cap: a reason that applies (+1)
    h.advance(5)
    text = h.scrape_text()
    per_gpu = series_per_gpu(text)
    assert len(per_gpu) == 8
    busy = max(per_gpu.values())
    assert busy <= BUDGET_PER_GPU + 1, per_gpu  # GPU 0: its power cap reason
    assert all(n <= BUDGET_PER_GPU for uuid, n in per_gpu.items() if n != busy), per_gpu

    full = inprocess("dgx-h100", "--collectors", "gpu", "--metrics-detail", "full")
    full.advance(5)
    per_gpu_full = series_per_gpu(full.scrape_text())
    # Every per-link state, error and byte counter (18 links x 7), every reason and pipe.
    assert min(per_gpu_full.values()) > 4 * BUDGET_PER_GPU, per_gpu_full


def nic_rdma_series(text: str) -> int:
    return sum(1 for line in text.splitlines() if NIC_RDMA.match(line))


def test_the_node_with_its_nics_and_rdma_ports_keeps_both_budgets(
    inprocess, tmp_path: Path
) -> None:
    """Every node-level collector on the fixture node: 8 H100s, 8 ConnectX-7 and an E810
    (9 RDMA ports, 4 of them with errors since boot) and 11 NICs (one with errors)."""
    sysfs = write_tree(tmp_path / "sys")
    node = ("dgx-h100", "--collectors", "gpu,nic,rdma", "--sysfs", str(sysfs))
    h = inprocess(*node)
    h.advance(5)
    text = h.scrape_text()
    per_gpu = series_per_gpu(text)
    assert len(per_gpu) == 8 and max(per_gpu.values()) <= BUDGET_PER_GPU, per_gpu
    assert nic_rdma_series(text) <= BUDGET_NIC_RDMA
    full = inprocess(*node, "--metrics-detail", "full")
    full.advance(5)
    # Every counter of every device: the 238 RDMA error counters alone.
    assert nic_rdma_series(full.scrape_text()) > 3 * BUDGET_NIC_RDMA


def test_a_link_down_or_erroring_is_served_per_link_at_the_default_level(inprocess) -> None:
    h = inprocess("dgx-h100")
    h.fake.set_nvlink_up(2, 5, False)
    h.fake.add_nvlink_errors(2, 14, "crc_flit", 2)
    h.fake.add_nvlink_errors(2, 14, "replay", 1)
    m = h.scrape()
    assert m.by_label("gpuscope_gpu_nvlink_links", "state", gpu="2") == {"up": 17, "down": 1}
    assert m.by_label("gpuscope_gpu_nvlink_links", "state", gpu="3") == {"up": 18, "down": 0}
    # Only the troubled links have per-link series, with every error type of those links.
    assert m.by_label("gpuscope_gpu_nvlink_link_up", "link", gpu="2") == {"5": 0, "14": 1}
    assert not m.series("gpuscope_gpu_nvlink_link_up", gpu="3")
    errors = m.series("gpuscope_gpu_nvlink_link_errors_total", gpu="2")
    assert {dict(k)["link"] for k in errors} == {"5", "14"}
    assert m.value("gpuscope_gpu_nvlink_link_errors_total", gpu="2", link="14", type="replay") == 1
    # The per-GPU sums over all 18 links, by type, on every GPU with NVLink.
    assert m.by_label("gpuscope_gpu_nvlink_errors_total", "type", gpu="2") == {
        "crc_flit": 2, "crc_data": 0, "replay": 1, "recovery": 0,
    }  # fmt: skip
    assert len(m.series("gpuscope_gpu_nvlink_errors_total")) == 8 * 4
    assert not m.series("gpuscope_gpu_nvlink_link_transmit_bytes_total")


def test_a_fenced_gpu_is_said_at_the_default_level_and_a_healthy_one_costs_nothing(
    inprocess,
) -> None:
    h = inprocess("dgx-h100")
    m = h.scrape()
    for name in ("gpuscope_gpu_fenced", "gpuscope_gpu_stuck_seconds"):
        assert not m.series(name), f"{name} served for healthy GPUs at the default level"
    assert not m.series("gpuscope_gpu_xid_events_watched")  # all watched: nothing to say
    h.fake.inject_xid(2, 79)  # fallen off the bus: fatal, the GPU is fenced
    wait_for(lambda: h.scrape().get("gpuscope_gpu_fenced", gpu="2") == 1, what="GPU 2 fenced")
    m = h.scrape()
    assert len(m.series("gpuscope_gpu_fenced")) == 1
    assert m.value("gpuscope_gpu_fatal_xid_info", gpu="2", xid="79") == 1


def test_include_serves_a_family_whole_and_exclude_removes_it(inprocess) -> None:
    h = inprocess(
        "dgx-h100",
        "--metrics-include", "gpuscope_gpu_nvlink_link_up|gpuscope_gpu_throttle_reasons",
        "--metrics-exclude", "gpuscope_gpu_(clock|temperature)_.*|gpuscope_collector_success",
    )  # fmt: skip
    m = h.scrape()
    assert len(m.series("gpuscope_gpu_nvlink_link_up")) == 8 * 18
    assert len(m.series("gpuscope_gpu_throttle_reasons", gpu="0")) == 9  # 0s included
    for gone in ("gpuscope_gpu_clock_hertz", "gpuscope_gpu_temperature_celsius"):
        assert not m.series(gone), gone
    # A scrape always says whether its collectors worked: the health series stay.
    assert m.value("gpuscope_collector_success", collector="gpu") == 1
    # Families left at the default level are unchanged.
    assert not m.series("gpuscope_gpu_nvlink_link_errors_total")

"""What each kind of node exports: NVSwitch HGX, PCIe-only, MIG, and mixed models.

Every profile must also run without a single NVML error other than NOT_SUPPORTED: an
unexpected error means the agent calls NVML wrongly.
"""

from __future__ import annotations

import pytest

MIB = 1024 * 1024


@pytest.mark.parametrize("profile", ["dgx-h100", "hgx-a100-mig", "pcie-l40s", "mixed"])
def test_no_nvml_errors_other_than_not_supported(inprocess, profile: str) -> None:
    h = inprocess(profile)
    h.advance(3)
    metrics = h.scrape()
    assert metrics.value("gpuscope_collector_success", collector="gpu") == 1
    assert dict(h.gpu.nvml.errors) == {}


@pytest.mark.pinned_bindings("expects NVML's NUMA node, absent before nvidia-ml-py 12.550")
def test_h100_values_are_in_base_units(inprocess) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    h.fake.set_utilization(0, 100, 50)
    h.fake.set_memory_used(0, 40_000 * MIB)
    h.advance(2)
    m = h.scrape()
    g0 = {"gpu": "0"}
    assert m.value("gpuscope_gpu_memory_total_bytes", **g0) == 81559 * MIB
    assert m.value("gpuscope_gpu_memory_used_bytes", **g0) == 40_000 * MIB
    assert m.value("gpuscope_gpu_utilization_ratio", **g0) == 1.0
    assert m.value("gpuscope_gpu_memory_utilization_ratio", **g0) == 0.5
    assert m.value("gpuscope_gpu_power_limit_watts", **g0) == 700.0
    assert 100 < m.value("gpuscope_gpu_power_watts", **g0) <= 700
    assert m.value("gpuscope_gpu_clock_max_hertz", clock="sm", **g0) == 1980e6
    assert m.value("gpuscope_gpu_pcie_link_generation", state="max", **g0) == 5
    assert m.value("gpuscope_gpu_pcie_link_width", state="max", **g0) == 16
    assert set(m.by_label("gpuscope_gpu_temperature_celsius", "sensor", **g0)) == {
        "gpu",
        "memory",
    }
    (labels,) = m.series("gpuscope_gpu_info", **g0)
    expected = {
        "model": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:18:00.0",
        "architecture": "hopper",
        "compute_capability": "9.0",
        "numa_node": "0",
        "mig_mode": "disabled",
        "driver_version": "550.54.15",
        "cuda_driver_version": "12.4",
    }
    info = dict(labels)
    assert {k: info[k] for k in expected} == expected
    assert m.series("gpuscope_gpu_info", gpu="7", numa_node="1")


def test_h100_energy_and_pcie_counters_increase_with_work(inprocess) -> None:
    h = inprocess("dgx-h100")
    h.fake.set_utilization(1, 90)
    before = h.scrape()
    h.advance(10)
    after = h.scrape()
    for name in (
        "gpuscope_gpu_energy_joules_total",
        "gpuscope_gpu_pcie_transmit_bytes_total",
        "gpuscope_gpu_pcie_receive_bytes_total",
        "gpuscope_gpu_nvlink_transmit_bytes_total",
        "gpuscope_gpu_nvlink_receive_bytes_total",
    ):
        assert after.value(name, gpu="1") > before.value(name, gpu="1"), name
    # Energy over 10 s at a few hundred watts: joules, not millijoules.
    delta = after.value("gpuscope_gpu_energy_joules_total", gpu="1") - before.value(
        "gpuscope_gpu_energy_joules_total", gpu="1"
    )
    assert 10 * 50 < delta < 10 * 700


def test_nvswitch_gpu_has_18_links_with_state_and_errors(inprocess) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    h.fake.set_nvlink_up(2, 5, False)
    h.fake.add_nvlink_errors(2, 5, "replay", 3)
    h.fake.add_nvlink_errors(2, 14, "crc_flit", 2)
    m = h.scrape()
    up = m.by_label("gpuscope_gpu_nvlink_link_up", "link", gpu="2")
    assert len(up) == 18
    assert up["5"] == 0 and sum(up.values()) == 17
    assert m.by_label("gpuscope_gpu_nvlink_links", "state", gpu="2") == {"up": 17, "down": 1}
    per_link = "gpuscope_gpu_nvlink_link_errors_total"
    assert m.value(per_link, gpu="2", link="5", type="replay") == 3
    assert m.value(per_link, gpu="2", link="14", type="crc_flit") == 2
    kinds = {dict(k)["type"] for k in m.series(per_link, gpu="2")}
    assert kinds == {"crc_flit", "crc_data", "replay", "recovery"}
    # crc_data exists only for links 0-11 in NVML's field ids.
    assert m.get(per_link, gpu="2", link="14", type="crc_data") is None
    # The per-GPU sums over the links.
    assert m.value("gpuscope_gpu_nvlink_errors_total", gpu="2", type="replay") == 3
    assert m.value("gpuscope_gpu_nvlink_errors_total", gpu="2", type="crc_flit") == 2
    assert len(m.series("gpuscope_gpu_nvlink_errors_total", gpu="2")) == 4
    # Per-link throughput is full detail too: 8 GPUs x 18 links x 2.
    assert len(m.series("gpuscope_gpu_nvlink_link_transmit_bytes_total")) == 8 * 18


def test_per_link_nvlink_throughput_behind_a_flag(inprocess) -> None:
    """--nvlink-per-link serves the per-link throughput at the default detail level."""
    h = inprocess("dgx-h100", "--nvlink-per-link")
    h.fake.set_utilization(0, 70)
    h.advance(5)
    m = h.scrape()
    per_link = m.by_label("gpuscope_gpu_nvlink_link_transmit_bytes_total", "link", gpu="0")
    assert len(per_link) == 18
    assert sum(per_link.values()) == m.value("gpuscope_gpu_nvlink_transmit_bytes_total", gpu="0")
    assert len(m.series("gpuscope_gpu_nvlink_link_receive_bytes_total")) == 8 * 18


def test_pcie_only_gpus_omit_what_they_do_not_support(inprocess) -> None:
    h = inprocess("pcie-l40s")
    h.fake.set_utilization(0, 60)
    h.advance(5)
    m = h.scrape()
    assert len(m.series("gpuscope_gpu_up")) == 4
    for absent in (
        "gpuscope_gpu_nvlink_links",
        "gpuscope_gpu_nvlink_link_up",
        "gpuscope_gpu_nvlink_errors_total",
        "gpuscope_gpu_nvlink_transmit_bytes_total",
        "gpuscope_gpu_nvlink_receive_bytes_total",
        "gpuscope_gpu_remapped_rows_total",
        "gpuscope_gpu_row_remap_pending",
        "gpuscope_gpu_row_remap_failure",
        "gpuscope_mig_info",
    ):
        assert not m.series(absent), f"{absent} exported on a device that does not support it"
    assert m.by_label("gpuscope_gpu_temperature_celsius", "sensor", gpu="0").keys() == {"gpu"}
    assert m.series("gpuscope_gpu_info", gpu="0", mig_mode="")
    # No hardware PCIe byte counters: the sampler integrates the throughput samples instead.
    assert m.value("gpuscope_gpu_pcie_transmit_bytes_total", gpu="0") > 0
    assert m.value("gpuscope_gpu_ecc_errors_total", gpu="0", type="corrected") == 0


def test_mig_devices_are_enumerated(inprocess) -> None:
    h = inprocess("hgx-a100-mig")
    m = h.scrape()
    modes = m.by_label("gpuscope_gpu_info", "mig_mode")
    assert set(modes) == {"enabled", "disabled"}
    enabled = {dict(k)["gpu"] for k in m.series("gpuscope_gpu_info", mig_mode="enabled")}
    assert enabled == {"6", "7"}

    migs = m.series("gpuscope_mig_info")
    by_gpu: dict[str, list[str]] = {}
    for labels in migs:
        d = dict(labels)
        by_gpu.setdefault(d["gpu"], []).append(d["profile"])
        assert d["mig_uuid"].startswith("MIG-")
        assert m.get("gpuscope_mig_memory_total_bytes", mig_uuid=d["mig_uuid"]) is not None
    assert set(by_gpu) == {"6", "7"}
    assert all(p.count("g.") == 1 for ps in by_gpu.values() for p in ps)
    # NVML reports no utilization on a MIG-enabled GPU: omitted, not zero.
    assert m.get("gpuscope_gpu_utilization_ratio", gpu="6") is None
    assert m.get("gpuscope_gpu_busy_seconds_total", gpu="6") is None
    assert m.get("gpuscope_gpu_utilization_ratio", gpu="0") is not None


def test_mixed_node_reports_both_models(inprocess) -> None:
    h = inprocess("mixed")
    models = {dict(k)["model"] for k in h.scrape().series("gpuscope_gpu_info")}
    assert len(models) == 2


@pytest.mark.parametrize("detail", ["default", "full"])
def test_throttle_reasons_and_degraded_pcie_link(inprocess, detail: str) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", detail)
    h.fake.set_utilization(4, 100)
    h.fake.set_throttle_reasons(4, 0x40 | 0x04)  # hw thermal + sw power cap
    h.fake.set_throttle_reasons(5, 0x01)  # idle: clocks low because there is no work
    h.fake.set_pcie_link(4, generation=3, width=8)
    h.advance(1)
    m = h.scrape()
    reasons = m.by_label("gpuscope_gpu_throttle_reasons", "reason", gpu="4")
    assert {r for r, v in reasons.items() if v == 1} == {"hw_thermal", "sw_power_cap"}
    idle = m.by_label("gpuscope_gpu_throttle_reasons", "reason", gpu="5")
    if detail == "full":  # every reason, 0 or 1
        assert len(reasons) == 9 and idle["idle"] == 1
    else:  # only the reasons that hold the clocks down; idle is no slowdown
        assert len(reasons) == 2 and idle == {}
    assert m.value("gpuscope_gpu_pcie_link_generation", gpu="4", state="current") == 3
    assert m.value("gpuscope_gpu_pcie_link_width", gpu="4", state="current") == 8


def test_memory_errors_and_row_remapping(inprocess) -> None:
    h = inprocess("dgx-h100")
    h.fake.add_ecc_errors(3, corrected=5, uncorrected=1)
    h.fake.set_remapped_rows(3, correctable=2, uncorrectable=1, pending=True, failure=False)
    m = h.scrape()
    assert m.by_label("gpuscope_gpu_ecc_errors_total", "type", gpu="3") == {
        "corrected": 5,
        "uncorrected": 1,
    }
    assert m.by_label("gpuscope_gpu_remapped_rows_total", "type", gpu="3") == {
        "correctable": 2,
        "uncorrectable": 1,
    }
    assert m.value("gpuscope_gpu_row_remap_pending", gpu="3") == 1
    assert m.value("gpuscope_gpu_row_remap_failure", gpu="3") == 0

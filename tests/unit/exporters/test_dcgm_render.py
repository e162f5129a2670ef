"""--dcgm-compat: dcgm-exporter's counters rendered from fixed GPU records and holders, and
the exporter serving them only when the option is on, without failing a scrape."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from gpuscope.agent.accelerators.records import DeviceIdentity
from gpuscope.agent.app.config import ConfigError, parse
from gpuscope.agent.app.exposition import catalog, compat_of, exposition_of
from gpuscope.agent.attribution.records import Attribution, GpuHolding
from gpuscope.agent.gpu.records import (
    GpmActivity,
    GpuReading,
    GpuSnapshot,
    MigInstance,
    NvidiaReading,
    NvidiaSnapshot,
)
from gpuscope.agent.k8s.workloads import Workload
from gpuscope.agent.runtime.sources import Collection, SourceResult
from gpuscope.exporters.prometheus.catalog_dcgm import DEVICE_LABELS, FIELDS, HOLDER_LABELS
from gpuscope.exporters.prometheus.detail import MetricSelection
from gpuscope.exporters.prometheus.exporter import PrometheusExporter
from gpuscope.exporters.prometheus.families import Families
from gpuscope.exporters.scrape import Scrape
from tests.support import dcgm

NODE = "gpu-node-7"
MODEL = "NVIDIA H100 80GB HBM3"
U0, U1, U2 = "GPU-00000000-0000-4000-8000-000000000000", "GPU-1", "GPU-2"
JOB = Workload("Deployment", "nb")


def identity(index: int, uuid: str) -> DeviceIdentity:
    return DeviceIdentity(
        index, uuid, MODEL, f"00000000:{index:02X}:00.0", "s", "hopper", 0, "nvidia"
    )


def reading(index: int, uuid: str, **extension: Any) -> GpuReading:
    return GpuReading(
        identity=identity(index, uuid),
        up=True,
        extension=NvidiaReading(**extension),
        utilization_ratio=0.25,
        memory_utilization_ratio=0.5,
        memory_used_bytes=3 * 2**20,
        memory_total_bytes=10 * 2**20,
        memory_reserved_bytes=2**20,
        power_watts=300.5,
        energy_joules=12.5,
        temperatures_celsius={"gpu": 41.0, "memory": 50.0},
        clocks_hertz={"sm": 1_980_000_000.0, "memory": 2_619_000_000.0, "graphics": 1.0},
        pcie_replay_errors=3,
    )


FULL = dict(
    remapped_rows={"correctable": 2, "uncorrectable": 1},
    row_remap_failure=True,
    xid_errors={13: 1, 48: 2},
    gpm=GpmActivity(0.1, 0.2, 0.3, 0.4, 0.5, {"fp64": 0.01, "fp32": 0.02, "fp16": 0.03}),
    pcie_transmit_bytes_per_second=2048.0,
    pcie_receive_bytes_per_second=1024.0,
    nvlink_bytes_per_second=5e9,
)


def snapshot(
    *gpus: GpuReading, watched: frozenset[str] | None = frozenset({U0, U1})
) -> GpuSnapshot:
    return GpuSnapshot(
        vendor="nvidia",
        driver_version="550.54.15",
        library_version="12.550",
        gpus=gpus,
        extension=NvidiaSnapshot(xid_watched=watched),
    )


def holding(uuid: str, pod: str, mig: str = "") -> GpuHolding:
    return GpuHolding(0, uuid, "team", pod, "main", JOB, mig)


def render(snap: GpuSnapshot, att: Attribution | None = None, variant: str = "on",
           selection: MetricSelection | None = None) -> Families:  # fmt: skip
    compat = compat_of(variant, NODE)
    assert compat is not None
    out = Families(catalog(compat), selection or MetricSelection())
    compat.render(snap, att, out)
    return out


def series(out: Families, name: str) -> list[dict[str, str]]:
    spec = out.catalog.by_name[name]
    return [{**dict(zip(spec.labels, labels, strict=True)), "value": str(v)}
            for labels, v in out.samples(name)]  # fmt: skip


def value(out: Families, name: str, **match: str) -> float:
    (found,) = [s for s in series(out, name) if all(s[k] == v for k, v in match.items())]
    return float(found["value"])


def test_names_units_and_dcgm_labels() -> None:
    out = render(snapshot(reading(0, U0, **FULL)))
    assert value(out, "DCGM_FI_DEV_SM_CLOCK") == 1980.0
    assert value(out, "DCGM_FI_DEV_MEM_CLOCK") == 2619.0
    assert value(out, "DCGM_FI_DEV_GPU_TEMP") == 41.0
    assert value(out, "DCGM_FI_DEV_MEMORY_TEMP") == 50.0
    assert value(out, "DCGM_FI_DEV_POWER_USAGE") == 300.5
    assert value(out, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == 12500.0
    assert value(out, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER") == 3
    assert value(out, "DCGM_FI_DEV_GPU_UTIL") == 25.0
    assert value(out, "DCGM_FI_DEV_MEM_COPY_UTIL") == 50.0
    assert value(out, "DCGM_FI_DEV_FB_USED") == 3.0
    assert value(out, "DCGM_FI_DEV_FB_FREE") == 6.0  # total - reserved - used
    assert value(out, "DCGM_FI_DEV_FB_RESERVED") == 1.0
    assert value(out, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == 5000.0  # MB/s
    assert value(out, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == 1
    assert value(out, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS") == 2
    assert value(out, "DCGM_FI_DEV_ROW_REMAP_FAILURE") == 1
    assert value(out, "DCGM_FI_PROF_PCIE_TX_BYTES") == 2048.0
    assert value(out, "DCGM_FI_PROF_PCIE_RX_BYTES") == 1024.0
    assert value(out, "DCGM_FI_DEV_PCIE_TX_THROUGHPUT") == 2.0  # KiB/s
    assert value(out, "DCGM_FI_DEV_PCIE_RX_THROUGHPUT") == 1.0
    assert value(out, "DCGM_FI_PROF_SM_ACTIVE") == 0.1
    assert value(out, "DCGM_FI_PROF_SM_OCCUPANCY") == 0.2
    assert value(out, "DCGM_FI_PROF_GR_ENGINE_ACTIVE") == 0.3
    assert value(out, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") == 0.4
    assert value(out, "DCGM_FI_PROF_DRAM_ACTIVE") == 0.5
    assert value(out, "DCGM_FI_PROF_PIPE_FP64_ACTIVE") == 0.01
    assert value(out, "DCGM_FI_PROF_PIPE_FP16_ACTIVE") == 0.03
    assert value(out, "DCGM_FI_DEV_XID_ERRORS") == 48  # the highest XID counted
    assert set(out.names()) == {f.name for f in FIELDS}
    (s,) = series(out, "DCGM_FI_DEV_GPU_UTIL")
    assert s == {
        "gpu": "0", "UUID": U0, "device": "nvidia0", "modelName": MODEL, "Hostname": NODE,
        "hostname": NODE, "pci_bus_id": "00000000:00:00.0",
        "DCGM_FI_DRIVER_VERSION": "550.54.15", "namespace": "", "pod": "", "container": "",
        "value": "25.0",
    }  # fmt: skip


def test_the_catalog_is_dcgm_exporters_list() -> None:
    """Names, types and help texts are those of dcgm-exporter's list (the fixture), less the
    fields gpuscope has no source for; its label field is a label of every series."""
    listed = {c.name: c for c in dcgm.metric_counters()}
    ours = {f.name: f for f in FIELDS}
    assert set(listed) - set(ours) == set(dcgm.NO_GPUSCOPE_SOURCE)
    for name, counter in listed.items():
        if name in ours:
            assert (ours[name].kind, ours[name].help) == (counter.type, counter.help), name
    assert "DCGM_FI_DRIVER_VERSION" in DEVICE_LABELS


def test_time_sliced_gpu_has_one_series_per_holder_and_a_free_gpu_none() -> None:
    att = Attribution(holdings=(holding(U0, "a"), holding(U0, "b"), holding(U0, "b")))
    out = render(snapshot(reading(0, U0, **FULL), reading(1, U1)), att)
    used = series(out, "DCGM_FI_DEV_FB_USED")
    assert sorted((s["UUID"], s["pod"]) for s in used) == [(U0, "a"), (U0, "b"), (U1, "")]
    assert {s["value"] for s in used} == {"3.0"}  # each holder: the whole GPU's value
    assert all(s["namespace"] == "team" and s["container"] == "main" for s in used if s["pod"])


def test_exported_labels_variant_names_the_holders_exported() -> None:
    att = Attribution(holdings=(holding(U0, "a"),))
    out = render(snapshot(reading(0, U0)), att, "exported-labels")
    (s,) = series(out, "DCGM_FI_DEV_GPU_UTIL")
    assert (s["exported_namespace"], s["exported_pod"], s["exported_container"]) == (
        "team", "a", "main",
    )  # fmt: skip
    assert "namespace" not in s and "pod" not in s
    spec = out.catalog.by_name["DCGM_FI_DEV_GPU_UTIL"]
    assert spec.labels == (*DEVICE_LABELS, *HOLDER_LABELS["exported-labels"])


def test_mig_gpu_instances_have_their_own_series_without_holders() -> None:
    gpm = GpmActivity(sm_active=0.6, graphics_engine_active=0.7)
    migs = (
        MigInstance("MIG-a", "3g.40gb", 2, 0, 5 * 2**20, 40 * 2**20, gpm),
        MigInstance("MIG-b", "3g.40gb", 2, 1, 5 * 2**20, 40 * 2**20, gpm),  # same GPU instance
        MigInstance("MIG-c", "1g.10gb", 9, 0, 2**20, 10 * 2**20, None),
    )
    att = Attribution(holdings=(holding(U0, "a", "MIG-a"),))
    out = render(snapshot(reading(0, U0, mig_instances=migs, mig_mode="enabled")), att)
    used = {(s["GPU_I_ID"], s["GPU_I_PROFILE"], s["pod"]): s["value"]
            for s in series(out, "DCGM_FI_DEV_FB_USED")}  # fmt: skip
    assert used == {("", "", "a"): "3.0", ("2", "3g.40gb", ""): "5.0", ("9", "1g.10gb", ""): "1.0"}
    assert value(out, "DCGM_FI_DEV_FB_FREE", GPU_I_ID="2") == 35.0
    assert value(out, "DCGM_FI_PROF_SM_ACTIVE", GPU_I_ID="2") == 0.6
    assert not [s for s in series(out, "DCGM_FI_PROF_SM_ACTIVE") if s["GPU_I_ID"] == "9"]
    assert "GPU_I_ID" not in out.catalog.by_name["DCGM_FI_DEV_GPU_UTIL"].labels


def test_xid_errors_zero_only_where_watched() -> None:
    snap = snapshot(
        reading(0, U0, xid_errors={79: 1, 13: 4}),
        reading(1, U1),  # watched, none came: 0
        reading(2, U2),  # not watched: an absent XID proves nothing
    )
    out = render(snap)
    assert {s["gpu"]: s["value"] for s in series(out, "DCGM_FI_DEV_XID_ERRORS")} == {
        "0": "79.0", "1": "0.0",
    }  # fmt: skip
    unwatched = render(replace(snap, extension=NvidiaSnapshot(xid_watched=None)))
    assert {s["gpu"] for s in series(unwatched, "DCGM_FI_DEV_XID_ERRORS")} == {"0"}


def test_missing_sources_have_no_series() -> None:
    bare = GpuReading(identity=identity(0, U0), up=True, extension=NvidiaReading())
    out = render(snapshot(bare))
    assert out.names() == ["DCGM_FI_DEV_XID_ERRORS"]  # watched: 0; nothing else has a source


def test_gpus_without_uuid_are_left_out_and_down_ones_keep_xid_only() -> None:
    down = replace(reading(1, U1, xid_errors={79: 1}), up=False)
    out = render(snapshot(reading(0, "", **FULL), down))
    assert out.names() == ["DCGM_FI_DEV_XID_ERRORS"]
    assert series(out, "DCGM_FI_DEV_XID_ERRORS")[0]["UUID"] == U1


def test_full_detail_only_fields_follow_the_detail_level() -> None:
    """SM occupancy and the FP pipes were served at full detail only; they still are."""
    default = render(snapshot(reading(0, U0, **FULL)), selection=MetricSelection(full=False))
    assert "DCGM_FI_PROF_SM_OCCUPANCY" not in default.names()
    assert "DCGM_FI_PROF_PIPE_FP64_ACTIVE" not in default.names()
    assert "DCGM_FI_PROF_SM_ACTIVE" in default.names()


def test_flag_values() -> None:
    assert parse([], env={}).agent.dcgm_compat == "off"
    assert parse([], env={"GPUSCOPE_DCGM_COMPAT": "exported-labels"}).agent.dcgm_compat == (
        "exported-labels"
    )
    with pytest.raises(ConfigError, match="--dcgm-compat"):
        parse(["--dcgm-compat", "yes"], env={})


def _exporter(config_flags: list[str], snap: GpuSnapshot) -> PrometheusExporter:
    config = parse(["--collectors", "gpu", "--node-name", NODE, *config_flags], env={})

    def scrape() -> Scrape:
        return Scrape(Collection({"gpu": SourceResult("gpu", snap, True, 0.01)}, 0.0), None)

    return PrometheusExporter(scrape, exposition_of(config))


def test_the_exporter_serves_them_only_when_on() -> None:
    snap = snapshot(reading(0, U0, **FULL))
    off = _exporter([], snap).render_text().decode()
    on = _exporter(["--dcgm-compat", "on"], snap).render_text().decode()
    assert "\nDCGM_FI_" not in off and "# TYPE DCGM_FI_" not in off
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in on  # no _total, as dcgm
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in on
    assert on.startswith(off.split("# HELP gpuscope_collector_success")[0])


def test_openmetrics_keeps_the_names_of_counters_without_total() -> None:
    from prometheus_client.openmetrics.exposition import generate_latest

    exporter = _exporter(["--dcgm-compat", "on"], snapshot(reading(0, U0, **FULL)))

    class Registry:
        def collect(self) -> Any:
            return exporter.families().metrics()

    text = generate_latest(Registry()).decode()  # type: ignore[arg-type]
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\n" in text


def test_a_failing_renderer_leaves_the_scrape_intact(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = _exporter(["--dcgm-compat", "on"], snapshot(reading(0, U0, **FULL)))
    compat = exporter._exposition.compat
    assert compat is not None

    def broken(*_: Any) -> None:
        raise RuntimeError("boom")

    failing = replace(exporter._exposition, compat=replace(compat, render=broken))
    monkeypatch.setattr(exporter, "_exposition", failing)
    with caplog.at_level(logging.ERROR):
        text = exporter.render_text().decode()
    assert "\nDCGM_FI_" not in text
    assert 'gpuscope_collector_success{collector="gpu"} 1.0' in text
    assert "gpuscope_gpu_utilization_ratio{" in text
    assert "rendering collector dcgm-compat failed" in caplog.text

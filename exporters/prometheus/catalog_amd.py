"""The `amd` collector's metrics: the GPU families whose meaning is the same on both
vendors, under NVIDIA's names (declared once, in catalog_gpu.py), and AMD's own.

Where AMD has no counterpart (XIDs, GPM, MIG, NVLink, row remapping) the series is absent
on AMD GPUs, never 0. XGMI, AMD's GPU-to-GPU link, has its own families beside NVLink's,
with the same shape, so a dashboard can put `gpuscope_gpu_(nvlink|xgmi)_..._total` side by
side.
"""

from __future__ import annotations

from gpuscope.exporters.prometheus.catalog_gpu import GPU_METRICS
from gpuscope.exporters.prometheus.spec import GPU, MetricSpec

# The families both vendors render (the contract's fields): one declaration each.
SHARED_NAMES = frozenset(
    f"gpuscope_gpu_{suffix}"
    for suffix in (
        "info",
        "up",
        "stuck_seconds",
        "stuck_call_info",
        "utilization_ratio",
        "memory_utilization_ratio",
        "busy_seconds_total",
        "unsampled_seconds_total",
        "last_active_timestamp_seconds",
        "memory_used_bytes",
        "memory_total_bytes",
        "power_watts",
        "power_limit_watts",
        "energy_joules_total",
        "temperature_celsius",
        "clock_hertz",
        "clock_max_hertz",
        "throttle_reasons",
        "pcie_replay_errors_total",
        "pcie_link_generation",
        "pcie_link_width",
        "ecc_errors_total",
        "processes_refused",
    )
)
SHARED: tuple[MetricSpec, ...] = tuple(m for m in GPU_METRICS if m.name in SHARED_NAMES)

_MI300 = "AMD MI300 and later (gpu_metrics with accumulators); absent on MI200 and older."

AMD_ONLY: tuple[MetricSpec, ...] = (
    MetricSpec(
        "gpuscope_gpu_package_info",
        "gauge",
        "Always 1; the OAM package an AMD GPU is on (AMD SMI's oam_id). An MI250X's two GCDs "
        "are two GPUs on one package: count by (package) (gpuscope_gpu_package_info) is 2.",
        (*GPU, "package"),
        "amd",
        "AMD GPUs whose library reports the package.",
    ),
    MetricSpec(
        "gpuscope_gpu_partition_info",
        "gauge",
        "Always 1; an AMD GPU's compute and memory partition modes (SPX, DPX, QPX, CPX; "
        "NPS1, NPS4) and one series per partition (XCP) of a partitioned GPU, with the "
        "names AMD's device plugin gives it (`plugin_id`: its PCI address or "
        "amdgpu_xcp_<N>). How busy seconds are measured: `activity` accumulator or sampled.",
        (
            *GPU,
            "partition_uuid",
            "plugin_id",
            "compute_partition",
            "memory_partition",
            "activity",
        ),
        "amd",
        "Every AMD GPU that answered; partition_uuid and plugin_id empty on an unpartitioned one.",
    ),
    MetricSpec(
        "gpuscope_partition_busy_seconds_total",
        "counter",
        "Busy time of one compute partition (XCP) of an AMD GPU, from the firmware's "
        "per-XCP busy accumulators: rate() of it is the partition's mean activity.",
        (*GPU, "partition_uuid"),
        "amd",
        f"Partitioned GPUs. {_MI300} Starts at 0 when the agent starts.",
    ),
    MetricSpec(
        "gpuscope_gpu_events_total",
        "counter",
        "AMD SMI event notifications by type since the agent started, none lost: vm_fault, "
        "thermal_throttle, gpu_pre_reset, gpu_post_reset (AMD's counterpart of XIDs).",
        (*GPU, "event"),
        "amd",
        "Per type once it has happened on the GPU.",
    ),
    MetricSpec(
        "gpuscope_gpu_events_watched",
        "gauge",
        "1 if AMD SMI delivers this GPU's event notifications, so gpuscope_gpu_events_total "
        "can count them; 0 if the library refused (absent events then mean nothing).",
        GPU,
        "amd",
        "Where events are available at all: the GPUs it refused (0); every GPU at full detail.",
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_gpu_retired_pages",
        "gauge",
        "Device memory pages taken out of service after ECC errors, by status: retired, "
        "pending (retired at the next reset), unreservable. AMD's counterpart of NVIDIA's "
        "row remapping; a pending page means the GPU wants a reset.",
        (*GPU, "status"),
        "amd",
        "AMD GPUs whose library reports bad pages (not VM guests).",
    ),
    MetricSpec(
        "gpuscope_gpu_throttle_seconds_total",
        "counter",
        "Time the GPU spent throttled, by reason (prochot, power, socket_thermal, "
        "vr_thermal, hbm_thermal), from the firmware's residency accumulators: rate() of it "
        "is the share of time throttled, as AMD's violation status computes it.",
        (*GPU, "reason"),
        "amd",
        f"{_MI300} Starts at 0 when the agent starts.",
    ),
    MetricSpec(
        "gpuscope_gpu_pcie_recoveries_total",
        "counter",
        "PCIe link recoveries (L0 to recovery transitions): a link that retrains, "
        "usually with replays.",
        GPU,
        "amd",
        "AMD GPUs that report it.",
    ),
    MetricSpec(
        "gpuscope_gpu_xgmi_transmit_bytes_total",
        "counter",
        "Bytes sent over the GPU's XGMI links, summed over the links.",
        GPU,
        "amd",
        "AMD GPUs with XGMI (MI200 and later in an XGMI hive).",
    ),
    MetricSpec(
        "gpuscope_gpu_xgmi_receive_bytes_total",
        "counter",
        "Bytes received over the GPU's XGMI links, summed over the links.",
        GPU,
        "amd",
        "AMD GPUs with XGMI.",
    ),
    MetricSpec(
        "gpuscope_gpu_xgmi_links",
        "gauge",
        "XGMI links by state (up, down); disabled link slots are not links and not counted.",
        (*GPU, "state"),
        "amd",
        "AMD GPUs with XGMI.",
    ),
    MetricSpec(
        "gpuscope_gpu_xgmi_link_up",
        "gauge",
        "1 if the XGMI link is up.",
        (*GPU, "link"),
        "amd",
        "The links that are down at the default level; every link at full detail.",
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_gpu_xgmi_link_transmit_bytes_total",
        "counter",
        "Bytes sent over one XGMI link.",
        (*GPU, "link"),
        "amd",
        "Full detail only (7 series per MI300X).",
        at_default="none",
    ),
    MetricSpec(
        "gpuscope_gpu_xgmi_link_receive_bytes_total",
        "counter",
        "Bytes received over one XGMI link.",
        (*GPU, "link"),
        "amd",
        "Full detail only (7 series per MI300X).",
        at_default="none",
    ),
)

AMD_METRICS: tuple[MetricSpec, ...] = (*SHARED, *AMD_ONLY)

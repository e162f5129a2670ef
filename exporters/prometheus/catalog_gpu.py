"""Metrics of the `gpu` collector (NVML)."""

from __future__ import annotations

from gpuscope.agent.accelerators.gate import PROBE_FIRST, PROBE_MAX
from gpuscope.agent.gpu.xid import FATAL_XIDS
from gpuscope.exporters.prometheus.spec import GPU, Kind, MetricSpec

_FATAL = ", ".join(str(x) for x in sorted(FATAL_XIDS))

# The agent's build, and the accelerator library and driver of the first accelerator
# collector that reads its devices. The library's label is named for NVIDIA's (a public
# name since the first release), so the agent's catalog takes the declaration from here.
BUILD_INFO = MetricSpec(
    "gpuscope_build_info",
    "gauge",
    "Always 1; labels identify the agent build and the NVIDIA driver it talks to.",
    ("version", "python_version", "nvml_version", "driver_version"),
    "agent",
    "Always. Driver labels are empty when NVML is unavailable.",
)

# NVML GPM (agent/gpu/gpm.py): one sample per GPU and per MIG GPU instance each sampler tick;
# the ratios are the window between the last two samples, the counters integrate ratio x
# window, so rate() of them is the true average over any range, as for busy seconds.
_GPM_PRESENT = (
    "GPUs with NVML GPM: Hopper and later, driver R520+ (not Ampere, Ada, Turing or older: "
    "absent there, not 0)."
)
_MIG_GPM_PRESENT = "MIG devices of GPUs with NVML GPM (Hopper and later, driver R520+)."
_MIG_GPM_NOTE = (
    " One series per MIG device, labelled with its parent's gpu and uuid and its mig_uuid; "
    "GPM measures GPU instances, so MIG devices of one GPU instance (several compute "
    "instances) show the same values."
)
# (suffix, type, help, DCGM field)
_GPM_FAMILIES: tuple[tuple[str, Kind, str, str], ...] = (
    (
        "sm_active_ratio",
        "gauge",
        "Share of SMs that were busy (NVML GPM SM utilization) over the last GPM window "
        "(one sampler tick), 0-1. Unlike gpuscope_gpu_utilization_ratio (a kernel was "
        "running), one small kernel in a loop keeps this low.",
        "DCGM_FI_PROF_SM_ACTIVE",
    ),
    (
        "sm_occupancy_ratio",
        "gauge",
        "Resident warps as a share of the SMs' maximum over the last GPM window, 0-1.",
        "DCGM_FI_PROF_SM_OCCUPANCY",
    ),
    (
        "graphics_engine_active_ratio",
        "gauge",
        "Share of time the graphics/compute engine was active over the last GPM window, 0-1 "
        "(close to gpuscope_gpu_utilization_ratio, but from GPM).",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    ),
    (
        "tensor_active_ratio",
        "gauge",
        "Share of time any tensor pipe (HMMA, IMMA, DMMA) was active over the last GPM "
        "window, 0-1.",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ),
    (
        "dram_active_ratio",
        "gauge",
        "DRAM bandwidth used as a share of peak over the last GPM window, 0-1.",
        "DCGM_FI_PROF_DRAM_ACTIVE",
    ),
    (
        "pipe_active_ratio",
        "gauge",
        "Share of time a non-tensor pipe was active over the last GPM window, 0-1, by pipe: "
        "fp64, fp32, fp16, integer.",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE, _FP32_ACTIVE, _FP16_ACTIVE; integer has no DCGM "
        "profiling field",
    ),
    (
        "sm_active_seconds_total",
        "counter",
        "SM activity integrated over time (ratio x seconds of each GPM window): rate() of it "
        "is the true average SM activity over any window, whatever the scrape interval.",
        "DCGM_FI_PROF_SM_ACTIVE",
    ),
    (
        "tensor_active_seconds_total",
        "counter",
        "Tensor pipe activity integrated over time, as sm_active_seconds_total.",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ),
    (
        "dram_active_seconds_total",
        "counter",
        "DRAM bandwidth share integrated over time, as sm_active_seconds_total.",
        "DCGM_FI_PROF_DRAM_ACTIVE",
    ),
)


def _gpm_spec(
    prefix: str, labels: tuple[str, ...], family: tuple[str, Kind, str, str]
) -> MetricSpec:
    suffix, kind, help_text, dcgm = family
    pipe = ("pipe",) if suffix == "pipe_active_ratio" else ()
    mig = prefix == "gpuscope_mig_"
    counter_note = " Starts at 0 when the agent starts." if kind == "counter" else ""
    detail = suffix in _GPM_DETAIL
    return MetricSpec(
        f"{prefix}{suffix}",
        kind,
        f"{help_text} DCGM: {dcgm}.{_MIG_GPM_NOTE if mig else ''}",
        (*labels, *pipe),
        "gpu",
        f"{_MIG_GPM_PRESENT if mig else _GPM_PRESENT}{counter_note}"
        + (f" {_GPM_DETAIL[suffix]}" if detail else ""),
        at_default="none" if detail else "all",
    )


# Served at full detail only: the last window's SM, tensor and DRAM ratios have seconds
# counters whose rate() is the same figure over any range; occupancy and the pipes are not
# in dcgm-exporter's default counters either.
_SAME_AS_RATE = "Full detail only: rate() of the seconds counter is the default level's figure."
_GPM_DETAIL = {
    "sm_active_ratio": _SAME_AS_RATE.replace("the seconds counter", "sm_active_seconds_total"),
    "sm_occupancy_ratio": "Full detail only.",
    "tensor_active_ratio": _SAME_AS_RATE.replace(
        "the seconds counter", "tensor_active_seconds_total"
    ),
    "dram_active_ratio": _SAME_AS_RATE.replace("the seconds counter", "dram_active_seconds_total"),
    "pipe_active_ratio": "Full detail only.",
}


_GPM_METRICS = tuple(_gpm_spec("gpuscope_gpu_", GPU, f) for f in _GPM_FAMILIES)
_MIG_GPM_METRICS = (
    *(_gpm_spec("gpuscope_mig_", ("gpu", "uuid", "mig_uuid"), f) for f in _GPM_FAMILIES),
    MetricSpec(
        "gpuscope_mig_busy_seconds_total",
        "counter",
        "Seconds the MIG device's GPU instance was busy: GPM's graphics-engine activity "
        "integrated by the sampler (ratio x window), what gpuscope_gpu_busy_seconds_total is "
        "for a whole GPU (NVML has no utilization samples on MIG). Starts at 0 when the agent "
        "starts.",
        ("gpu", "uuid", "mig_uuid"),
        "gpu",
        _MIG_GPM_PRESENT,
    ),
)

GPU_METRICS: tuple[MetricSpec, ...] = (
    # --- GPU identity and health ------------------------------------------------------------
    MetricSpec(
        "gpuscope_gpu_info",
        "gauge",
        "Always 1; labels describe the GPU. Join on uuid for vendor, model, bus id, NUMA node, "
        "driver.",
        (
            "gpu",
            "uuid",
            "model",
            "pci_bus_id",
            "serial",
            "architecture",
            "compute_capability",
            "numa_node",
            "driver_version",
            "cuda_driver_version",
            "mig_mode",
            "vendor",
        ),
        "gpu",
        "Every GPU, up or not. `vendor` is nvidia or amd. `mig_mode` is empty where MIG is not "
        "supported, and on AMD GPUs; there `compute_capability` is the gfx target (gfx942), "
        "what ROCm builds code for, and `cuda_driver_version` is empty.",
    ),
    MetricSpec(
        "gpuscope_gpu_up",
        "gauge",
        "1 if the GPU answers its library (NVML, AMD SMI), 0 if it is lost (fell off the "
        "bus, XID 79) or needs a reset, is stuck in a call (gpuscope_gpu_stuck_seconds) or "
        "is fenced after a fatal XID (gpuscope_gpu_fenced). A GPU that is down keeps its "
        "info, up, XID (NVIDIA) or event (AMD) and the series below, and nothing else.",
        GPU,
        "gpu",
        "Every GPU.",
    ),
    MetricSpec(
        "gpuscope_gpu_stuck_seconds",
        "gauge",
        "How long the agent's outstanding library call to this GPU has been blocked, once "
        "it has run past --gpu-read-deadline (AMD: --amd-read-deadline); 0 while the GPU "
        "answers. A stuck GPU reads up 0 and gets no new call until the blocked one returns "
        "(one thread per GPU, never more); the other GPUs are read as ever.",
        GPU,
        "gpu",
        "While the GPU is stuck; every GPU (0 when it answers) at full detail.",
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_gpu_stuck_call_info",
        "gauge",
        "Always 1; names the library function (NVML, AMD SMI) the stuck GPU's call is blocked in.",
        (*GPU, "function"),
        "gpu",
        "While the GPU is stuck inside a library call.",
    ),
    MetricSpec(
        "gpuscope_gpu_fenced",
        "gauge",
        f"1 after a fatal XID ({_FATAL}: fallen off the bus, GSP RPC timeout, GSP error): "
        "the agent stops calling the GPU, as DCGM does, but for one cheap probe "
        f"(nvmlDeviceGetTemperature) {PROBE_FIRST:g} s later, then doubling up to every "
        f"{PROBE_MAX:g} s; a probe answered within --gpu-read-deadline (after a GPU reset, "
        "say) lifts the fence. 0 otherwise. Other XIDs DCGM rates fatal (48, 74, 94, 95, "
        "140) are only counted: the driver still answers after them, with the ECC and row "
        "remapping state an operator needs.",
        GPU,
        "gpu",
        "While the GPU is fenced; every GPU (0 otherwise) at full detail.",
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_gpu_fatal_xid_info",
        "gauge",
        "Always 1; the fatal XID after which the GPU is fenced.",
        (*GPU, "xid"),
        "gpu",
        "While the GPU is fenced.",
    ),
    MetricSpec(
        "gpuscope_gpu_utilization_ratio",
        "gauge",
        "Share of the last sample period in which a kernel ran on the GPU (0-1): NVML's "
        "utilization; AMD SMI's gfx activity.",
        GPU,
        "gpu",
        "Not on MIG-enabled GPUs (NVML does not report it there).",
    ),
    MetricSpec(
        "gpuscope_gpu_memory_utilization_ratio",
        "gauge",
        "Share of the last sample period in which device memory was read or written (0-1): "
        "NVML's memory utilization; AMD SMI's UMC (memory controller) activity.",
        GPU,
        "gpu",
        "Not on MIG-enabled GPUs.",
    ),
    MetricSpec(
        "gpuscope_gpu_busy_seconds_total",
        "counter",
        "Integral of GPU utilization over time: rate() of it is the true average utilization "
        "over any window, whatever the scrape interval. AMD MI300 and later: from the "
        "firmware's own activity accumulator (exact, not sampled).",
        GPU,
        "gpu",
        "Starts at 0 when the agent starts. Not on MIG-enabled GPUs.",
    ),
    MetricSpec(
        "gpuscope_gpu_unsampled_seconds_total",
        "counter",
        "Time since the agent started that no utilization sample covered (a stalled sampler, "
        "gaps in NVML's sample ring): neither busy nor idle. Each NVML sample covers at most "
        "one sample period, so a stall never becomes busy time; rate() of busy seconds over "
        "1 - rate() of this is the utilization over the time that was sampled.",
        GPU,
        "gpu",
        "Not on MIG-enabled GPUs. Once any time went unsampled; from 0 at the agent's start "
        "at full detail.",
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_gpu_last_active_timestamp_seconds",
        "gauge",
        "Unix time of the last utilization sample above --idle-threshold.",
        GPU,
        "gpu",
        "Full detail only (gpuscope_gpu_allocated_idle_seconds is the same fact for the "
        "GPUs that matter), after the GPU's first activity seen by this agent.",
        at_default="none",
    ),
    # --- GPM: profiling-grade activity (Hopper and later) ------------------------------------
    *_GPM_METRICS,
    # --- memory -----------------------------------------------------------------------------
    MetricSpec(
        "gpuscope_gpu_memory_used_bytes",
        "gauge",
        "Device memory allocated by processes and the driver.",
        GPU,
        "gpu",
    ),
    MetricSpec("gpuscope_gpu_memory_total_bytes", "gauge", "Device memory size.", GPU, "gpu"),
    MetricSpec(
        "gpuscope_gpu_memory_reserved_bytes",
        "gauge",
        "Device memory reserved by the driver and firmware (not usable by processes).",
        GPU,
        "gpu",
        "Drivers with nvmlDeviceGetMemoryInfo_v2.",
    ),
    # --- power and thermals -----------------------------------------------------------------
    MetricSpec("gpuscope_gpu_power_watts", "gauge", "Current board power draw.", GPU, "gpu"),
    MetricSpec(
        "gpuscope_gpu_power_limit_watts",
        "gauge",
        "Power limit the driver enforces now.",
        GPU,
        "gpu",
    ),
    MetricSpec(
        "gpuscope_gpu_energy_joules_total",
        "counter",
        "Energy used since the driver was loaded (hardware counter), or since the agent started "
        "where the GPU has none (integrated from power samples).",
        GPU,
        "gpu",
    ),
    MetricSpec(
        "gpuscope_gpu_temperature_celsius",
        "gauge",
        "Temperature by sensor (gpu = core: NVIDIA's die sensor, AMD's junction; memory = "
        "HBM; AMD also edge and hbm0-hbm3 where the part has them).",
        (*GPU, "sensor"),
        "gpu",
        'sensor="memory" only where the GPU reports it (HBM parts). AMD: gpu, memory and '
        "edge at the default level, the per-stack hbm0-hbm3 at full detail.",
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_gpu_clock_hertz",
        "gauge",
        "Current clock frequency by clock domain (graphics, sm, memory; AMD: sm is the gfx "
        "clock of the compute units, plus soc, fabric, video, decode).",
        (*GPU, "clock"),
        "gpu",
        'clock="sm" and "memory" (DCGM\'s default clocks); graphics too at full detail.',
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_gpu_clock_max_hertz",
        "gauge",
        "Maximum clock frequency by clock domain.",
        (*GPU, "clock"),
        "gpu",
        "Full detail only.",
        at_default="none",
    ),
    MetricSpec(
        "gpuscope_gpu_throttle_reasons",
        "gauge",
        "1 if the reason currently holds clocks down (NVIDIA: "
        "nvmlDeviceGetCurrentClocksEventReasons; AMD: throttled at any firmware sample of the "
        "last tick, from the residency accumulators: prochot, power, socket_thermal, "
        "vr_thermal, hbm_thermal).",
        (*GPU, "reason"),
        "gpu",
        "The reasons that hold the clocks down now (1), idle excepted; at full detail every "
        "known reason, 0 or 1: idle, applications_clocks, sw_power_cap, hw_slowdown, "
        "sync_boost, sw_thermal, hw_thermal, hw_power_brake, display_clocks. Share of time "
        "throttled: sum_over_time() over count_over_time(gpuscope_gpu_up), at either level.",
        at_default="some",
    ),
    # --- PCIe -------------------------------------------------------------------------------
    MetricSpec(
        "gpuscope_gpu_pcie_transmit_bytes_total",
        "counter",
        "Bytes the GPU sent over PCIe: the hardware counter where present (driver R555+), "
        "else an estimate integrated from nvmlDeviceGetPcieThroughput, a 20 ms window read "
        "for one GPU per sampler tick, round-robin.",
        GPU,
        "gpu",
    ),
    MetricSpec(
        "gpuscope_gpu_pcie_receive_bytes_total",
        "counter",
        "Bytes the GPU received over PCIe (same sources as transmit).",
        GPU,
        "gpu",
    ),
    MetricSpec(
        "gpuscope_gpu_pcie_replay_errors_total",
        "counter",
        "PCIe replays (link-level retransmissions); a rising count means a marginal link.",
        GPU,
        "gpu",
    ),
    MetricSpec(
        "gpuscope_gpu_pcie_link_generation",
        "gauge",
        "PCIe generation, current and the maximum for this GPU in this system. GPUs lower the "
        "current generation when idle to save power.",
        (*GPU, "state"),
        "gpu",
    ),
    MetricSpec(
        "gpuscope_gpu_pcie_link_width",
        "gauge",
        "PCIe lanes, current and maximum.",
        (*GPU, "state"),
        "gpu",
    ),
    # --- NVLink -----------------------------------------------------------------------------
    MetricSpec(
        "gpuscope_gpu_nvlink_transmit_bytes_total",
        "counter",
        "Data bytes sent over all NVLinks of the GPU (payload, without protocol overhead).",
        GPU,
        "gpu",
        "GPUs with NVLink.",
    ),
    MetricSpec(
        "gpuscope_gpu_nvlink_receive_bytes_total",
        "counter",
        "Data bytes received over all NVLinks of the GPU.",
        GPU,
        "gpu",
        "GPUs with NVLink.",
    ),
    MetricSpec(
        "gpuscope_gpu_nvlink_links",
        "gauge",
        "The GPU's NVLinks by state (up: active, down: not). A PCIe card without a bridge "
        "reports every link down.",
        (*GPU, "state"),
        "gpu",
        "GPUs with NVLink.",
    ),
    MetricSpec(
        "gpuscope_gpu_nvlink_errors_total",
        "counter",
        "NVLink errors summed over the GPU's links, by type: crc_flit, crc_data, replay, "
        "recovery (up to Hopper); recovery (successful link recoveries) and recovery_failed "
        "(the link went down) on NVLink5 (Blackwell), where NVML has no CRC or replay "
        "counters. Per link: gpuscope_gpu_nvlink_link_errors_total.",
        (*GPU, "type"),
        "gpu",
        "GPUs with NVLink. crc_data from links 0-11 (NVML has no field for higher links).",
    ),
    MetricSpec(
        "gpuscope_gpu_nvlink_link_up",
        "gauge",
        "1 if the NVLink is active.",
        (*GPU, "link"),
        "gpu",
        "Links that are down or have errors; every link at full detail.",
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_gpu_nvlink_link_errors_total",
        "counter",
        "NVLink errors of one link, by type (as gpuscope_gpu_nvlink_errors_total).",
        (*GPU, "link", "type"),
        "gpu",
        "Links that are down or have errors (every type of such a link); every link at full "
        "detail. A link's series appear with its first error at the default level: alert on "
        "the per-GPU sums.",
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_gpu_nvlink_link_transmit_bytes_total",
        "counter",
        "Data bytes sent over one NVLink.",
        (*GPU, "link"),
        "gpu",
        "Full detail, or --nvlink-per-link (18 series per H100).",
        at_default="none",
    ),
    MetricSpec(
        "gpuscope_gpu_nvlink_link_receive_bytes_total",
        "counter",
        "Data bytes received over one NVLink.",
        (*GPU, "link"),
        "gpu",
        "Full detail, or --nvlink-per-link.",
        at_default="none",
    ),
    # --- errors -----------------------------------------------------------------------------
    MetricSpec(
        "gpuscope_gpu_xid_errors_total",
        "counter",
        "XID errors reported by the driver, counted one by one from NVML's event stream "
        "(none lost between scrapes).",
        (*GPU, "xid"),
        "gpu",
        "After the first XID of that number since the agent started.",
    ),
    MetricSpec(
        "gpuscope_gpu_xid_events_watched",
        "gauge",
        "1 if the driver accepted the agent's registration for this GPU's XID events, so "
        "gpuscope_gpu_xid_errors_total can count them; 0 if it refused (absent XIDs then "
        "prove nothing).",
        GPU,
        "gpu",
        "Where NVML events are available at all: the GPUs it refused (0); every GPU at full "
        "detail.",
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_gpu_processes_refused",
        "gauge",
        "1 when the library refused to list the GPU's processes: NVML in MIG mode lists "
        "them only to a caller with CAP_SYS_ADMIN, which the DaemonSet does not grant; AMD "
        "SMI answers NO_PERM where the agent may not read them "
        "(docs/deploy.md). Per-pod GPU memory and unallocated memory are then missing for "
        "this GPU, not zero.",
        GPU,
        "gpu",
        "Only while NVML refuses the list (through the parent and every MIG device handle).",
    ),
    MetricSpec(
        "gpuscope_gpu_ecc_errors_total",
        "counter",
        "Volatile ECC errors (since the last driver load) by type (corrected, uncorrected; "
        "AMD also deferred).",
        (*GPU, "type"),
        "gpu",
        "GPUs with ECC enabled.",
    ),
    MetricSpec(
        "gpuscope_gpu_remapped_rows_total",
        "counter",
        "Memory rows remapped after errors, by type (correctable, uncorrectable).",
        (*GPU, "type"),
        "gpu",
        "GPUs with row remapping (A100, H100 and later).",
    ),
    MetricSpec(
        "gpuscope_gpu_row_remap_pending",
        "gauge",
        "1 if a row remap is pending: the GPU needs a reset to apply it.",
        GPU,
        "gpu",
        "GPUs with row remapping.",
    ),
    MetricSpec(
        "gpuscope_gpu_row_remap_failure",
        "gauge",
        "1 if a row remap failed: the GPU should be serviced.",
        GPU,
        "gpu",
        "GPUs with row remapping.",
    ),
    MetricSpec(
        "gpuscope_gpu_recovery_action_info",
        "gauge",
        "Always 1; the recovery action the driver requires "
        "(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): `action` none, gpu_reset, node_reboot, "
        "drain_p2p or drain_and_reset, `code` NVML's number (action unknown: a code whose "
        "meaning differs between driver headers). XID 154 announces a change.",
        (*GPU, "action", "code"),
        "gpu",
        'Drivers R570 and later: one series per GPU, action="none" while none is needed.',
    ),
    # --- MIG --------------------------------------------------------------------------------
    MetricSpec(
        "gpuscope_mig_info",
        "gauge",
        "Always 1; one series per MIG device, linking it to its parent GPU.",
        ("gpu", "uuid", "mig_uuid", "profile", "gpu_instance", "compute_instance"),
        "gpu",
        "GPUs in MIG mode.",
    ),
    MetricSpec(
        "gpuscope_mig_memory_used_bytes",
        "gauge",
        "Memory used in the MIG device.",
        ("mig_uuid",),
        "gpu",
        "GPUs in MIG mode.",
    ),
    MetricSpec(
        "gpuscope_mig_memory_total_bytes",
        "gauge",
        "Memory size of the MIG device.",
        ("mig_uuid",),
        "gpu",
        "GPUs in MIG mode.",
    ),
    *_MIG_GPM_METRICS,
)

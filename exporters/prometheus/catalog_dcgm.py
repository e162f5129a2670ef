"""dcgm-exporter's counters as `--dcgm-compat` serves them: its names, types, help texts and
label names (docs/migrating-from-dcgm-exporter.md).

The fields are dcgm-exporter's default counter list (etc/default-counters.csv, the copy the
tests read: tests/rules/dcgm-exporter/default-counters.csv) less those gpuscope has no
source for (the video encoder and decoder, vGPU licensing), then fields of other lists:
the PCIe names of its default list before 3.3.7 and the profiling fields the current list
leaves commented out. Types and help texts are dcgm-exporter's own, so its counters keep
their names without `_total` (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION is a `counter`).

Every series carries dcgm-exporter's device labels and the holding container's, under the
names of the variant (`on`: namespace, pod, container; `exported-labels`: the names a
Prometheus scrape with honorLabels false stores them as); the fields DCGM has per MIG GPU
instance also GPU_I_ID and GPU_I_PROFILE. A label that does not apply is empty, as
dcgm-exporter writes it, and Prometheus stores no empty label.

Imported only when the option is on (agent/app/exposition.py): an agent without it never
loads this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gpuscope.exporters.prometheus.spec import AtDefault, Kind, MetricSpec

VARIANTS = ("on", "exported-labels")
DEVICE_LABELS = (
    "gpu",
    "UUID",
    "device",
    "modelName",
    "Hostname",
    "hostname",
    "pci_bus_id",
    "DCGM_FI_DRIVER_VERSION",
)
HOLDER_LABELS = {
    "on": ("namespace", "pod", "container"),
    "exported-labels": ("exported_namespace", "exported_pod", "exported_container"),
}
MIG_LABELS = ("GPU_I_ID", "GPU_I_PROFILE")
SOURCE = "gpu"  # the records they are rendered from (and the pod bound's counter)


@dataclass(frozen=True, slots=True)
class DcgmField:
    """One dcgm-exporter counter as --dcgm-compat serves it, and where its value comes from."""

    name: str
    kind: Kind
    help: str  # dcgm-exporter's, word for word
    note: str  # what gpuscope serves it from, for the docs
    per_gpu_instance: bool = False  # also one series per MIG GPU instance
    at_default: AtDefault = "all"


FIELDS: tuple[DcgmField, ...] = (
    # dcgm-exporter's default list, in its order.
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
              "gpuscope_gpu_clock_hertz{clock=\"sm\"} / 10^6"),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
              "gpuscope_gpu_clock_hertz{clock=\"memory\"} / 10^6"),
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).",
              "gpuscope_gpu_temperature_celsius{sensor=\"memory\"}"),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
              "gpuscope_gpu_temperature_celsius{sensor=\"gpu\"}"),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).",
              "gpuscope_gpu_power_watts"),
    DcgmField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
              "Total energy consumption since boot (in mJ).",
              "gpuscope_gpu_energy_joules_total x 1000"),
    DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
              "gpuscope_gpu_pcie_replay_errors_total"),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
              "gpuscope_gpu_utilization_ratio x 100"),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
              "gpuscope_gpu_memory_utilization_ratio x 100"),
    DcgmField("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
              "the highest XID number counted on the GPU, 0 before any where XIDs are watched"),
    DcgmField("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
              "(total - reserved - used) / 2^20", per_gpu_instance=True),
    DcgmField("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
              "gpuscope_gpu_memory_used_bytes / 2^20", per_gpu_instance=True),
    DcgmField("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
              "gpuscope_gpu_memory_reserved_bytes / 2^20"),
    DcgmField("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
              "Total number of NVLink bandwidth counters for all lanes.",
              "NVLink data bytes per second, both directions, all links, / 10^6 (MB/s)"),
    DcgmField("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
              "Number of remapped rows for uncorrectable errors",
              "gpuscope_gpu_remapped_rows_total{type=\"uncorrectable\"}"),
    DcgmField("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
              "Number of remapped rows for correctable errors",
              "gpuscope_gpu_remapped_rows_total{type=\"correctable\"}"),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
              "gpuscope_gpu_row_remap_failure"),
    DcgmField("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge",
              "Ratio of time the graphics engine is active.",
              "the last GPM window's graphics engine activity", per_gpu_instance=True),
    DcgmField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
              "Ratio of cycles the tensor (HMMA) pipe is active.",
              "the last GPM window's tensor activity", per_gpu_instance=True),
    DcgmField("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
              "Ratio of cycles the device memory interface is active sending or receiving data.",
              "the last GPM window's DRAM activity", per_gpu_instance=True),
    DcgmField("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
              "The rate of data transmitted over the PCIe bus - including both protocol headers "
              "and data payloads - in bytes per second.",
              "PCIe bytes per second transmitted, over the GPU source's last window"),
    DcgmField("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
              "The rate of data received over the PCIe bus - including both protocol headers "
              "and data payloads - in bytes per second.",
              "PCIe bytes per second received, over the GPU source's last window"),
    # Outside the default list: its PCIe names before dcgm-exporter 3.3.7 ...
    DcgmField("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "counter",
              "Total number of bytes transmitted through PCIe TX (in KB) via NVML.",
              "DCGM_FI_PROF_PCIE_TX_BYTES / 1024 (KiB/s)"),
    DcgmField("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "counter",
              "Total number of bytes received through PCIe RX (in KB) via NVML.",
              "DCGM_FI_PROF_PCIE_RX_BYTES / 1024 (KiB/s)"),
    # ... and the profiling fields its list leaves commented out.
    DcgmField("DCGM_FI_PROF_SM_ACTIVE", "gauge",
              "The ratio of cycles an SM has at least 1 warp assigned.",
              "the last GPM window's SM activity", per_gpu_instance=True),
    DcgmField("DCGM_FI_PROF_SM_OCCUPANCY", "gauge",
              "The ratio of number of warps resident on an SM.",
              "the last GPM window's SM occupancy", per_gpu_instance=True, at_default="none"),
    DcgmField("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge",
              "Ratio of cycles the fp64 pipes are active.",
              "the last GPM window's fp64 pipe activity", per_gpu_instance=True,
              at_default="none"),
    DcgmField("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge",
              "Ratio of cycles the fp32 pipes are active.",
              "the last GPM window's fp32 pipe activity", per_gpu_instance=True,
              at_default="none"),
    DcgmField("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge",
              "Ratio of cycles the fp16 pipes are active.",
              "the last GPM window's fp16 pipe activity", per_gpu_instance=True,
              at_default="none"),
)  # fmt: skip

BY_NAME = {f.name: f for f in FIELDS}


@cache
def dcgm_metrics(variant: str) -> tuple[MetricSpec, ...]:
    """The metric declarations of one variant, for the agent's catalog."""
    holders = HOLDER_LABELS[variant]
    return tuple(
        MetricSpec(
            f.name,
            f.kind,
            f.help,
            (*DEVICE_LABELS, *holders, *(MIG_LABELS if f.per_gpu_instance else ())),
            SOURCE,
            f"--dcgm-compat only; from {f.note}.",
            f.at_default,
        )
        for f in FIELDS
    )

"""GPU records -> Prometheus samples. Device series carry `gpu` and `uuid` only; everything
else about a GPU is on `gpuscope_gpu_info`, so device series stay stable while pods churn."""

from __future__ import annotations

from gpuscope.agent.gpu.records import GpuReading, GpuSnapshot
from gpuscope.exporters.prometheus.families import Families


def render_gpu(snapshot: GpuSnapshot, out: Families) -> None:
    for reading in snapshot.gpus:
        _render_one(snapshot, reading, out)


def _render_one(snapshot: GpuSnapshot, r: GpuReading, out: Families) -> None:
    ident = r.identity
    dev = (str(ident.index), ident.uuid)
    out.add(
        "gpuscope_gpu_info",
        (
            *dev,
            ident.model,
            ident.pci_bus_id,
            ident.serial,
            ident.architecture,
            ident.compute_capability,
            str(ident.numa_node) if ident.numa_node is not None else "",
            snapshot.driver_version,
            snapshot.cuda_driver_version,
            r.mig_mode or "",
        ),
        1,
    )
    out.add("gpuscope_gpu_up", dev, 1 if r.up else 0)
    for xid, count in sorted(r.xid_errors.items()):
        out.add("gpuscope_gpu_xid_errors_total", (*dev, str(xid)), count)
    if not r.up:
        return

    scalars: tuple[tuple[str, float | int | bool | None], ...] = (
        ("gpuscope_gpu_utilization_ratio", r.utilization_ratio),
        ("gpuscope_gpu_memory_utilization_ratio", r.memory_utilization_ratio),
        ("gpuscope_gpu_busy_seconds_total", r.busy_seconds),
        ("gpuscope_gpu_last_active_timestamp_seconds", r.last_active_timestamp),
        ("gpuscope_gpu_memory_used_bytes", r.memory_used_bytes),
        ("gpuscope_gpu_memory_total_bytes", r.memory_total_bytes),
        ("gpuscope_gpu_memory_reserved_bytes", r.memory_reserved_bytes),
        ("gpuscope_gpu_power_watts", r.power_watts),
        ("gpuscope_gpu_power_limit_watts", r.power_limit_watts),
        ("gpuscope_gpu_energy_joules_total", r.energy_joules),
        ("gpuscope_gpu_pcie_transmit_bytes_total", r.pcie_transmit_bytes),
        ("gpuscope_gpu_pcie_receive_bytes_total", r.pcie_receive_bytes),
        ("gpuscope_gpu_pcie_replay_errors_total", r.pcie_replay_errors),
        ("gpuscope_gpu_nvlink_transmit_bytes_total", r.nvlink_transmit_bytes),
        ("gpuscope_gpu_nvlink_receive_bytes_total", r.nvlink_receive_bytes),
        ("gpuscope_gpu_row_remap_pending", r.row_remap_pending),
        ("gpuscope_gpu_row_remap_failure", r.row_remap_failure),
    )
    for name, value in scalars:
        if value is not None:
            out.add(name, dev, float(value))

    labelled: tuple[tuple[str, dict[str, float] | dict[str, int] | dict[str, bool]], ...] = (
        ("gpuscope_gpu_temperature_celsius", dict(r.temperatures_celsius)),
        ("gpuscope_gpu_clock_hertz", dict(r.clocks_hertz)),
        ("gpuscope_gpu_clock_max_hertz", dict(r.clocks_max_hertz)),
        ("gpuscope_gpu_throttle_reasons", dict(r.throttle_reasons)),
        ("gpuscope_gpu_pcie_link_generation", dict(r.pcie_link_generation)),
        ("gpuscope_gpu_pcie_link_width", dict(r.pcie_link_width)),
        ("gpuscope_gpu_ecc_errors_total", dict(r.ecc_errors)),
        ("gpuscope_gpu_remapped_rows_total", dict(r.remapped_rows)),
    )
    for name, values in labelled:
        for label, value in values.items():
            out.add(name, (*dev, label), float(value))

    for link in r.nvlinks:
        link_id = str(link.link)
        if link.up is not None:
            out.add("gpuscope_gpu_nvlink_up", (*dev, link_id), 1 if link.up else 0)
        for kind, count in link.errors.items():
            out.add("gpuscope_gpu_nvlink_errors_total", (*dev, link_id, kind), count)
        if snapshot.nvlink_per_link:
            if link.transmit_bytes is not None:
                out.add(
                    "gpuscope_gpu_nvlink_link_transmit_bytes_total",
                    (*dev, link_id),
                    link.transmit_bytes,
                )
            if link.receive_bytes is not None:
                out.add(
                    "gpuscope_gpu_nvlink_link_receive_bytes_total",
                    (*dev, link_id),
                    link.receive_bytes,
                )

    for mig in r.mig_instances:
        out.add(
            "gpuscope_mig_info",
            (*dev, mig.mig_uuid, mig.profile, str(mig.gpu_instance), str(mig.compute_instance)),
            1,
        )
        if mig.memory_used_bytes is not None:
            out.add("gpuscope_mig_memory_used_bytes", (mig.mig_uuid,), mig.memory_used_bytes)
        if mig.memory_total_bytes is not None:
            out.add("gpuscope_mig_memory_total_bytes", (mig.mig_uuid,), mig.memory_total_bytes)

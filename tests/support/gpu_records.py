"""NVIDIA GPU records for tests that build collections by hand: the accelerator contract's
records with NVIDIA's extensions, as agent/gpu/source.py builds them."""

from __future__ import annotations

from collections.abc import Iterable

from gpuscope.agent.gpu.records import (
    VENDOR,
    GpuIdentity,
    GpuReading,
    GpuSnapshot,
    NvidiaSnapshot,
)


def identity(
    index: int,
    uuid: str,
    model: str = "NVIDIA H100 80GB HBM3",
    pci_bus_id: str = "0000:18:00.0",
    serial: str = "1",
    architecture: str = "hopper",
    numa_node: int | None = 0,
) -> GpuIdentity:
    return GpuIdentity(index, uuid, model, pci_bus_id, serial, architecture, numa_node, VENDOR)


def snapshot(
    gpus: Iterable[GpuReading],
    driver_version: str = "550",
    cuda_driver_version: str = "12.4",
    nvml_version: str = "12.550",
) -> GpuSnapshot:
    return GpuSnapshot(
        vendor=VENDOR,
        driver_version=driver_version,
        library_version=nvml_version,
        gpus=tuple(gpus),
        extension=NvidiaSnapshot(cuda_driver_version=cuda_driver_version),
    )

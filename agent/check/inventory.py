"""The machine's inventory for the report: GPUs, driver, bindings, fabric."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from gpuscope.agent.gpu import device as dev
from gpuscope.agent.gpu import topology

if TYPE_CHECKING:
    from gpuscope.agent.gpu.nvml import Nvml
    from gpuscope.agent.gpu.source import GpuSource


def imported_packages() -> list[str]:
    """Top-level modules outside the standard library this process imported: on the GPU
    machine only the agent, pynvml and prometheus_client exist."""
    top = {m.split(".")[0] for m in list(sys.modules)}
    return sorted(top - set(sys.stdlib_module_names) - {"__main__"})


def fabric(nvml: Nvml, device: dev.Device) -> dict[str, Any] | None:
    info = topology.fabric_info(nvml, device)
    if info is None:
        return None
    get = ctypes.Structure.__getattribute__
    names = [n for n, *_ in type(info)._fields_ if n != "_slack"]
    raw = {n: get(info, n) for n in names}
    raw["clusterUuid"] = bytes(raw["clusterUuid"]).hex()
    return {
        "struct": type(info).__name__,
        **{k: v if isinstance(v, str) else int(v) for k, v in raw.items()},
    }


def inventory(nvml: Nvml, source: GpuSource) -> dict[str, Any]:
    lib = nvml.lib
    gpus = []
    for device in source.devices:
        h = device.handle
        mig = nvml.query("nvmlDeviceGetMigMode", h)
        gpus.append(
            {
                **asdict(device.identity),
                "architecture_raw": nvml.query("nvmlDeviceGetArchitecture", h),
                "mig_mode": list(mig) if mig is not None else None,
                "nvlink_count": dev.nvlink_count(nvml, device),
                "fabric": fabric(nvml, device),
            }
        )
    cuda = nvml.query("nvmlSystemGetCudaDriverVersion")
    try:
        from importlib.metadata import version

        bindings = version("nvidia-ml-py")
    except Exception:  # noqa: BLE001 - only for the report
        bindings = getattr(lib, "__version__", "unknown")
    return {
        "nvidia_ml_py": bindings,
        "driver": source.driver_version,
        "nvml": source.nvml_version,
        "cuda_driver": source.cuda_driver_version,
        "cuda_driver_raw": cuda,
        "gpus": gpus,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "host": platform.node(),
        "uid": os.getuid(),
        "capsh": shutil.which("capsh"),
        "nvidia_smi": shutil.which("nvidia-smi"),
        "imported_packages": imported_packages(),
    }

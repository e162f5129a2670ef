"""Check `nvidia_smi`: identity, memory, driver, power and utilization against nvidia-smi."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuscope.agent.check.common import FAIL, MIB, Check, Metrics, label, num, value, verdict

if TYPE_CHECKING:
    from gpuscope.agent.check.load import Load
    from gpuscope.agent.check.phases import Phases


def smi_float(row: Mapping[str, str], key: str) -> float | None:
    try:
        return float(row[key])
    except (KeyError, ValueError):
        return None


def smi_problems(row: Mapping[str, str], m: Metrics) -> list[str]:
    """One GPU's identity, memory, driver and power against nvidia-smi's."""
    i, problems = row["index"], []
    name = label(m, "gpuscope_gpu_info", "model", gpu=i)
    if name != row["name"]:
        problems.append(f"GPU {i} name: agent {name!r}, nvidia-smi {row['name']!r}")
    total, smi_total = (
        value(m, "gpuscope_gpu_memory_total_bytes", gpu=i),
        smi_float(row, "memory.total"),
    )
    if total is None or smi_total is None or abs(total / MIB - smi_total) > 1:
        problems.append(
            f"GPU {i} memory total: agent {(total or 0) / MIB:.0f} MiB, "
            f"nvidia-smi {row['memory.total']} MiB"
        )
    drv = label(m, "gpuscope_gpu_info", "driver_version", gpu=i)
    if drv != row["driver_version"]:
        problems.append(f"GPU {i} driver: agent {drv}, nvidia-smi {row['driver_version']}")
    power, smi_power = value(m, "gpuscope_gpu_power_watts", gpu=i), smi_float(row, "power.draw")
    if power is None or smi_power is None or abs(power - smi_power) > 0.10 * smi_power:
        problems.append(
            f"GPU {i} power: agent {power} W, nvidia-smi {row['power.draw']} W "
            "(more than 10% apart)"
        )
    return problems


def check_nvidia_smi(phases: Phases, load: Load | None) -> Check:
    details = {"idle": phases.smi_idle, "load": phases.smi_load, "error": phases.smi_error}
    end = phases.marks.get("idle_end")
    if not phases.smi_idle or end is None:
        return Check("nvidia_smi", FAIL, phases.smi_error or "nvidia-smi listed no GPU", details)
    problems = [p for row in phases.smi_idle for p in smi_problems(row, end.metrics)]
    note = "utilization under load not compared: no load"
    loaded = phases.marks.get("duty_end")
    if load is not None and loaded is not None and phases.smi_load:
        util = value(loaded.metrics, "gpuscope_gpu_utilization_ratio", gpu="0")
        smi_util = smi_float(phases.smi_load[0], "utilization.gpu")
        note = f"GPU 0 under load: agent {num(util and util * 100, '%')}, nvidia-smi {smi_util}%"
        if not util or not smi_util:
            problems.append(f"utilization under load: agent {util}, nvidia-smi {smi_util}%")
    return verdict("nvidia_smi", problems, f"{len(phases.smi_idle)} GPUs agree; {note}", details)

"""Options of the attribution stage."""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.agent.k8s.podresources.gpus import DEFAULT_GPU_RESOURCES
from gpuscope.agent.options import ConfigError, flag, names


def _resources(flag_name: str, text: str) -> tuple[str, ...]:
    found = names(text)
    if not found:
        raise ConfigError(f"{flag_name}: expected at least one resource name")
    return found


@dataclass(frozen=True, slots=True)
class AttributionOptions:
    gpu_resource_names: tuple[str, ...] = flag(
        DEFAULT_GPU_RESOURCES,
        "comma-separated extended resources that are GPUs, besides nvidia.com/mig-* (add "
        "renamed shared resources such as nvidia.com/gpu.shared)",
        parse=_resources,
    )

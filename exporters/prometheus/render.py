"""How a collector's records become samples: the `Renderer` a collector's declaration names
(`CollectorSpec.renderer`, "module:ATTRIBUTE"), with the metrics it may emit.

Renderers get their collector's records, its options (how to render: `--nvlink-per-link`
is the GPU renderer's), and what the attribution stage added, if anything. They never read
the world: records in, samples out.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gpuscope.agent.attribution.records import Attribution
from gpuscope.agent.runtime.spec import CollectorSpec
from gpuscope.exporters.prometheus.spec import MetricSpec

if TYPE_CHECKING:
    from gpuscope.exporters.prometheus.families import Families

R = TypeVar("R")
O = TypeVar("O")  # noqa: E741


@dataclass(frozen=True, slots=True)
class RenderContext(Generic[O]):
    options: O  # the collector's declared options
    attribution: Attribution | None  # None before attribution or where it failed


@dataclass(frozen=True, slots=True)
class Renderer(Generic[R, O]):
    collector: CollectorSpec[R, O]
    metrics: tuple[MetricSpec, ...]
    # (records, out, context); renderers that need no context take it as optional.
    render: Callable[[R, Families, RenderContext[O]], None]


@cache
def renderer_of(collector: CollectorSpec[Any, Any]) -> Renderer[Any, Any] | None:
    """The renderer a collector's declaration names; checked to be that collector's."""
    if collector.renderer is None:
        return None
    module, _, attr = collector.renderer.partition(":")
    found = getattr(importlib.import_module(module), attr)
    if not isinstance(found, Renderer) or found.collector is not collector:
        raise TypeError(f"{collector.renderer} is not the renderer of collector {collector.name}")
    return found

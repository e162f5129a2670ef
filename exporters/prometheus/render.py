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

if TYPE_CHECKING:
    from gpuscope.agent.attribution.records import Attribution
    from gpuscope.agent.runtime.sources import Keyed
    from gpuscope.agent.runtime.spec import CollectorSpec
    from gpuscope.exporters.prometheus.families import Families
    from gpuscope.exporters.prometheus.spec import MetricSpec

R = TypeVar("R")
O = TypeVar("O")  # noqa: E741


@dataclass(frozen=True, slots=True)
class RenderContext(Generic[O]):
    """What a renderer gets besides its records: its collector's options and what the
    attribution stage added."""

    options: O  # the collector's declared options
    attribution: Attribution | None  # None before attribution or where it failed


@dataclass(frozen=True, slots=True)
class Renderer(Generic[R, O]):
    """A collector's renderer, as its declaration names it: the metrics it may emit and the
    function that emits them (`renderer_of` checks that both are that collector's)."""

    collector: CollectorSpec[R, O]
    metrics: tuple[MetricSpec, ...]
    # (records, out, context); renderers that need no context take it as optional.
    render: Callable[[R, Families, RenderContext[O]], None]


@dataclass(frozen=True, slots=True)
class CompatRenderer(Generic[R]):
    """Another exporter's names served from one collector's records and what the
    attribution stage added (`--dcgm-compat`: exporters/prometheus/dcgm.py). Handed to the
    exporter only when the option is on; rendered in a batch of its own, so a failure
    leaves the rest of the scrape intact."""

    name: str  # for the log
    records: Keyed[R]  # the collector whose records it renders
    metrics: tuple[MetricSpec, ...]  # what it may emit: part of the agent's catalog then
    render: Callable[[R, Attribution | None, Families], None]


def _named(reference: str) -> Any:
    module, _, attr = reference.partition(":")
    return getattr(importlib.import_module(module), attr)


@cache
def metrics_of(collector: CollectorSpec[Any, Any]) -> tuple[MetricSpec, ...] | None:
    """The metrics a collector's declaration names (`CollectorSpec.metrics`): its part of
    the catalog, imported without its renderer or records."""
    if collector.metrics is None:
        return None
    found = _named(collector.metrics)
    if not isinstance(found, tuple):
        raise TypeError(f"{collector.metrics} is not a tuple of metric specs")
    return found


@cache
def renderer_of(collector: CollectorSpec[Any, Any]) -> Renderer[Any, Any] | None:
    """The renderer a collector's declaration names; checked to be that collector's and to
    emit the metrics the declaration names, so the catalog and the renderer cannot differ."""
    if collector.renderer is None:
        return None
    found = _named(collector.renderer)
    if not isinstance(found, Renderer) or found.collector is not collector:
        raise TypeError(f"{collector.renderer} is not the renderer of collector {collector.name}")
    if found.metrics is not metrics_of(collector):
        raise TypeError(f"{collector.renderer} does not render {collector.metrics}")
    return found

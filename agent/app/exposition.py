"""What the Prometheus exporter is handed: the catalog of every collector gpuscope has, the
renderers of the enabled ones and what the flags select.

The exporters know no registry and read no configuration (docs/architecture.md, "Layers"):
this module, at the top of the house, turns both into an `Exposition`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from gpuscope.agent.app.registry import BY_NAME, COLLECTORS, accelerators
from gpuscope.agent.gpu.collector import GPU
from gpuscope.exporters.prometheus.catalog import Catalog
from gpuscope.exporters.prometheus.detail import MetricSelection
from gpuscope.exporters.prometheus.exporter import Exposition
from gpuscope.exporters.prometheus.render import CompatRenderer, Renderer, metrics_of, renderer_of

if TYPE_CHECKING:
    from gpuscope.agent.app.config import Config


@cache
def catalog(compat: CompatRenderer[Any] | None = None) -> Catalog:
    """Every metric gpuscope may export: the agent's, every collector's in registry order
    (enabled or not: the contract does not change with the flags), the attribution stage's;
    then, with --dcgm-compat, dcgm-exporter's names."""
    base = Catalog.assemble(m for c in COLLECTORS if (m := metrics_of(c)) is not None)
    return base if compat is None else Catalog((*base.metrics, *compat.metrics))


@cache
def compat_of(variant: str, node_name: str) -> CompatRenderer[Any] | None:
    """The --dcgm-compat renderer; its modules are imported only when the option is on."""
    if variant == "off":
        return None
    from gpuscope.exporters.prometheus.dcgm import compat_renderer

    return compat_renderer(variant, node_name)


def selection_of(config: Config) -> MetricSelection:
    """The detail level and filters; --nvlink-per-link includes the per-link throughput."""
    per_link = GPU.name in config.collector_options and config.of(GPU).nvlink_per_link
    return MetricSelection.from_flags(
        config.agent.metrics_detail,
        config.agent.metrics_include,
        config.agent.metrics_exclude,
        also_include=r"gpuscope_gpu_nvlink_link_(transmit|receive)_bytes_total" if per_link else "",
    )


def exposition_of(
    config: Config, renderers: Mapping[str, Renderer[Any, Any]] | None = None
) -> Exposition:
    """`renderers` by collector name replaces the enabled collectors' own (tests use it)."""
    compat = compat_of(config.agent.dcgm_compat, config.agent.node_name)
    return Exposition(
        catalog=catalog(compat),
        renderers=dict(renderers) if renderers is not None else _registered(config),
        options=config.collector_options,
        selection=selection_of(config),
        max_pods_per_scrape=config.attribution.max_pods_per_scrape,
        node_label=config.agent.node_name if config.agent.series_node_label else None,
        accelerators=accelerators(config.collectors),
        compat=compat,
    )


def _registered(config: Config) -> dict[str, Renderer[Any, Any]]:
    """The renderers of the enabled collectors that have one."""
    found = {}
    for name in config.collectors:
        renderer = renderer_of(BY_NAME[name])
        if renderer is not None:
            found[name] = renderer
    return found

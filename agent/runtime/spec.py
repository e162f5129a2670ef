"""How a collector declares itself: one `CollectorSpec` value beside its code, listed once in
`agent/app/registry.py`. Everything else (flags, `Config`, the sources the agent builds, the
renderers and metrics the exporter uses, docs/metrics.md, the README's flag table) is
derived from these declarations.

A declaration module must stay cheap to import: the parser and `--help` import all of them.
Heavy dependencies (bcc, gRPC, lightkube) are imported inside `build`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from gpuscope.agent.clock import Clock
    from gpuscope.agent.runtime.sources import Source

R = TypeVar("R")  # the records the collector's source returns
O = TypeVar("O")  # the collector's options dataclass  # noqa: E741


class HostOptions(Protocol):
    """The agent-wide options a source may read: where the host is and who this node is.

    The agent's `AgentOptions` (agent/app/config.py) has these fields and more; a declaration
    sees only these, so the runtime knows nothing of the app that configures it."""

    @property
    def procfs(self) -> Path: ...
    @property
    def sysfs(self) -> Path: ...
    @property
    def node_name(self) -> str: ...
    @property
    def kubeconfig(self) -> Path | None: ...
    @property
    def cgroup_root(self) -> Path | None: ...
    @property
    def dcgm_compat(self) -> str:
        """`off` unless dcgm-exporter's names are served, which need the GPU source's
        per-second throughputs (computed only then: agent/gpu/source.py)."""
        ...


@dataclass(frozen=True, slots=True)
class BuildContext(Generic[O]):
    """What `CollectorSpec.build` gets: the agent-wide options and the collector's own."""

    agent: HostOptions  # host roots, node name, kubeconfig
    options: O
    clock: Clock
    background: bool  # False: tests drive background work (sampler ticks, polls) by hand


@dataclass(frozen=True, slots=True)
class CollectorSpec(Generic[R, O]):
    """One collector: a name, its options, how its source is built and how it is rendered.

    The value is also the typed key of its records: `collection.records(GPU)` is a
    `GpuSnapshot | None`, with no `isinstance` at the consumer.
    """

    name: str
    summary: str  # one line for the docs: what it reads
    options: type[O]
    build: Callable[[BuildContext[O]], Source[R]]
    # "module:ATTRIBUTE" of its Prometheus renderer (an `exporters.prometheus.render.Renderer`),
    # named rather than imported: sources never import exporters. None: nothing of its own to
    # render (the kubelet and pods collectors feed the attribution stage).
    renderer: str | None = None
    # "module:ATTRIBUTE" of the metrics that renderer may emit (a tuple of
    # `exporters.prometheus.spec.MetricSpec`, in exporters/prometheus/catalog_*.py). The
    # catalog holds every collector's metrics, enabled or not; naming them apart from the
    # renderer lets it be assembled without importing every renderer and the records each
    # reads (a GPU-only agent then never imports the AMD or network records).
    metrics: str | None = None
    default: bool = True  # enabled when --collectors is not given
    # What the collector is to the parts above it: ACCELERATOR (agent/runtime/accelerators.py)
    # for one that reads accelerators, whose source is then a `DeviceWatch` too; "" for none.
    role: str = ""

    def typed(self, records: Any) -> R:
        """Records of this collector's source, typed by the declaration (`Keyed`)."""
        return records  # type: ignore[no-any-return]

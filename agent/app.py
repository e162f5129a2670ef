"""Wiring: sources -> runner -> Prometheus collector -> HTTP server.

The only module that knows both sides of the data flow. Tests build an `Agent` in-process
with their own clock; the command line builds one from flags.
"""

from __future__ import annotations

import functools
import logging
import threading

from prometheus_client.registry import CollectorRegistry

from gpuscope.agent.attribution.stage import Attributor
from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.config import Config
from gpuscope.agent.gpu.source import GpuConfig, GpuSource
from gpuscope.agent.net.nic import NicSource
from gpuscope.agent.net.rdma import RdmaSource
from gpuscope.agent.sources import (
    Collection,
    Source,
    SourceRunner,
    SourceUnavailable,
    StatelessSource,
)
from gpuscope.exporters.prometheus.collector import GpuscopeCollector

log = logging.getLogger("gpuscope")


class MissingDependency(StatelessSource):
    """Stands in for a source whose Python dependency is not installed: it fails to start
    with the import error, every retry, and the other sources carry on."""

    def __init__(self, name: str, error: ImportError) -> None:
        self.name = name
        self._message = f"cannot import {error.name or 'a dependency'}: {error}"

    def start(self) -> None:
        raise SourceUnavailable(self._message)

    def collect(self) -> object:
        raise SourceUnavailable(self._message)


def build_sources(config: Config, clock: Clock, *, background: bool = True) -> list[Source[object]]:
    sources: list[Source[object]] = []
    for name in config.collectors:
        try:
            sources.append(_build_source(name, config, clock, background=background))
        except ImportError as exc:
            sources.append(MissingDependency(name, exc))
    return sources


def _build_source(name: str, config: Config, clock: Clock, *, background: bool) -> Source[object]:
    """One source; those with optional or heavy dependencies import them here."""
    if name == "gpu":
        gpu = GpuConfig(
            sample_interval=config.sample_interval,
            idle_threshold=config.idle_threshold,
            nvlink_per_link=config.nvlink_per_link,
            sysfs=config.sysfs,
            background=background,
        )
        return GpuSource(gpu, clock=clock)
    if name == "nic":
        return NicSource(config.sysfs)
    if name == "rdma":
        return RdmaSource(config.sysfs)
    if name == "kubelet":
        from gpuscope.agent.k8s.kubelet_source import KubeletSource

        return KubeletSource(
            config.kubelet_socket,
            interval=config.kubelet_interval,
            clock=clock,
            background=background,
        )
    if name == "pods":
        from gpuscope.agent.k8s.client import make_client
        from gpuscope.agent.k8s.pods_source import PodsSource

        return PodsSource(
            functools.partial(make_client, config.kubeconfig),
            config.node_name,
            order=config.workload_order,
        )
    if name == "net":
        from gpuscope.agent.net.bpf_program import MapLimits
        from gpuscope.agent.net.source import NetConfig, NetSource

        net = NetConfig(
            sysfs=config.sysfs,
            procfs=config.procfs,
            cgroup_root=config.cgroup_root,
            per_container=config.net_per_container,
            prune_grace=config.net_prune_grace,
            traffic_mode=config.net_traffic_mode,
            limits=MapLimits(cgroups=config.bpf_max_cgroups, sockets=config.bpf_max_sockets),
            modules_dir=config.kernel_modules,
            fallback_headers=config.kernel_headers,
        )
        return NetSource(net, clock=clock)
    raise ValueError(f"unknown collector {name!r}")


class Agent:
    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        sources: list[Source[object]] | None = None,
        background: bool = True,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.sources = (
            sources
            if sources is not None
            else build_sources(config, self.clock, background=background)
        )
        self.runner = SourceRunner(self.sources, clock=self.clock)
        self.attributor = Attributor(
            config.procfs, gpu_resource_names=config.gpu_resource_names, clock=self.clock
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = GpuscopeCollector(self.collect)
        self.registry.register(self.collector)
        self._ready = threading.Event()

    def collect(self) -> Collection:
        """Every source, then attribution: what one scrape renders."""
        return self.attributor.attribute(self.runner.collect())

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def start(self) -> Collection:
        """Start every source and run the first full collection (then /readyz says ready)."""
        self.runner.start()
        first = self.collect()
        self._ready.set()
        failed = [r.name for r in first.results.values() if not r.success]
        log.info(
            "ready: collectors %s%s",
            ", ".join(self.runner.names) or "none",
            f" (failing: {', '.join(failed)})" if failed else "",
        )
        return first

    def source(self, name: str) -> Source[object]:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(name)

    def stop(self) -> None:
        self.runner.stop()

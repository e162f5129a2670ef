"""`--series-node-label`: the agent puts `node="<node name>"` on every series itself, for a
plain Prometheus scrape config or a ServiceMonitor that adds no node label, so that the
dashboards and alerts (which select and join on `node`) work without relabeling. Off by
default: the shipped PodMonitor adds `node` from the pod's node, and two `node` labels
would clash (honor_labels keeps the agent's)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from gpuscope.agent.app.exposition import catalog
from gpuscope.agent.clock import ManualClock
from gpuscope.exporters.prometheus.families import Families
from tests.support.netmetrics import promtool_check
from tests.support.promtext import Exposition

POD = ("ml-team", "trainer-0", "uid-1", "PyTorchJob", "llm", "main")


def families(node: str | None) -> Families:
    out = Families(catalog())
    if node is not None:
        out.with_constant_labels({"node": node})
    out.add("gpuscope_nic_up", ("eth0",), 1)
    out.add("gpuscope_nic_up", ("eth1",), 0)
    out.add("gpuscope_agent_threads", (), 12)
    batch = Families(catalog())  # a renderer's batch, merged into the scrape's
    batch.add_histogram(
        "gpuscope_pod_tcp_rtt_seconds", POD, ((0.001, 3), (0.01, 7), (float("inf"), 9)), 0.05
    )
    out.merge(batch)
    return out


class Fixed(Collector):
    def __init__(self, node: str | None) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        yield from families(self.node).metrics()


def test_every_series_gets_the_node_label_histograms_included() -> None:
    text = families('gpu-node-7 "a"').render_text().decode()
    m = Exposition(text)
    assert m.samples and {dict(labels).get("node") for _, labels in m.samples} == {'gpu-node-7 "a"'}
    assert m.value("gpuscope_nic_up", device="eth1", node='gpu-node-7 "a"') == 0
    assert m.value("gpuscope_agent_threads", node='gpu-node-7 "a"') == 12
    assert m.value("gpuscope_pod_tcp_rtt_seconds_bucket", le="0.01", pod="trainer-0") == 7
    assert 'node="gpu-node-7 \\"a\\""' in text  # escaped like any value
    promtool_check(text)


def test_the_fast_text_path_and_prometheus_client_agree_with_the_label() -> None:
    for node in ("gpu-node-7", None):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Fixed(node))
        assert generate_latest(registry) == families(node).render_text()


def test_off_by_default_and_on_with_the_flag() -> None:
    for argv, node in (([], None), (["--series-node-label", "true"], "gpu-node-7")):
        config = parse(
            ["--listen", ":0", "--collectors", "nic", *argv], env={"NODE_NAME": "gpu-node-7"}
        )
        agent = Agent(config, clock=ManualClock(0.0))
        agent.start()
        try:
            m = Exposition(agent.collector.render_text().decode())
        finally:
            agent.stop()
        assert m.get("gpuscope_collector_success", collector="nic") == 1
        assert {dict(labels).get("node") for _, labels in m.samples} == {node}

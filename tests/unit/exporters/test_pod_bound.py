"""The bound on per-pod series (--max-pods-per-scrape): a node with 2,000 pods, three
containers each, exports the series of 512 pods per scrape, the same ones every scrape:
GPU holders first, then the busiest on the network. Host and device series all stay, what
was left out is counted, and the log says so once, not once per scrape."""

from __future__ import annotations

import logging
import random
import re

import pytest

from gpuscope.agent.app.config import ConfigError, parse
from gpuscope.agent.app.exposition import catalog, exposition_of
from gpuscope.agent.attribution.records import (
    Attribution,
    GpuHolding,
    GpuStatus,
    PodGpuUsage,
    PodName,
    PodRef,
    PodSignals,
)
from gpuscope.agent.k8s.pod_cgroup_usage import PodCgroupUsage, Pressure
from gpuscope.agent.k8s.workloads import Workload
from gpuscope.agent.net.records import RTT_SLOTS, NetSnapshot, PodNetwork
from gpuscope.agent.runtime.sources import Collection, SourceResult
from gpuscope.exporters.prometheus.exporter import PrometheusExporter
from gpuscope.exporters.prometheus.pod_bound import is_per_pod
from gpuscope.exporters.scrape import Scrape
from tests.support.netmetrics import promtool_check
from tests.support.promtext import Exposition

PODS, CONTAINERS, GPUS, BOUND = 2_000, 3, 8, 512
GPU_PODS = tuple(range(5, 5 + 5 * GPUS, 5))  # quiet pods on the network: kept for the GPU
JOB = Workload("Job", "train")
UNNAMED = "0badc0de-0000-4000-8000-000000000000"  # traffic from a pod the API never named
NET_FAMILIES = (  # and the containers with each, in the pod kept
    ("gpuscope_pod_network_transmit_bytes_total", [f"c{c}" for c in range(CONTAINERS)]),
    ("gpuscope_pod_tcp_rtt_seconds_count", ["c0"]),  # histograms: only c0 has RTT samples
)


def uid(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"


def name(i: int) -> str:
    return f"pod-{i:04d}"


def records(pods: int, shuffle: int | None = None) -> tuple[NetSnapshot, Attribution]:
    """`pods` pods with traffic growing with their index (pod i sends i kB per container)
    and cgroup signals, GPU_PODS holding one GPU each, a host process on GPU 7 and the
    host's own traffic."""
    order = list(range(pods))
    if shuffle is not None:
        random.Random(shuffle).shuffle(order)
    net = [PodNetwork(pod_uid="", container_id="", transmit_bytes={"tcp": 1})]
    net.append(PodNetwork(pod_uid=UNNAMED, container_id="", transmit_bytes={"tcp": 10**12}))
    names: dict[str, PodName] = {}
    refs = []
    for i in order:
        containers = {f"cid-{i}-{c}": f"c{c}" for c in range(CONTAINERS)}
        names[uid(i)] = PodName("team", name(i), JOB.kind, JOB.name, containers)
        refs.append(PodRef(uid(i), "team", name(i), JOB))
        for c, cid in enumerate(containers):
            rtt = (1,) * RTT_SLOTS if c == 0 else ()
            net.append(
                PodNetwork(
                    pod_uid=uid(i),
                    container_id=cid,
                    transmit_bytes={"tcp": 1000 * i},
                    receive_bytes={"tcp": 10},
                    connections_opened=1,
                    rtt_slots=rtt,
                    rtt_sum_seconds=0.001 if rtt else 0.0,
                    rtt_count=RTT_SLOTS if rtt else 0,
                )
            )
    gpu_pods = [i for i in GPU_PODS if i < pods]
    holdings = tuple(
        GpuHolding(g, f"GPU-{g}", "team", name(i), "c0", JOB) for g, i in enumerate(gpu_pods)
    )
    host = PodRef("", "", "", Workload("", ""))
    usage = (
        *(PodGpuUsage(g, f"GPU-{g}", PodRef(uid(i), "team", name(i), JOB), "c0", 2**30, 0.5)
          for g, i in enumerate(gpu_pods)),
        PodGpuUsage(GPUS - 1, f"GPU-{GPUS - 1}", host, "", 2**20, 0.1),
    )  # fmt: skip
    gpus = tuple(GpuStatus(g, f"GPU-{g}", g < len(gpu_pods), 0, 1.0) for g in range(GPUS))
    signals = tuple(
        PodSignals(r, PodCgroupUsage(r.uid, Pressure(1.0, 0.5), oom_kills=0)) for r in refs
    )
    attribution = Attribution(
        holdings=holdings,
        gpus=gpus,
        usage=usage,
        pods=tuple(refs),
        pod_names=names,
        pod_signals=signals,
    )
    snapshot = NetSnapshot(tuple(net), {"traffic": "tracepoint"}, {}, {"cgroups": len(net)}, {})
    return snapshot, attribution


class Node:
    """The exporter over records that the test changes between scrapes."""

    def __init__(self, *flags: str) -> None:
        config = parse(["--collectors", "net", "--net-per-container", *flags], env={})
        self.snapshot, self.attribution = records(PODS)
        self.exporter = PrometheusExporter(self._scrape, exposition_of(config))

    def _scrape(self) -> Scrape:
        result = SourceResult("net", self.snapshot, True, 0.01)
        return Scrape(Collection({"net": result}, 0.0), self.attribution)

    def scrape(self) -> Exposition:
        return Exposition(self.exporter.render_text().decode())


def pods_in(m: Exposition, family: str) -> set[str]:
    """The pods with series in `family`: by name, else by UID; "" for host series."""
    return {labels["pod"] or labels.get("pod_uid", "") for labels, _ in m.rows(family)}


def dropped(text: bytes, collector: str) -> float:
    """gpuscope_series_dropped_total of one collector, read without parsing 60k lines."""
    line = re.search(
        rb'^gpuscope_series_dropped_total\{collector="%s".*\} (\S+)$' % collector.encode(),
        text,
        re.M,
    )
    assert line is not None
    return float(line.group(1))


def series_count(text: bytes) -> int:
    """Series as Prometheus stores them: one per sample line."""
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))


def expected_kept() -> set[str]:
    by_traffic = [name(i) for i in range(PODS - 1, -1, -1) if i not in GPU_PODS]
    return {*(name(i) for i in GPU_PODS), UNNAMED, *by_traffic[: BOUND - len(GPU_PODS) - 1]}


def test_keeps_gpu_holders_then_the_busiest_pods_and_every_host_series() -> None:
    m = Node().scrape()
    kept = expected_kept()
    assert pods_in(m, "gpuscope_pod_network_transmit_bytes_total") == kept | {""}  # "": host
    assert pods_in(m, "gpuscope_pod_info") == kept - {UNNAMED}  # pod_info: named pods only
    assert pods_in(m, "gpuscope_pod_oom_kills_total") == kept - {UNNAMED}  # cgroup signals
    assert pods_in(m, "gpuscope_pod_gpu_memory_bytes") == {name(i) for i in GPU_PODS} | {""}
    assert pods_in(m, "gpuscope_gpu_allocation_info") == {name(i) for i in GPU_PODS}
    assert len(m.series("gpuscope_gpu_allocated")) == GPUS  # device series: never dropped
    for family in m.names():  # every per-pod family, those added later included
        spec = catalog().by_name.get(family.removesuffix("_count"))
        if spec is not None and is_per_pod(spec):
            assert pods_in(m, family) <= kept | {""}, family
    for family, containers in NET_FAMILIES:  # a kept pod keeps all its containers' series
        rows = [labels for labels, _ in m.rows(family) if labels["pod"] == name(PODS - 1)]
        assert sorted(r["container"] for r in rows) == containers
    everything = Node("--max-pods-per-scrape", "100000").exporter.render_text()
    assert everything.count(b"gpuscope_pod_info{") == PODS
    promtool_check(Node().exporter.render_text().decode())


def test_the_kept_set_does_not_depend_on_the_order_records_come_in() -> None:
    node = Node()
    first = pods_in(node.scrape(), "gpuscope_pod_network_transmit_bytes_total")
    for seed in (1, 2):
        node.snapshot, node.attribution = records(PODS, shuffle=seed)
        assert pods_in(node.scrape(), "gpuscope_pod_network_transmit_bytes_total") == first


def test_dropped_series_are_counted_and_logged_once_per_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    full = Node("--max-pods-per-scrape", "100000").exporter.render_text()
    node = Node()
    with caplog.at_level(logging.INFO, logger="gpuscope.exporter"):
        texts = [node.exporter.render_text() for _ in range(3)]
        lost = series_count(full) - series_count(texts[0])
        net, attribution = dropped(texts[0], "net"), dropped(texts[0], "attribution")
        # Per pod left out: pod_info, two CPU pressure series (some, full), OOM kills.
        assert net > 0 and attribution == (PODS + 1 - BOUND) * 4
        assert net + attribution == lost
        for n, text in enumerate(texts, start=1):  # counted in every scrape, as a counter
            assert dropped(text, "net") == n * net
        node.snapshot, node.attribution = records(BOUND - 1)  # back within the bound
        after = [node.scrape() for _ in range(2)]
    assert all(m.value("gpuscope_series_dropped_total", collector="net") == 3 * net for m in after)
    assert len(pods_in(after[-1], "gpuscope_pod_info")) == BOUND - 1
    lines = [r for r in caplog.records if "--max-pods-per-scrape" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.INFO]
    assert f"{PODS + 1} pods on this node, over --max-pods-per-scrape {BOUND}" in (
        lines[0].getMessage()
    )


def test_counters_are_exported_before_any_drop() -> None:
    node = Node()
    node.snapshot, node.attribution = records(10)
    m = node.scrape()
    assert m.by_label("gpuscope_series_dropped_total", "collector") == {"attribution": 0, "net": 0}


@pytest.mark.parametrize("value", ["0", "-5", "100001", "many", "1.5"])
def test_the_bound_flag_rejects_what_is_not_a_pod_count(value: str) -> None:
    with pytest.raises(ConfigError, match="--max-pods-per-scrape"):
        parse(["--max-pods-per-scrape", value], env={})


def test_the_default_bound_has_headroom_over_dense_nodes() -> None:
    assert parse([], env={}).attribution.max_pods_per_scrape == BOUND

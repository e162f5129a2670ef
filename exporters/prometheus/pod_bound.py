"""The bound on per-pod series: at most `--max-pods-per-scrape` pods are exported per scrape.

Per-pod families multiply with the pods on the node (and, with `--net-per-container`, with
their containers); a node that runs thousands of pods, or leaves thousands of finished ones
behind, must not make one scrape unbounded. The bound is applied once, to the whole
scrape, after every renderer has run: a pod is kept or left out in every per-pod family
together (never its memory without its pod_info), and a per-pod family added later is
bounded without being named here. A per-pod family is any family with a `pod` or
`pod_uid` label (catalog.py); host-level series (`pod=""` and `pod_uid=""`: the network
host set, host processes on a GPU), device series and per-workload sums are never dropped.

Which pods are kept when there are more is deterministic, so the same pods stay exported
from scrape to scrape: first the pods that hold or use a GPU (they appear in a per-pod
family with a `uuid` label), then by network bytes sent and received (cumulative, so the
order is stable), then by namespace and name (unnamed pods by UID). What is left out is
counted in `gpuscope_series_dropped_total{collector, reason="pod_limit"}` and said in the
log once when the node goes over the bound and once when it is back within it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.exporters.prometheus.families import Families
    from gpuscope.exporters.prometheus.spec import MetricSpec

log = logging.getLogger("gpuscope.exporter")

POD_LIMIT = "pod_limit"
DROPPED = "gpuscope_series_dropped_total"
TRAFFIC = ("gpuscope_pod_network_transmit_bytes_total", "gpuscope_pod_network_receive_bytes_total")

PodKey = tuple[str, str]  # (namespace, pod), or ("", uid) for a pod the API has not named
KeyOf = Callable[[tuple[str, ...]], PodKey | None]


def is_per_pod(spec: MetricSpec) -> bool:
    return "pod" in spec.labels or "pod_uid" in spec.labels


def per_pod_sources(metrics: Iterable[MetricSpec]) -> frozenset[str]:
    """The collectors (and stages) that render per-pod series: the counter's label values."""
    return frozenset(m.source for m in metrics if is_per_pod(m))


@cache
def _key_of(spec: MetricSpec) -> KeyOf:
    """How to read the pod out of one family's labels; None for a host-level series."""
    labels = spec.labels
    ns = labels.index("namespace") if "namespace" in labels else None
    pod = labels.index("pod") if "pod" in labels else None
    uid = labels.index("pod_uid") if "pod_uid" in labels else None

    def key(values: tuple[str, ...]) -> PodKey | None:
        if pod is not None and values[pod]:
            return (values[ns] if ns is not None else "", values[pod])
        if uid is not None and values[uid]:
            return ("", values[uid])
        return None

    return key


class PodBound:
    """Applies the bound to each scrape; keeps the dropped counts and the over/under state
    between scrapes (one instance per exporter)."""

    def __init__(self, max_pods: int, sources: Iterable[str]) -> None:
        """`sources`: the enabled collectors and stages with per-pod families, whose
        counters are exported from the first scrape (0 until a drop)."""
        self._max = max_pods
        self._dropped = dict.fromkeys(sorted(sources), 0)
        self._over = False
        self._lock = threading.Lock()

    def apply(self, out: Families) -> None:
        """Leave out the series of every pod past the bound, then add the counters."""
        catalog = out.catalog.by_name
        families = [catalog[name] for name in out.names() if is_per_pod(catalog[name])]
        ranked = _ranked(out, families)
        kept = set(ranked[: self._max])
        dropped: dict[str, int] = {}
        if len(ranked) > self._max:
            for spec in families:
                n = out.retain(spec.name, _keeper(_key_of(spec), kept))
                dropped[spec.source] = dropped.get(spec.source, 0) + n
        with self._lock:
            for source, n in dropped.items():
                self._dropped[source] = self._dropped.get(source, 0) + n
            self._say(len(ranked), sum(dropped.values()))
            for source, total in sorted(self._dropped.items()):
                out.add(DROPPED, (source, POD_LIMIT), total)

    def _say(self, pods: int, series: int) -> None:
        """One line when the node goes over the bound, one when it is back: not per scrape."""
        over = pods > self._max
        if over and not self._over:
            log.warning(
                "%d pods on this node, over --max-pods-per-scrape %d: the series of %d pods "
                "(%d series) are left out of each scrape, keeping pods that hold a GPU first, "
                "then by network bytes, then by name (gpuscope_series_dropped_total)",
                pods,
                self._max,
                pods - self._max,
                series,
            )
        elif not over and self._over:
            log.info(
                "%d pods, within --max-pods-per-scrape %d again: all exported", pods, self._max
            )
        self._over = over


def _keeper(key: KeyOf, kept: set[PodKey]) -> Callable[[tuple[str, ...]], bool]:
    """Keeps host-level series and those of the pods kept."""

    def keep(values: tuple[str, ...]) -> bool:
        k = key(values)
        return k is None or k in kept

    return keep


def _ranked(out: Families, families: list[MetricSpec]) -> list[PodKey]:
    """Every pod of this scrape, best first: GPU holders, then traffic, then name."""
    gpu: set[PodKey] = set()
    traffic: dict[PodKey, float] = {}
    for spec in families:
        key = _key_of(spec)
        holds = "uuid" in spec.labels
        for values in out.label_sets(spec.name):
            k = key(values)
            if k is None:
                continue
            traffic.setdefault(k, 0.0)
            if holds:
                gpu.add(k)
        if spec.name in TRAFFIC:
            for values, value in out.samples(spec.name):
                k = key(values)
                if k is not None:
                    traffic[k] += value
    return sorted(traffic, key=lambda k: (k not in gpu, -traffic[k], k))

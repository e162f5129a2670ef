"""Building metric families for one scrape, checked against the catalog."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporters.prometheus.catalog import BY_NAME, ORDER, MetricSpec


class Families:
    """Samples for one scrape, grouped into families; empty families are never emitted."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def add(self, name: str, labels: Sequence[str], value: float) -> None:
        spec = BY_NAME[name]
        if len(labels) != len(spec.labels):
            raise ValueError(f"{name}: expected labels {spec.labels}, got {len(labels)} values")
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _new_family(spec)
        family.add_metric(list(labels), value)  # type: ignore[attr-defined]

    def merge(self, other: Families) -> None:
        for name, family in other._families.items():
            mine = self._families.get(name)
            if mine is None:
                self._families[name] = family
            else:
                mine.samples.extend(family.samples)

    def __iter__(self) -> Iterator[Metric]:
        for name in sorted(self._families, key=ORDER.__getitem__):
            yield self._families[name]

    def names(self) -> set[str]:
        return set(self._families)


def _new_family(spec: MetricSpec) -> Metric:
    if spec.kind == "counter":
        return CounterMetricFamily(spec.family_name, spec.help, labels=list(spec.labels))
    return GaugeMetricFamily(spec.family_name, spec.help, labels=list(spec.labels))

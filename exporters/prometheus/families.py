"""Samples for one scrape, checked against the catalog, and their text exposition.

`prometheus_client.generate_latest` validates and escapes every label name of every sample;
with a thousand series per node that was two thirds of the scrape. Our label names come
from the catalog and are valid by construction, so `render_text` writes the same bytes
(a test compares the two on every golden file) doing only the work that depends on values.
The OpenMetrics format is still produced by prometheus_client from `metrics()`, which alone
imports it: an agent that is only scraped in the text format never loads prometheus_client.

Every label value is valid UTF-8 text when it is added (`add`, `add_histogram`): sources
already escape the bytes they read (agent/hostfs.py), and a value that still holds a lone
surrogate (a file name taken from a listing unconverted) is escaped here the same way, so
neither exposition can fail on a label value. The check costs about 50 ns a sample.

Labels set with `with_constant_labels` go on every series at render time, not in the
catalog: `--series-node-label` puts the node's name in `node` this way, so that a plain
Prometheus scrape config needs no relabeling.

A set is built for a `Catalog` (the metrics this agent may export, catalog.py) and a
`MetricSelection` (the detail level and filters, detail.py): samples of
a family it leaves out are dropped as they are added, and `full(name)` tells a renderer
whether to render every series of a family the default level serves only some of.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING

from gpuscope.agent.hostfs import label_text
from gpuscope.exporters.prometheus.detail import EVERYTHING, MetricSelection, Mode

if TYPE_CHECKING:  # prometheus_client is imported only for OpenMetrics (`metrics()`)
    from prometheus_client.core import Metric

    from gpuscope.exporters.prometheus.catalog import Catalog
    from gpuscope.exporters.prometheus.spec import MetricSpec

Sample = tuple[tuple[str, ...], float]
# A histogram sample: cumulative (le, count) pairs ending with +Inf, the sum, the count.
HistogramSample = tuple[tuple[str, ...], tuple[tuple[float, int], ...], float]


class Families:
    """Samples grouped by metric; metrics with no samples are never emitted."""

    def __init__(self, catalog: Catalog, selection: MetricSelection = EVERYTHING) -> None:
        self._samples: dict[str, list[Sample]] = {}
        self._histograms: dict[str, list[HistogramSample]] = {}
        self.catalog = catalog
        self._by_name, self._order = catalog.by_name, catalog.order
        self._constant: tuple[tuple[str, str], ...] = ()
        self.selection = selection
        self._modes = _modes(catalog, selection)  # looked up on every add: one dict, built once

    def full(self, name: str) -> bool:
        """Whether every series of `name` is wanted (the full level, an include filter, or a
        family the default level serves whole); False for one served in part or not at all."""
        return self._modes[name] == "full"

    def with_constant_labels(self, labels: Mapping[str, str]) -> Families:
        """Every series of this set rendered with `labels` too (names no metric declares)."""
        self._constant = tuple((k, _text(v)) for k, v in sorted(labels.items()))
        return self

    def add(self, name: str, labels: Sequence[str], value: float) -> None:
        spec = self._by_name[name]  # KeyError: the metric is not in the catalog
        if self._modes[name] == "off":
            return
        samples = self._samples.get(name)
        if samples is None:
            samples = self._samples[name] = []
        if len(labels) != len(spec.labels):
            raise ValueError(f"{name}: expected labels {spec.labels}, got {len(labels)} values")
        samples.append((_valid(labels), value))

    def add_histogram(
        self,
        name: str,
        labels: Sequence[str],
        buckets: Sequence[tuple[float, int]],
        sum_value: float,
    ) -> None:
        """`buckets`: cumulative counts by upper bound, the last one +Inf (the count)."""
        spec = self._by_name[name]
        if spec.kind != "histogram" or len(labels) != len(spec.labels):
            raise ValueError(f"{name}: not a histogram with labels {spec.labels}")
        if not buckets or not math.isinf(buckets[-1][0]):
            raise ValueError(f"{name}: the last bucket must be +Inf")
        if self._modes[name] == "off":
            return
        self._histograms.setdefault(name, []).append((_valid(labels), tuple(buckets), sum_value))

    def merge(self, other: Families) -> None:
        for name, samples in other._samples.items():
            self._samples.setdefault(name, []).extend(samples)
        for name, hists in other._histograms.items():
            self._histograms.setdefault(name, []).extend(hists)

    def names(self) -> list[str]:
        """The metrics that have samples, in no particular order."""
        return [*self._samples, *self._histograms]

    def samples(self, name: str) -> list[Sample]:
        """The (labels, value) samples of a counter or gauge; [] for none or a histogram."""
        return self._samples.get(name, [])

    def label_sets(self, name: str) -> Iterator[tuple[str, ...]]:
        """The labels of every series of `name`, histograms included (one per histogram)."""
        for labels, _ in self._samples.get(name, ()):
            yield labels
        for labels, _, _ in self._histograms.get(name, ()):
            yield labels

    def retain(self, name: str, keep: Callable[[tuple[str, ...]], bool]) -> int:
        """Keep only the series of `name` whose own labels `keep` accepts (the per-pod
        bound, exporters/prometheus/pod_bound.py); how many series were left out, counted
        as Prometheus stores them (a histogram: one per bucket, its count and its sum)."""
        dropped = 0
        if name in self._samples:
            before = self._samples[name]
            self._samples[name] = [s for s in before if keep(s[0])]
            dropped += len(before) - len(self._samples[name])
            if not self._samples[name]:
                del self._samples[name]
        if name in self._histograms:
            hists = self._histograms[name]
            self._histograms[name] = [h for h in hists if keep(h[0])]
            dropped += sum(len(h[1]) + 2 for h in hists if not keep(h[0]))
            if not self._histograms[name]:
                del self._histograms[name]
        return dropped

    def _ordered(self) -> list[str]:
        return sorted({*self._samples, *self._histograms}, key=self._order.__getitem__)

    def metrics(self) -> Iterator[Metric]:
        """prometheus_client metric families, for the registry (and OpenMetrics)."""
        for name in self._ordered():
            spec = self._by_name[name]
            extra = [v for _, v in self._constant]
            family = _new_family(spec, tuple(k for k, _ in self._constant))
            if spec.kind == "histogram":
                for labels, buckets, total in self._histograms[name]:
                    family.add_metric(  # type: ignore[attr-defined]
                        [*labels, *extra], [(_go_float(le), n) for le, n in buckets], total
                    )
            else:
                for labels, value in self._samples[name]:
                    family.add_metric([*labels, *extra], value)  # type: ignore[attr-defined]
            yield family

    def render_text(self) -> bytes:
        """The Prometheus text format (0.0.4), byte for byte what generate_latest writes."""
        out: list[str] = []
        # Many families share label sets (every GPU metric has gpu+uuid, every pod network
        # metric the same pod labels): each distinct set is escaped and joined once.
        seen: dict[tuple[tuple[tuple[str, int], ...], tuple[str, ...]], str] = {}
        extra = tuple(v for _, v in self._constant)
        for name in self._ordered():
            header, order = _layout(self.catalog, name, tuple(k for k, _ in self._constant))
            out.append(header)
            if name in self._histograms:
                self._render_histograms(name, out)
                continue
            for own, value in self._samples[name]:
                labels = own + extra if extra else own
                inner = seen.get((order, labels))
                if inner is None:
                    inner = ",".join([f'{key}="{_escape(labels[i])}"' for key, i in order])
                    seen[(order, labels)] = inner
                braces = f"{{{inner}}}" if inner else ""  # no labels: no braces
                out.append(f"{name}{braces} {_go_float(value)}\n")
        return "".join(out).encode("utf-8")

    def _render_histograms(self, name: str, out: list[str]) -> None:
        """Each series' labels are escaped once, not once per bucket: with a hundred pods
        the RTT histograms are two thousand bucket lines per scrape."""
        _, order = _layout(self.catalog, name, tuple(k for k, _ in self._constant))
        extra = tuple(v for _, v in self._constant)
        before = tuple((k, i) for k, i in order if k < "le")
        after = tuple((k, i) for k, i in order if k > "le")
        bucket = f"{name}_bucket{{"
        for own, buckets, total in self._histograms[name]:
            labels = own + extra
            head = "".join([f'{key}="{_escape(labels[i])}",' for key, i in before])
            tail = "".join([f',{key}="{_escape(labels[i])}"' for key, i in after])
            for le, count in buckets:
                out.append(f'{bucket}{head}le="{_bound(le)}"{tail}}} {_go_float(count)}\n')
            plain = ",".join([f'{key}="{_escape(labels[i])}"' for key, i in order])
            out.append(f"{name}_count{{{plain}}} {_go_float(buckets[-1][1])}\n")
            out.append(f"{name}_sum{{{plain}}} {_go_float(total)}\n")


def _new_family(spec: MetricSpec, extra: tuple[str, ...] = ()) -> Metric:
    # Here, not at the top: importing prometheus_client loads all of it (its HTTP servers
    # included), and only OpenMetrics and the tests' `generate_latest` need these.
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        UnknownMetricFamily,
    )

    labels = [*spec.labels, *extra]
    if spec.kind == "histogram":
        return HistogramMetricFamily(spec.name, spec.help, labels=labels)
    if spec.kind == "counter" and not spec.name.endswith("_total"):
        # Another exporter's counter named without _total (dcgm-exporter's, --dcgm-compat):
        # OpenMetrics would serve it as <name>_total; its name is kept, typed unknown.
        return UnknownMetricFamily(spec.name, spec.help, labels=labels)
    if spec.kind == "counter":
        return CounterMetricFamily(spec.family_name, spec.help, labels=labels)
    return GaugeMetricFamily(spec.family_name, spec.help, labels=labels)


@cache
def _modes(catalog: Catalog, selection: MetricSelection) -> Mapping[str, Mode]:
    """What `selection` serves of each metric of the catalog (a few selections per process)."""
    return {name: selection.mode(spec) for name, spec in catalog.by_name.items()}


@cache
def _layout(
    catalog: Catalog, name: str, extra: tuple[str, ...] = ()
) -> tuple[str, tuple[tuple[str, int], ...]]:
    """HELP/TYPE lines and the label order (sorted by name, as generate_latest sorts them);
    `extra`, the constant labels' names, whose values follow the metric's own."""
    spec = catalog.by_name[name]
    doc = spec.help.replace("\\", r"\\").replace("\n", r"\n")
    header = f"# HELP {name} {doc}\n# TYPE {name} {spec.kind}\n"
    order = tuple(sorted((key, i) for i, key in enumerate((*spec.labels, *extra))))
    return header, order


def _valid(labels: Sequence[str]) -> tuple[str, ...]:
    """The label values as text that encodes to UTF-8: the last line of defence."""
    values = tuple(labels)
    if "".join(values).isascii():  # the common case, in one C call: ~50 ns a sample
        return values
    return tuple(_text(v) for v in values)


def _text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return label_text(value)  # surrogates -> \xNN, as hostfs writes undecodable bytes
    return value


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


@cache
def _bound(le: float) -> str:
    """Bucket bounds repeat in every series: format each once."""
    return _go_float(le)


def _go_float(value: float) -> str:
    """prometheus_client's floatToGoString: Go's formatting of a float64."""
    if type(value) is int and -1_000_000 < value < 1_000_000:
        return f"{value}.0"  # what the general path below gives for small integers, faster
    d = float(value)
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s

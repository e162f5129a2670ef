"""No label value fails an exposition: a value that still holds bytes Python could not decode
(a name taken from a directory listing, unconverted) is written `\\xNN` in both the text
format and OpenMetrics, as the sources write such bytes themselves."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector

from gpuscope.agent.app.exposition import catalog
from gpuscope.exporters.prometheus.families import Families
from tests.support.netmetrics import promtool_check
from tests.support.promtext import Exposition

UNDECODED = "eth\udcff0"  # what os.listdir gives for the name b"eth\xff0"


def families() -> Families:
    out = Families(catalog())
    out.add("gpuscope_nic_up", (UNDECODED,), 1)
    out.add("gpuscope_nic_up", ("eth1",), 1)
    out.add("gpuscope_nic_up", ('q"uo\\te\nü',), 0)
    out.add("gpuscope_nic_up", ("lone\ud800",), 1)
    return out


class Fixed(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from families().metrics()


def test_the_text_format_writes_undecoded_bytes_escaped() -> None:
    body = families().render_text()
    text = body.decode("utf-8")  # valid UTF-8
    m = Exposition(text)
    devices = {dict(labels)["device"] for labels in m.series("gpuscope_nic_up")}
    assert devices == {"eth\\xff0", "eth1", 'q"uo\\te\nü', "lone\\ud800"}
    assert 'device="eth\\\\xff0"' in text  # the backslash itself escaped, as the format asks
    promtool_check(text)


def test_the_fast_text_path_and_prometheus_client_agree() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    assert generate_latest(registry) == families().render_text()


def test_openmetrics_writes_them_too() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    text = generate_openmetrics(registry).decode("utf-8")
    assert 'gpuscope_nic_up{device="eth\\\\xff0"} 1.0' in text
    assert text.endswith("# EOF\n")

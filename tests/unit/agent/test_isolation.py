"""One failing source never fails the scrape; its failure is visible and logged once."""

from __future__ import annotations

import logging

from prometheus_client import generate_latest

from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from gpuscope.agent.app.exposition import exposition_of
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.gpu.collector import GPU
from gpuscope.agent.runtime.sources import SourceAbsent, SourceNotInstalled, SourceUnavailable
from gpuscope.exporters.prometheus.exporter import PrometheusExporter
from gpuscope.exporters.prometheus.render import Renderer
from tests.support.promtext import Exposition


class Flaky:
    def __init__(self, name: str) -> None:
        self.name = name
        self.error: Exception | None = None
        self.started = 0

    def start(self) -> None:
        self.started += 1

    def read(self) -> object:
        if self.error is not None:
            raise self.error
        return object()

    def stop(self) -> None:
        pass


class NeverStarts(Flaky):
    """Fails to start until `installed` is set (a driver or mount appears later)."""

    installed = False

    def start(self) -> None:
        self.started += 1
        if not self.installed:
            raise SourceUnavailable("no tracefs mounted at /sys/kernel/tracing")


def scrape(agent: Agent) -> Exposition:
    return Exposition(generate_latest(agent.registry).decode())


def make(*sources: Flaky, clock: ManualClock | None = None) -> Agent:
    # Every scrape here must collect anew: no sharing of a recent collection.
    config = parse(["--listen", ":0", "--collection-max-age", "0"], env={})
    agent = Agent(config, sources=list(sources), clock=clock)
    agent.start()
    return agent


def test_failing_source_reports_zero_and_others_keep_working(caplog) -> None:
    good, bad = Flaky("good"), NeverStarts("bad")
    clock = ManualClock()
    agent = make(good, bad, clock=clock)
    with caplog.at_level(logging.INFO, logger="gpuscope.sources"):
        for _ in range(5):
            m = scrape(agent)
            assert m.value("gpuscope_collector_success", collector="good") == 1
            assert m.value("gpuscope_collector_success", collector="bad") == 0
            assert m.value("gpuscope_collector_duration_seconds", collector="bad") >= 0
    errors = [r for r in caplog.records if "collector bad failed" in r.getMessage()]
    assert len(errors) <= 1  # logged only on change; the first one during start()
    # Retried with backoff, not on every scrape: the host may gain the feature later.
    assert bad.started == 1
    for wait, expected in ((10, 2), (10, 2), (10, 3), (40, 4)):
        clock.advance(wait)
        scrape(agent)
        assert bad.started == expected


def test_a_source_that_starts_late_is_picked_up() -> None:
    late = NeverStarts("late")
    clock = ManualClock()
    agent = make(late, clock=clock)
    assert scrape(agent).value("gpuscope_collector_success", collector="late") == 0
    late.installed = True
    clock.advance(10)
    assert scrape(agent).value("gpuscope_collector_success", collector="late") == 1


def test_errors_are_logged_once_per_change_of_state(caplog) -> None:
    flaky = Flaky("flaky")
    agent = make(flaky)
    with caplog.at_level(logging.INFO, logger="gpuscope.sources"):
        flaky.error = RuntimeError("device busy")
        for _ in range(3):
            scrape(agent)
        flaky.error = RuntimeError("device gone")
        scrape(agent)
        flaky.error = None
        scrape(agent)
        scrape(agent)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "collector flaky failed: RuntimeError: device busy",
        "collector flaky failed: RuntimeError: device gone",
        "collector flaky recovered",
    ]


def test_a_renderer_bug_fails_only_its_collector() -> None:
    def broken(records: object, out: object, ctx: object) -> None:
        raise KeyError("oops")

    config = parse(["--listen", ":0"], env={})
    agent = Agent(config, sources=[Flaky("buggy"), Flaky("other")])
    agent.registry.unregister(agent.collector)
    renderers = {"buggy": Renderer(GPU, (), broken)}
    agent.registry.register(PrometheusExporter(agent.scrape, exposition_of(config, renderers)))
    agent.start()
    m = scrape(agent)
    assert m.value("gpuscope_collector_success", collector="buggy") == 0
    assert m.value("gpuscope_collector_success", collector="other") == 1
    assert m.get("gpuscope_build_info") == 1


def test_a_missing_python_dependency_fails_only_its_collector(monkeypatch, caplog) -> None:
    """grpc absent (a GPU check run from a bare checkout): the kubelet collector says so and
    the others serve; the agent does not crash at start."""
    import sys

    # A None entry in sys.modules makes the import raise ImportError.
    monkeypatch.setitem(sys.modules, "gpuscope.agent.k8s.kubelet_source", None)
    config = parse(["--listen", ":0", "--collectors", "kubelet,nic"])
    agent = Agent(config, clock=ManualClock(0.0))
    with caplog.at_level(logging.ERROR, logger="gpuscope.sources"):
        agent.start()
    m = Exposition(generate_latest(agent.registry).decode())
    assert m.value("gpuscope_collector_success", collector="kubelet") == 0
    assert m.value("gpuscope_collector_success", collector="nic") == 1
    assert (
        "collector kubelet failed: cannot import gpuscope.agent.k8s.kubelet_source" in caplog.text
    )
    agent.stop()


class NoLibrary(Flaky):
    """Its vendor library is not on the host: an absence, not a fault."""

    def start(self) -> None:
        self.started += 1
        raise SourceAbsent("vendor library not found: no such devices on this host")


def test_an_absent_source_says_so_in_every_result_until_it_starts() -> None:
    """The labels withdraw only on an absence (agent/labels/hold.py): the runner keeps the
    start's kind of failure, also on collections between two tries, and a fault is not one."""
    clock = ManualClock()
    absent, faulty = NoLibrary("absent"), NeverStarts("faulty")
    agent = make(absent, faulty, clock=clock)
    for _ in range(2):  # the first try at start, then a collection before the retry is due
        results = agent.runner.collect().results
        assert results["absent"].absent and not results["absent"].success
        assert results["absent"].error == "vendor library not found: no such devices on this host"
        assert not results["faulty"].absent and not results["faulty"].success
    assert absent.started == 1  # the second collection did not try again yet
    clock.advance(10)
    assert agent.runner.collect().results["absent"].absent
    assert absent.started == 2


class NotInstalled(Flaky):
    """Its vendor library is not installed at all (an AMD collector on an NVIDIA node)."""

    def start(self) -> None:
        self.started += 1
        raise SourceNotInstalled("vendor library not installed on this host")


def test_a_library_not_installed_is_marked_apart_from_a_driver_not_loaded() -> None:
    """GpuscopeCollectorFailing leaves out what gpuscope_collector_absent marks: a library
    that is not installed (another vendor's node), never a driver that did not load on a
    node of that vendor (an absence for the labels, but an incident)."""
    clock = ManualClock()
    missing, unloaded = NotInstalled("missing"), NoLibrary("unloaded")
    agent = make(missing, unloaded, clock=clock)
    for _ in range(2):  # at start, then between two tries
        results = agent.runner.collect().results
        assert results["missing"].absent and results["missing"].not_installed
        assert results["unloaded"].absent and not results["unloaded"].not_installed
    m = scrape(agent)
    assert m.value("gpuscope_collector_absent", collector="missing") == 1
    assert m.get("gpuscope_collector_absent", collector="unloaded") is None

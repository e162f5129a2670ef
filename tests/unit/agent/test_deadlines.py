"""A hung or slow collector cannot hold the scrape: deadlines, last good data, one call in
flight per collector, and one collection shared by concurrent scrapers."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import generate_latest

from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from tests.support.promtext import Exposition

DEADLINE = 0.5


class Gate:
    """A source whose collect blocks while `held` (an NVML call stuck in the kernel)."""

    def __init__(self, name: str, *, hold_start: bool = False) -> None:
        self.name = name
        self.released = threading.Event()
        self.released.set()
        self.hold_start = hold_start
        self.calls = 0
        self.value = 0

    def hold(self) -> None:
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def start(self) -> None:
        if self.hold_start:
            self.released.wait(30)

    def read(self) -> int:
        self.calls += 1
        self.released.wait(30)
        self.value += 1
        return self.value

    def stop(self) -> None:
        self.released.set()


class Slow:
    name = "slow"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0

    def start(self) -> None:
        pass

    def read(self) -> int:
        self.calls += 1
        time.sleep(self.seconds)
        return self.calls

    def stop(self) -> None:
        pass


def make(*sources: object, max_age: float = 0, deadline: float = DEADLINE) -> Agent:
    config = parse(
        [
            "--listen",
            ":0",
            "--collect-deadline",
            str(deadline),
            "--collection-max-age",
            str(max_age),
        ],
        env={},
    )
    agent = Agent(config, sources=list(sources))  # type: ignore[arg-type]
    agent.start()
    return agent


def scrape(agent: Agent) -> Exposition:
    return Exposition(generate_latest(agent.registry).decode())


def timed_scrape(agent: Agent) -> tuple[Exposition, float]:
    began = time.monotonic()
    text = scrape(agent)
    return text, time.monotonic() - began


def test_a_hung_collector_is_stuck_with_its_last_good_data_and_the_others_stay_fresh() -> None:
    hung, fine = Gate("hung"), Gate("fine")
    agent = make(hung, fine)
    try:
        good = agent.scrape().collection.results["hung"].records  # start's collection, then this
        assert good == 2
        hung.hold()
        for _ in range(4):
            out, took = timed_scrape(agent)
            assert took < DEADLINE + 2.0  # answered, not hung (a generous bound)
            assert out.value("gpuscope_collector_success", collector="hung") == 0
            assert out.value("gpuscope_collector_stuck", collector="hung") == 1
            assert out.value("gpuscope_collector_success", collector="fine") == 1
            assert out.value("gpuscope_collector_stuck", collector="fine") == 0
        scraped = agent.scrape()
        stuck = scraped.collection.results["hung"]
        assert stuck.stuck and not stuck.success
        assert stuck.records == good  # the last good records
        assert stuck.error is not None and stuck.error.startswith("stuck")
        assert scraped.collection.results["fine"].records > 2  # fine kept collecting
        assert agent.stuck().keys() == {"hung"}
        assert "stuck: hung" in agent.health_detail()
    finally:
        hung.release()
        agent.stop()


def test_a_stuck_collector_holds_one_call_and_one_thread_however_many_scrapes_come() -> None:
    hung = Gate("hung")
    agent = make(hung)
    try:
        hung.hold()
        scrape(agent)
        calls, threads = hung.calls, threading.active_count()
        for _ in range(10):
            scrape(agent)
        assert hung.calls == calls  # no second call queued behind the one in flight
        assert threading.active_count() <= threads
    finally:
        hung.release()
        agent.stop()


def test_a_stuck_collector_costs_one_deadline_not_one_per_scrape() -> None:
    """Once a collector is known stuck its last good data is served at once: a Prometheus
    whose scrape_timeout is under --collect-deadline keeps every other collector's data."""
    deadline = 2.0
    hung, fine = Gate("hung"), Gate("fine")
    agent = make(hung, fine, deadline=deadline)
    try:
        hung.hold()
        first, took_first = timed_scrape(agent)
        assert took_first >= deadline  # the scrape that meets the hang waits it out, once
        assert first.value("gpuscope_collector_stuck", collector="hung") == 1
        fresh = agent.scrape().collection.results["fine"].records
        for _ in range(6):
            out, took = timed_scrape(agent)
            assert took < deadline / 2, took  # not another deadline
            assert out.value("gpuscope_collector_stuck", collector="hung") == 1
            assert out.value("gpuscope_collector_success", collector="fine") == 1
        assert agent.scrape().collection.results["fine"].records > fresh  # still collecting
        assert hung.calls == 2  # start's collection, then the one still in flight
    finally:
        hung.release()
        agent.stop()


def test_a_collector_hung_in_start_costs_the_scrapes_after_ready_nothing() -> None:
    deadline = 2.0
    hung, fine = Gate("hung", hold_start=True), Gate("fine")
    hung.hold()
    agent = make(hung, fine, deadline=deadline)  # start waits one deadline for it
    try:
        for _ in range(4):
            out, took = timed_scrape(agent)
            assert took < deadline / 2, took
            assert out.value("gpuscope_collector_stuck", collector="hung") == 1
            assert out.value("gpuscope_collector_success", collector="fine") == 1
    finally:
        hung.release()
        agent.stop()


def test_a_collection_that_joins_a_slow_one_in_flight_gets_its_result() -> None:
    """The deadline counts from when the work began, so a scrape that joins a slow but
    healthy collection mid-way waits for it and is not told it is stuck."""
    slow = Slow(0.3)
    agent = make(slow, deadline=1.0)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            early = pool.submit(agent.runner.collect)
            time.sleep(0.15)
            late = pool.submit(agent.runner.collect)
            results = [f.result().results["slow"] for f in (early, late)]
        assert [r.success for r in results] == [True, True]
        assert not any(r.stuck for r in results)
        assert results[0].records == results[1].records  # one collection, shared
    finally:
        agent.stop()


def test_a_collector_that_answers_again_is_fresh_on_the_next_scrape() -> None:
    hung = Gate("hung")
    agent = make(hung)
    try:
        hung.hold()
        assert scrape(agent).value("gpuscope_collector_stuck", collector="hung") == 1
        hung.release()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            out = scrape(agent)
            if out.value("gpuscope_collector_success", collector="hung") == 1:
                break
        assert out.value("gpuscope_collector_stuck", collector="hung") == 0
        assert out.value("gpuscope_collector_success", collector="hung") == 1
        assert agent.stuck() == {}
        assert agent.health_detail() == ""
    finally:
        agent.stop()


def test_last_success_timestamp_says_how_stale_a_stuck_collector_is() -> None:
    hung = Gate("hung")
    agent = make(hung)
    try:
        good = scrape(agent).value(
            "gpuscope_collector_last_success_timestamp_seconds", collector="hung"
        )
        assert abs(good - time.time()) < 30
        hung.hold()
        stuck = scrape(agent)
        assert (
            stuck.value("gpuscope_collector_last_success_timestamp_seconds", collector="hung")
            == good
        )
        assert stuck.value("gpuscope_collector_duration_seconds", collector="hung") >= DEADLINE
    finally:
        hung.release()
        agent.stop()


def test_a_source_that_hangs_in_start_does_not_keep_the_agent_from_ready() -> None:
    hung, fine = Gate("hung", hold_start=True), Gate("fine")
    hung.hold()
    began = time.monotonic()
    agent = make(hung, fine)
    try:
        assert time.monotonic() - began < 3 * DEADLINE + 2.0
        assert agent.ready
        out = scrape(agent)
        assert out.value("gpuscope_collector_stuck", collector="hung") == 1
        assert out.value("gpuscope_collector_success", collector="fine") == 1
        hung.release()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if scrape(agent).value("gpuscope_collector_success", collector="hung") == 1:
                break
        assert scrape(agent).value("gpuscope_collector_success", collector="hung") == 1
        assert hung.calls >= 1
    finally:
        agent.stop()


def test_a_stuck_attribution_stage_serves_its_last_result() -> None:
    fine = Gate("fine")
    agent = make(fine)
    gate = threading.Event()
    real = agent.attributor.attribute

    def stuck_attribute(collection):  # type: ignore[no-untyped-def]
        gate.wait(30)
        return real(collection)

    try:
        before = agent.scrape().attribution
        agent.attributor.attribute = stuck_attribute  # type: ignore[method-assign]
        scraped = agent.scrape()
        assert scraped.attribution is before
        assert scraped.attribution_status is not None and scraped.attribution_status.stuck
        out = scrape(agent)
        assert out.value("gpuscope_collector_stuck", collector="attribution") == 1
        assert out.value("gpuscope_collector_success", collector="fine") == 1
    finally:
        gate.set()
        agent.stop()


def test_concurrent_scrapes_share_one_collection() -> None:
    slow = Slow(0.3)
    agent = make(slow)
    try:
        calls = slow.calls
        with ThreadPoolExecutor(max_workers=50) as pool:
            took = list(pool.map(lambda _: timed_scrape(agent)[1], range(50)))
        assert slow.calls - calls <= 3  # 50 scrapes, one or two collections (not 50)
        assert max(took) < 10 * 0.3  # each waited about one collection, not fifty
    finally:
        agent.stop()


def test_a_recent_collection_is_reused_within_the_max_age_and_not_after() -> None:
    slow = Slow(0.0)
    agent = make(slow, max_age=0.5)
    try:
        agent.scrape()
        calls = slow.calls
        agent.scrape()
        agent.scrape()
        assert slow.calls == calls
        time.sleep(0.6)
        agent.scrape()
        assert slow.calls == calls + 1
    finally:
        agent.stop()

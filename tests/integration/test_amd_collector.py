"""The `amd` collector on a fake AMD node: the real `amdsmi` bindings over the fake
libamd_smi.so (tests/doubles/fakeamdsmi), the agent in this process on a manual clock.

What a platform team relies on: the same metric names as on NVIDIA nodes, values in base
units, counters that grow, nothing made up where the library has no answer, and a node
without ROCm that says so once and serves everything else."""

from __future__ import annotations

import logging
import re
from collections import Counter

import pytest

from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from gpuscope.agent.clock import ManualClock
from tests.support import wait_for
from tests.support.promtext import Exposition

GIB = 1 << 30


def per_gpu_series(text: str) -> Counter[str]:
    """Series per GPU UUID in an exposition."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        found = re.search(r'[{,]uuid="([^"]*)"', line)
        if found and not line.startswith("#"):
            counts[found.group(1)] += 1
    return counts


def test_an_mi300x_node_reads_as_eight_amd_gpus_under_the_shared_names(amd_inprocess) -> None:
    h = amd_inprocess("mi300x")
    m = h.scrape()
    info = m.rows("gpuscope_gpu_info")
    assert len(info) == 8
    assert {labels["vendor"] for labels, _ in info} == {"amd"}
    assert {labels["model"] for labels, _ in info} == {"AMD Instinct MI300X"}
    assert {labels["architecture"] for labels, _ in info} == {"cdna3"}
    assert {labels["compute_capability"] for labels, _ in info} == {"gfx942"}
    totals = m.series("gpuscope_gpu_memory_total_bytes")
    assert set(totals.values()) == {192 * GIB}
    assert set(m.series("gpuscope_gpu_up").values()) == {1.0}
    assert m.value("gpuscope_collector_success", collector="amd") == 1.0
    # What NVIDIA alone has is absent on AMD GPUs, not 0.
    for nvidia_only in ("gpuscope_gpu_xid_errors_total", "gpuscope_gpu_nvlink_links"):
        assert nvidia_only not in m.names()


def test_busy_seconds_and_energy_grow_with_the_work(amd_inprocess) -> None:
    h = amd_inprocess("mi300x")
    uuid = h.fake.gpu(0)["uuid"]
    before = h.scrape()
    h.fake.set_activity(0, 75, umc=40)
    h.fake.set_power(0, 600.0)
    h.advance(10)
    after = h.scrape()
    busy = after.value("gpuscope_gpu_busy_seconds_total", uuid=uuid) - before.value(
        "gpuscope_gpu_busy_seconds_total", uuid=uuid
    )
    assert busy == pytest.approx(7.5)
    energy = after.value("gpuscope_gpu_energy_joules_total", uuid=uuid) - before.value(
        "gpuscope_gpu_energy_joules_total", uuid=uuid
    )
    assert energy == pytest.approx(10 * 600.0, rel=1e-3)
    assert after.value("gpuscope_gpu_utilization_ratio", uuid=uuid) == pytest.approx(0.75)
    assert after.value("gpuscope_gpu_memory_utilization_ratio", uuid=uuid) == pytest.approx(0.4)
    assert after.value("gpuscope_gpu_power_watts", uuid=uuid) == 600.0
    idle_uuid = h.fake.gpu(1)["uuid"]
    assert after.value("gpuscope_gpu_busy_seconds_total", uuid=idle_uuid) == 0.0


def test_xgmi_bytes_are_read_on_every_supported_release(amd_inprocess) -> None:
    """amdsmi 6.4.0 has no Python amdsmi_get_link_metrics: the agent reads the C struct
    there (make oldest-amdsmi runs this on mi300x-rocm64), the function on 7.0.2."""
    h = amd_inprocess("mi300x")
    uuid = h.fake.gpu(0)["uuid"]
    before = h.scrape().value("gpuscope_gpu_xgmi_transmit_bytes_total", uuid=uuid)
    h.fake.set_xgmi_link(0, 0, read_kbps=1000, write_kbps=500)
    h.advance(10)
    m = h.scrape()
    sent = m.value("gpuscope_gpu_xgmi_transmit_bytes_total", uuid=uuid) - before
    assert sent == 10 * 500 * 1024  # KB written over 10 s, in bytes
    assert m.value("gpuscope_gpu_xgmi_receive_bytes_total", uuid=uuid) >= 10 * 1000 * 1024


def test_units_are_base_units(amd_inprocess) -> None:
    h = amd_inprocess("mi300x")
    uuid = h.fake.gpu(0)["uuid"]
    m = h.scrape()
    clocks = m.by_label("gpuscope_gpu_clock_hertz", "clock", uuid=uuid)
    assert clocks == {"sm": 132e6, "memory": 900e6}  # MHz -> Hz; the default clocks only
    temps = m.by_label("gpuscope_gpu_temperature_celsius", "sensor", uuid=uuid)
    assert temps["gpu"] == 42.0 and temps["memory"] == 38.0 and "edge" not in temps
    assert m.value("gpuscope_gpu_memory_used_bytes", uuid=uuid) == 283 * (1 << 20)


def test_a_sensor_the_gpu_lacks_is_absent_not_zero(amd_inprocess) -> None:
    h = amd_inprocess("mi300x", setup=lambda fake: fake.set_temperature(0, "junction", None))
    uuid = h.fake.gpu(0)["uuid"]
    temps = h.scrape().by_label("gpuscope_gpu_temperature_celsius", "sensor", uuid=uuid)
    assert "gpu" not in temps and temps["memory"] == 38.0


def test_the_default_level_serves_at_most_40_series_per_gpu(amd_inprocess) -> None:
    h = amd_inprocess("mi300x")
    h.advance(3)
    counts = per_gpu_series(h.scrape_text())
    assert len(counts) == 8
    assert max(counts.values()) <= 40, counts
    full = amd_inprocess("mi300x", "--metrics-detail", "full")
    full.advance(3)
    assert max(per_gpu_series(full.scrape_text()).values()) > max(counts.values())


def test_a_host_without_rocm_reports_amd_absent_in_one_line(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("ROCM_PATH", "ROCM_HOME", "LD_LIBRARY_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    config = parse(["--listen", "127.0.0.1:0", "--collectors", "amd"], env={})
    agent = Agent(config, clock=ManualClock(1.7e9), background=False)
    caplog.set_level(logging.INFO)
    agent.start()
    try:
        from prometheus_client import generate_latest

        m = Exposition(generate_latest(agent.registry).decode())
        m2 = Exposition(generate_latest(agent.registry).decode())
    finally:
        agent.stop()
    assert m.value("gpuscope_collector_success", collector="amd") == 0.0
    assert m2.value("gpuscope_collector_success", collector="amd") == 0.0
    assert m2.value("gpuscope_collector_absent", collector="amd") == 1.0  # not failing
    assert "gpuscope_gpu_info" not in m.names()
    lines = [r.getMessage() for r in caplog.records if "libamd_smi.so not found" in r.getMessage()]
    assert len(lines) == 1, lines


def test_events_are_counted_per_gpu_and_type_none_lost(amd_inprocess) -> None:
    h = amd_inprocess("mi300x")
    for _ in range(3):
        h.fake.post_event(0, "vmfault", "page fault in pid 4242")
    h.fake.post_event(1, "gpu_pre_reset")
    h.advance(1)
    h.fake.post_event(0, "vmfault")  # after a drain: counted on top, not instead
    h.advance(1)
    m = h.scrape()
    g0, g1 = h.fake.gpu(0)["uuid"], h.fake.gpu(1)["uuid"]
    assert m.value("gpuscope_gpu_events_total", uuid=g0, event="vm_fault") == 4
    assert m.value("gpuscope_gpu_events_total", uuid=g1, event="gpu_pre_reset") == 1
    assert m.get("gpuscope_gpu_events_total", uuid=g1, event="vm_fault") is None
    # Every GPU's events are delivered: the watched gauge is served only for exceptions.
    assert "gpuscope_gpu_events_watched" not in m.names()


def test_a_hung_gpu_is_isolated_and_comes_back(amd_inprocess) -> None:
    h = amd_inprocess("mi300x", "--amd-read-deadline", "0.2")
    stuck = h.fake.gpu(2)["uuid"]
    h.fake.hang(2)
    assert h.scrape().value("gpuscope_gpu_up", uuid=stuck) == 0.0
    h.clock.advance(5)
    m = h.scrape()
    assert m.value("gpuscope_gpu_up", uuid=stuck) == 0.0
    assert m.value("gpuscope_gpu_stuck_seconds", uuid=stuck) >= 5.0
    ((labels, _),) = m.rows("gpuscope_gpu_stuck_call_info", uuid=stuck)
    assert labels["function"].startswith("amdsmi_")
    others = {u: v for (u,), v in _by_uuid(m, "gpuscope_gpu_up").items() if u != stuck}
    assert set(others.values()) == {1.0} and len(others) == 7
    assert h.amd.gates.threads() <= 8  # one worker per GPU, never a second
    h.fake.release(2)
    wait_for(lambda: h.scrape().value("gpuscope_gpu_up", uuid=stuck) == 1.0, what="answers")


def test_a_lost_gpu_reads_down_and_the_others_are_served(amd_inprocess) -> None:
    h = amd_inprocess("mi300x")
    lost = h.fake.gpu(3)["uuid"]
    h.fake.lose(3)
    m = h.scrape()
    assert m.value("gpuscope_gpu_up", uuid=lost) == 0.0
    assert m.get("gpuscope_gpu_power_watts", uuid=lost) is None  # nothing read, not 0
    assert m.rows("gpuscope_gpu_info", uuid=lost)  # its identity stays, for alerts
    assert sum(m.series("gpuscope_gpu_up").values()) == 7
    assert h.amd.lost_devices() == frozenset({lost})


def test_processes_carry_their_vram_and_gfx_share(amd_inprocess) -> None:
    h = amd_inprocess("mi300x")
    h.fake.set_processes(0, [{"pid": 4242, "name": "python3", "vram": 20 * GIB, "gfx_busy": 0.5}])
    h.advance(2)
    h.scrape()
    h.advance(2)
    snapshot = h.amd.read()
    (proc,) = snapshot.gpus[0].processes
    assert proc.pid == 4242 and proc.used_memory_bytes == 20 * GIB
    assert proc.utilization_ratio == pytest.approx(0.5, abs=0.05)


def test_the_accumulators_give_exact_busy_time_whatever_the_tick(amd_inprocess) -> None:
    """MI300's gfx_activity_acc integrates the activity at every firmware sample: busy
    seconds over 10 s of 40 % activity are 4 s with ticks 5 s apart, not a sampled guess."""
    h = amd_inprocess("mi300x")
    uuid = h.fake.gpu(0)["uuid"]
    before = h.scrape().value("gpuscope_gpu_busy_seconds_total", uuid=uuid)
    h.fake.set_activity(0, 40)
    h.advance(10, step=5)
    m = h.scrape()
    assert m.value("gpuscope_gpu_busy_seconds_total", uuid=uuid) - before == pytest.approx(4.0)
    ((labels, _),) = m.rows("gpuscope_gpu_partition_info", uuid=uuid)
    assert labels["activity"] == "accumulator"


def _by_uuid(m: Exposition, name: str) -> dict[tuple[str], float]:
    return {(labels["uuid"],): v for labels, v in m.rows(name)}


def test_a_gpu_that_does_not_answer_at_start_is_found_later(amd_inprocess) -> None:
    def silent(fake) -> None:  # type: ignore[no-untyped-def]
        fake.fail(4, "amdsmi_get_gpu_device_uuid", 6)  # AMDSMI_STATUS_DRM_ERROR

    h = amd_inprocess("mi300x", setup=silent)
    m = h.scrape()
    assert len(m.rows("gpuscope_gpu_up")) == 8  # counted, though not identified
    assert m.value("gpuscope_gpu_up", gpu="4") == 0.0
    h.fake.clear_fail(4)
    m = h.scrape()
    assert m.value("gpuscope_gpu_up", gpu="4") == 1.0
    assert m.value("gpuscope_gpu_up", uuid=h.fake.gpu(4)["uuid"]) == 1.0
    h.advance(2)
    assert h.scrape().get("gpuscope_gpu_busy_seconds_total", gpu="4") is not None


def test_a_library_of_another_release_than_the_bindings_is_refused_in_one_line(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """ROCm 6.4's library under 7.0.2's bindings: their structs differ, so every reading
    would be garbage. The collector refuses before reading anything, naming both."""
    from tests.doubles.fakeamdsmi import control
    from tests.support import start_amd_inprocess

    if control.bindings_release() != "7.0":
        pytest.skip("the pairing refused here is 7.0.2's bindings with a ROCm 6.4 library")
    for name in ("ROCM_PATH", "ROCM_HOME", control.STATE_ENV):
        monkeypatch.setenv(name, "")
    caplog.set_level(logging.ERROR)
    h = start_amd_inprocess(tmp_path, "mi300x-rocm64")
    try:
        m = h.scrape()
    finally:
        h.agent.stop()
    assert m.value("gpuscope_collector_success", collector="amd") == 0.0
    assert "gpuscope_gpu_info" not in m.names()
    (line,) = {r.getMessage() for r in caplog.records if "is not of the release" in r.getMessage()}
    assert "library 25." in line and "amdsmi 7.0.2" in line  # as misread through 7.0 structs

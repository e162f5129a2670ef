"""A real Prometheus keeps scraping the real agent through a GPU whose NVML calls hang (the
firmware stopped answering: XID 119/120 "GSP timeout"), with no gap in the other GPUs'
series: the hang is confined to its GPU, the scrape answers within Prometheus's timeout, and
the hung GPU reads `gpuscope_gpu_up 0` until its call returns."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.e2e.test_prometheus_e2e import SCRAPE_INTERVAL_S, start_prometheus
from tests.support import spawn_agent
from tests.support.observability import alerting_rules

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HUNG = 3
HANG_S = 8.0


def _value(result: list[dict]) -> float:  # type: ignore[type-arg]
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def test_prometheus_scrapes_through_a_hung_gpu_without_a_gap_in_the_others(
    tmp_path: Path, fake_lib: Path
) -> None:
    fake = FakeNvml("dgx-h100", tmp_path / "fake.state")
    agent = spawn_agent(
        tmp_path,
        "--collectors",
        "gpu",
        "--gpu-read-deadline",
        "0.3",
        "--collect-deadline",
        "0.6",
        "--labels-mode",
        "none",
        env=fake.env(),
    )
    prom = start_prometheus(tmp_path / "prom", {"sim-node-1": f"127.0.0.1:{agent.port}"})
    try:
        time.sleep(4 * SCRAPE_INTERVAL_S)  # a few clean scrapes first
        fake.hang_call("nvmlDeviceGetPowerUsage", gpu=HUNG)
        fake.wait_blocked(1, timeout=10)
        hang_began = time.time()
        time.sleep(HANG_S)
        status, metrics = agent.get("/metrics")
        assert status == 200
        assert f'gpuscope_gpu_up{{gpu="{HUNG}"' in metrics
        # The GPUStuck alert's expression, as written but for its 60 s threshold, picks the
        # hung GPU and only it; GPULost, which a stuck GPU's up 0 would otherwise trip, not.
        stuck_rule = next(r for r in alerting_rules() if r["alert"] == "GPUStuck")
        assert "> 60" in stuck_rule["expr"]
        firing = prom.query(stuck_rule["expr"].replace("> 60", "> 2"))
        assert [r["metric"]["gpu"] for r in firing] == [str(HUNG)]
        lost_rule = next(r for r in alerting_rules() if r["alert"] == "GPULost")
        assert prom.query(lost_rule["expr"]) == []
        fake.release_calls()
        time.sleep(4 * SCRAPE_INTERVAL_S)
        window = f"{int(time.time() - prom.started) + 1}s"

        # Every scrape succeeded: the target never went down.
        assert _value(prom.query(f'min_over_time(up{{job="gpuscope"}}[{window}])')) == 1
        scrapes = _value(prom.query(f'count_over_time(up{{job="gpuscope"}}[{window}])'))
        assert scrapes >= (HANG_S + 2) / SCRAPE_INTERVAL_S  # scraped all through the hang
        # The other GPUs have a sample in every scrape, and stayed up throughout.
        for gpu in range(8):
            if gpu == HUNG:
                continue
            samples = prom.query(f'count_over_time(gpuscope_gpu_up{{gpu="{gpu}"}}[{window}])')
            assert _value(samples) == scrapes, f"GPU {gpu}: a gap"
            assert _value(prom.query(f'min_over_time(gpuscope_gpu_up{{gpu="{gpu}"}}[{window}])'))
            power = prom.query(
                f'count_over_time(gpuscope_gpu_power_watts{{gpu="{gpu}"}}[{window}])'
            )
            assert _value(power) == scrapes, f"GPU {gpu}: a gap in its power series"
        # The hung GPU was down during the hang and is back.
        hang_window = f"{int(HANG_S) - 1}s"
        hung_during = prom.query(
            f'max_over_time(gpuscope_gpu_up{{gpu="{HUNG}"}}[{hang_window}] '
            f"@ {hang_began + HANG_S - 0.5:.3f})"
        )
        assert _value(hung_during) == 0
        assert _value(prom.query(f'gpuscope_gpu_up{{gpu="{HUNG}"}}')) == 1
        # No thread pile-up: the agent holds at most one extra thread per hung GPU.
        threads = prom.query(f"max_over_time(gpuscope_agent_threads[{window}])")
        baseline = prom.query(f"min_over_time(gpuscope_agent_threads[{window}])")
        assert _value(threads) - _value(baseline) <= 2
        assert agent.proc.poll() is None
    finally:
        fake.release_calls()
        prom.proc.terminate()
        prom.proc.wait(10)
        agent.stop()

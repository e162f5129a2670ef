"""The real `gpuscope` process: serves /metrics, /healthz, /readyz; runs on the fake NVML
node; keeps serving when there is no NVML at all; stops cleanly on SIGTERM."""

from __future__ import annotations

import re
import time

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.support import GOLDEN_DIR

pytestmark = pytest.mark.e2e


def test_serves_a_fake_h100_node_and_counts_busy_time(agent_process, fake_lib, tmp_path) -> None:
    fake = FakeNvml("dgx-h100", tmp_path / "state")  # real time: the sampler thread runs
    fake.set_utilization(0, 100)
    agent = agent_process("--sample-interval", "0.2", "--collectors", "gpu", env=fake.env())

    assert agent.get("/healthz") == (200, "ok\n")
    assert agent.get("/readyz") == (200, "ready\n")
    first = agent.scrape()
    time.sleep(1.5)
    second = agent.scrape()
    busy = second.value("gpuscope_gpu_busy_seconds_total", gpu="0") - first.value(
        "gpuscope_gpu_busy_seconds_total", gpu="0"
    )
    assert 1.0 < busy < 2.0
    assert second.value("gpuscope_collector_success", collector="gpu") == 1
    assert len(second.series("gpuscope_gpu_up")) == 8

    # The same families as the golden file (values differ: this one runs on real time).
    golden = set(re.findall(r"^# TYPE (\S+)", (GOLDEN_DIR / "dgx-h100.prom").read_text(), re.M))
    live = set(re.findall(r"^# TYPE (\S+)", agent.get("/metrics")[1], re.M))
    assert golden - live <= {"gpuscope_gpu_xid_errors_total"}  # the golden injects an XID
    # Served at the default level once nonzero: real time leaves gaps the frozen clock has not.
    assert live - golden <= {"gpuscope_gpu_unsampled_seconds_total"}

    assert agent.stop() == 0
    assert "Traceback" not in agent.logs()


def test_no_nvml_library_serves_everything_else_and_says_so_once(agent_process) -> None:
    agent = agent_process(env={"LD_LIBRARY_PATH": "/nonexistent"})
    for _ in range(3):
        m = agent.scrape()
        assert m.value("gpuscope_collector_success", collector="gpu") == 0
        assert m.get("gpuscope_build_info") == 1
        assert not m.series("gpuscope_gpu_up")
    assert agent.stop() == 0
    lines = [line for line in agent.logs().splitlines() if "collector gpu failed" in line]
    assert len(lines) == 1
    assert "NVML library libnvidia-ml.so.1 not found" in lines[0]
    assert "Traceback" not in agent.logs()


def test_json_logs_are_one_object_per_line(agent_process) -> None:
    import json

    agent = agent_process("--log-format", "json", env={"LD_LIBRARY_PATH": "/nonexistent"})
    agent.stop()
    entries = [json.loads(line) for line in agent.logs().splitlines() if line.strip()]
    assert any(e["level"] == "error" and e.get("collector") == "gpu" for e in entries)
    assert all({"ts", "level", "logger", "msg"} <= set(e) for e in entries)


def test_a_pathological_name_pattern_neither_freezes_a_scrape_nor_the_probes(
    agent_process, fake_lib, tmp_path
) -> None:
    """`([a-z_]+)*Q` and `(\\w+)*!` once took Python's backtracking `re` exponential time
    on the metric names at the first scrape: it timed out, then /healthz and /readyz stopped
    answering and the liveness probe restarted the agent after every first scrape. RE2
    matches them in linear time: every scrape and every probe answers at once."""
    fake = FakeNvml("dgx-h100", tmp_path / "state")
    agent = agent_process(
        "--collectors",
        "gpu",
        "--metrics-include",
        r"([a-z_]+)*Q",
        "--metrics-exclude",
        r"(\w+)*!",
        env=fake.env(),
    )
    for _ in range(3):
        began = time.monotonic()
        m = agent.scrape()
        assert time.monotonic() - began < 2.0
        assert m.value("gpuscope_collector_success", collector="gpu") == 1
        assert len(m.series("gpuscope_gpu_up")) == 8  # neither pattern matches a name
        for probe, answer in (("/healthz", "ok\n"), ("/readyz", "ready\n")):
            began = time.monotonic()
            assert agent.get(probe) == (200, answer)
            assert time.monotonic() - began < 1.0
    assert agent.stop() == 0


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [(r"(gpu)_\1", r"invalid escape sequence: \1"), (r"gpuscope_(?!nic).*", "(?!")],
)
def test_a_backreference_or_lookaround_stops_the_agent_with_one_line_and_exit_2(
    pattern: str, reason: str
) -> None:
    import subprocess

    from tests.support import GPUSCOPE, REPO

    done = subprocess.run(
        [*GPUSCOPE, "--metrics-include", pattern],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("gpuscope: --metrics-include: not an RE2 regular expression: ")
    assert reason in lines[0]

"""Prometheus scrapes a new pod as soon as it listens: the agent's sources start exactly
once however early the first scrapes come, and every answer is a live process serving
unique series (issue "never freeze", part "one start").

Each run starts the real binary and hammers /metrics from before it binds its port until a
few scrapes after /readyz, from two threads at once.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.support import GPUSCOPE, HEADERS, REPO, free_port
from tests.support.bpf import pin_root, remove_pins

pytestmark = pytest.mark.e2e

STARTS = 6
HAMMERS = 2  # concurrent scrapers
AFTER_READY = 5  # answers each scraper takes once the agent is ready
FLAGS = ("--labels-mode", "none", "--kernel-headers", str(HEADERS))


def _get(url: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(url, timeout=15) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return None  # not listening yet


def _duplicates(body: str) -> list[str]:
    series = Counter(
        line.rsplit(" ", 1)[0] for line in body.splitlines() if line and not line.startswith("#")
    )
    return [s for s, n in series.items() if n > 1]


def _hammer(base: str, answers: list[tuple[int, str]], stop: threading.Event) -> None:
    ready_seen = 0
    deadline = time.monotonic() + 30
    while not stop.is_set() and time.monotonic() < deadline and ready_seen < AFTER_READY:
        got = _get(base + "/metrics")
        if got is None:
            time.sleep(0.001)
            continue
        answers.append(got)
        if (_get(base + "/readyz") or (0, ""))[0] == 200:
            ready_seen += 1


def _one_start(collectors: str, tmp_path: Path, run: int) -> None:
    fake = FakeNvml("dgx-h100", tmp_path / f"state-{run}")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
    pins = pin_root(f"start-once-{port}")  # its own probes, unpinned when it stops
    env.update(fake.env(), PYTHONUNBUFFERED="1", GPUSCOPE_BPF_PIN_ROOT=str(pins))
    log_path = tmp_path / f"agent-{run}.log"
    answers: list[tuple[int, str]] = []
    stop = threading.Event()
    hammers = [threading.Thread(target=_hammer, args=(base, answers, stop)) for _ in range(HAMMERS)]
    for t in hammers:
        t.start()  # before the process exists: the first connection comes at once
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*GPUSCOPE, "--listen", f"127.0.0.1:{port}", "--collectors", collectors, *FLAGS],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        for t in hammers:
            t.join(timeout=40)
        alive = proc.poll() is None
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        remove_pins(pins)
    logs = log_path.read_text()
    assert alive, f"run {run}: the agent died (exit {proc.returncode}):\n{logs}"
    assert proc.returncode == 0, f"run {run}: exit {proc.returncode}:\n{logs}"
    assert len(answers) >= HAMMERS * AFTER_READY, f"run {run}: {len(answers)} answers:\n{logs}"
    for status, body in answers:
        assert status == 200, f"run {run}: /metrics answered {status}: {body[:200]}"
        assert not _duplicates(body), f"run {run}: duplicate series {_duplicates(body)[:3]}"
        gpus = sum(1 for line in body.splitlines() if line.startswith("gpuscope_gpu_up{"))
        assert gpus in (0, 8), f"run {run}: {gpus} gpuscope_gpu_up series"
    assert sum(1 for line in answers[-1][1].splitlines() if line.startswith("gpuscope_gpu_up{"))
    assert logs.count("GPU(s)") == 1, f"run {run}: the GPU collector started twice:\n{logs}"
    assert "Traceback" not in logs, logs


def test_scrapes_from_the_first_millisecond_start_sources_once(fake_lib, tmp_path) -> None:
    for run in range(STARTS):
        _one_start("gpu,nic,rdma", tmp_path, run)


@pytest.mark.root("the eBPF probes need root")
@pytest.mark.kernel
def test_scrapes_during_ebpf_compilation_start_it_once(fake_lib, tmp_path) -> None:
    for run in range(STARTS):
        _one_start("gpu,net,nic,rdma", tmp_path, run)
        logs = (tmp_path / f"agent-{run}.log").read_text()
        assert "collector net failed" not in logs, logs

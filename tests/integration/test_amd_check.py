"""`gpuscope check` on a fake AMD node: the first-contact suite picks AMD where NVML is
absent, runs every AMD check, and tells the truth about what it measured.

The fake's clock moves only when told to; a thread moves it in step with real time here,
as a GPU's firmware counts, so the accumulator check has a window to measure."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from tests.doubles.fakeamdsmi.control import FakeAmdSmi
from tests.support import GPUSCOPE, REPO


def run_check(fake: FakeAmdSmi, tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    env = os.environ | fake.env() | {"LD_LIBRARY_PATH": "/nonexistent"}
    env.pop("FAKENVML_STATE", None)
    stop = threading.Event()

    def clock() -> None:  # the firmware's time, in step with ours
        while not stop.wait(0.05):
            fake.advance(0.05)

    ticker = threading.Thread(target=clock, daemon=True)
    ticker.start()
    try:
        result = subprocess.run(
            [*GPUSCOPE, "check", "--quick", "--json", str(tmp_path / "r.json"), *args],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        stop.set()
        ticker.join()
    return result.returncode, json.loads((tmp_path / "r.json").read_text()), result.stdout


def test_the_first_contact_suite_checks_an_mi300x_node(tmp_path: Path) -> None:
    fake = FakeAmdSmi("mi300x", tmp_path / "state", now=time.time())
    fake.set_activity(0, 40)
    fake.set_processes(0, [{"pid": os.getpid(), "name": "python3", "vram": 1 << 30}])
    code, report, out = run_check(fake, tmp_path)
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == {
        "amd_accumulators", "amd_costs", "amd_processes", "amd_events", "amd_memory",
        "amd_xgmi", "series_budget",
    }  # fmt: skip
    assert {c["status"] for c in checks.values()} == {"pass"}, out
    acc = checks["amd_accumulators"]["details"]["per_gpu"][fake.gpu(0)["uuid"]]
    assert abs(acc["accumulator_ratio"] - 0.4) < 0.02 and abs(acc["sampled_mean"] - 0.4) < 0.02
    assert report["inventory"]["vendor"] == "amd" and len(report["inventory"]["gpus"]) == 8
    assert code == 0 and "AMD Instinct MI300X" in out


def test_an_accumulator_without_a_sampled_reading_to_hold_it_to_fails(tmp_path: Path) -> None:
    """The check never passes what it could not compare: a GPU whose sampled activity the
    library refuses fails, named, rather than trusting its accumulator alone."""
    fake = FakeAmdSmi("mi300x", tmp_path / "state", now=time.time())
    fake.fail(0, "amdsmi_get_gpu_activity", 2)  # sampled reads: not supported on GPU 0
    fake.set_activity(0, 90)
    code, report, _ = run_check(fake, tmp_path)
    (acc,) = [c for c in report["checks"] if c["name"] == "amd_accumulators"]
    assert acc["status"] == "fail" and "GPU 0" in acc["message"]
    assert code == 1


def test_a_partitioned_node_reports_its_data_sheet_memory(tmp_path: Path) -> None:
    fake = FakeAmdSmi("mi300x-cpx", tmp_path / "state", now=time.time())
    _, report, _ = run_check(fake, tmp_path, "--vendor", "amd")
    (memory,) = [c for c in report["checks"] if c["name"] == "amd_memory"]
    assert memory["status"] == "pass", memory["message"]
    assert {g["partition"] for g in report["inventory"]["gpus"]} == {"CPX/NPS4"}

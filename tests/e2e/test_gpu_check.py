"""scripts/gpu-check compares the agent with nvidia-smi on a real GPU machine. Here it runs
on the fake node with an `nvidia-smi` stand-in, to prove its comparisons and its verdict."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.support import REPO

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024


def fake_smi(bin_dir: Path, fake: FakeNvml, *, power: float, lie_about_power: bool) -> None:
    rows = []
    for i in range(fake.gpu_count()):
        info = fake.gpu_info(i)
        watts = power * (1.5 if lie_about_power and i == 1 else 1.0)
        rows.append(
            f"{i}, {info['uuid']}, {info['name']}, {int(info['mem_total']) // MIB}, "
            f"{fake.profile['driver_version']}, {watts:.2f}, 50"
        )
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\ncat <<'EOF'\n" + "\n".join(rows) + "\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def run_check(tmp_path: Path, *, lie_about_power: bool) -> subprocess.CompletedProcess[str]:
    fake = FakeNvml("pcie-l40s", tmp_path / "state")
    for gpu in range(fake.gpu_count()):
        fake.set_utilization(gpu, 50)
        fake.set_power(gpu, 200.0)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_smi(bin_dir, fake, power=200.0, lie_about_power=lie_about_power)
    env = os.environ | fake.env() | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu-check"), "--seconds", "2"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_gpu_check_passes_when_agent_and_nvidia_smi_agree(fake_lib, tmp_path: Path) -> None:
    result = run_check(tmp_path, lie_about_power=False)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "[PASS] GPU 0 name: agent 'NVIDIA L40S', nvidia-smi 'NVIDIA L40S'" in out
    assert "[PASS] GPU 0 under load" in out
    assert "NVML calls that returned an error other than NOT_SUPPORTED: none" in out
    assert "17 passed, 0 failed" in out  # 4 checks x 4 GPUs + the load check


def test_gpu_check_fails_on_a_disagreement(fake_lib, tmp_path: Path) -> None:
    result = run_check(tmp_path, lie_about_power=True)
    assert result.returncode == 1
    assert "[FAIL] GPU 1 power: agent 200.0 W, nvidia-smi 300.0 W (within 10%)" in result.stdout

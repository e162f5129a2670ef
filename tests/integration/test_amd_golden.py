"""Golden /metrics of the fake AMD nodes, as test_golden.py has NVIDIA's: a short scripted
workload on a frozen clock, the output exact apart from what varies by design. After an
intended change: `make golden-update` (GPUSCOPE_UPDATE_GOLDEN=1), and review the diff."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.integration.test_golden import normalize
from tests.support import GOLDEN_DIR, assert_golden

GIB = 1 << 30
# Golden file name -> (profile, agent flags).
GOLDENS = {
    "amd-mi300x": ("mi300x", ()),
    "amd-mi300x-full": ("mi300x", ("--metrics-detail", "full")),
    "amd-mi300x-cpx": ("mi300x-cpx", ()),
    "amd-mi250x": ("mi250x", ()),
}


def scripted(h) -> str:  # type: ignore[no-untyped-def]
    """One busy GPU (a process on it, traffic on an XGMI link, a VM fault), one half busy,
    the rest idle. On a CPX node the processors are partitions: the first two of GPU 0."""
    h.fake.set_activity(0, 95, umc=60)
    h.fake.set_vram_used(0, 30 * 1024)
    h.fake.set_power(0, 610.0)
    h.fake.set_activity(1, 50, umc=20)
    h.fake.set_processes(0, [{"pid": 4242, "name": "python3", "vram": 29 * GIB, "gfx_busy": 0.9}])
    h.fake.post_event(0, "vmfault", "fault in pid 4242")
    if h.fake.gpu(0).get("xgmi_link_status"):
        h.fake.set_xgmi_link(0, 1, write_kbps=4_000_000, read_kbps=1_000_000)
    h.advance(8)
    return normalize(h.scrape_text())


@pytest.mark.parametrize("golden", GOLDENS)
def test_amd_metrics_match_golden(amd_inprocess, golden: str) -> None:
    profile, flags = GOLDENS[golden]
    text = scripted(amd_inprocess(profile, *flags))
    assert_golden(GOLDEN_DIR / f"{golden}.prom", text)


@pytest.mark.parametrize("golden", GOLDENS)
def test_amd_golden_passes_promtool(golden: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/install-deps.sh installs Debian's prometheus"
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=(GOLDEN_DIR / f"{golden}.prom").read_text(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr

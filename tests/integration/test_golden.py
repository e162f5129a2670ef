"""Golden /metrics for each fake node profile.

Each profile runs a short scripted workload on a frozen clock, so the output is exact apart
from what varies by design (collection durations, the Python version), which is normalized.
After an intended change, regenerate with `make golden-update` (GPUSCOPE_UPDATE_GOLDEN=1) and
review the diff like code.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.support import GOLDEN_DIR, assert_golden, wait_for

PROFILES = ["dgx-h100", "hgx-a100-mig", "pcie-l40s", "mixed", "dgx-h100-mig"]
# Golden file name -> (profile, agent flags): each profile at the default detail level, and
# the H100 nodes at full detail (every per-link, per-reason and per-pipe series).
GOLDENS = {
    **{p: (p, ()) for p in PROFILES},
    "dgx-h100-full": ("dgx-h100", ("--metrics-detail", "full")),
    "dgx-h100-mig-full": ("dgx-h100-mig", ("--metrics-detail", "full")),
    # dcgm-exporter's names beside gpuscope's (docs/migrating-from-dcgm-exporter.md): whole
    # GPUs at the default level, and MIG GPU instances at full detail.
    "dgx-h100-dcgm": ("dgx-h100", ("--dcgm-compat", "on")),
    "dgx-h100-mig-full-dcgm": ("dgx-h100-mig", ("--metrics-detail", "full", "--dcgm-compat", "on")),
}
# promtool's lint wants counters named *_total and no camelCase; dcgm-exporter's names have
# neither (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION is its counter, modelName its label), and
# --dcgm-compat serves them as dcgm-exporter does, so those lines alone are not linted.
DCGM_LINT = re.compile(r"^DCGM_FI_\w+ ")


def lint_problems(promtool_output: str) -> list[str]:
    """promtool check metrics' lines, less its lint of dcgm-exporter's own names."""
    return [
        line for line in promtool_output.splitlines() if line.strip() and not DCGM_LINT.match(line)
    ]


def normalize(text: str) -> str:
    text = re.sub(r"^(gpuscope_collector_duration_seconds\{[^}]*\}) .*$", r"\1 0", text, flags=re.M)
    # The agent's own process figures (tests/unit/agent/test_self_stats.py checks them).
    text = re.sub(r"^((?:process_\w+|gpuscope_agent_threads)) .*$", r"\1 0", text, flags=re.M)
    text = re.sub(
        r"^(gpuscope_collector_last_success_timestamp_seconds\{[^}]*\}) .*$",
        r"\1 0",
        text,
        flags=re.M,
    )
    return re.sub(r'python_version="[^"]*"', 'python_version="X"', text)


def scripted(h, *, served: bool = False) -> str:
    """The same small workload on every profile: one busy GPU, one half busy, one XID.
    `served`: the text /metrics serves (Families.render_text), where prometheus_client's
    would differ: for dcgm-exporter's counters without _total, which it cannot write."""
    h.fake.set_utilization(0, 95, 60)
    h.fake.set_memory_used(0, 30 * 2**30)
    h.fake.set_utilization_pattern(1, [(2.0, 50.0, 20.0), (2.0, 0.0, 0.0)])
    h.fake.add_ecc_errors(1, corrected=2)
    h.fake.inject_xid(1, 31)
    h.advance(8)
    wait_for(lambda: "gpuscope_gpu_xid_errors_total{" in h.scrape_text(), what="XID counted")
    if served:
        return normalize(h.agent.collector.render_text().decode())
    return normalize(h.scrape_text())


@pytest.mark.pinned_bindings("the golden files hold NVML's NUMA node, absent before 12.550")
@pytest.mark.parametrize("golden", GOLDENS)
def test_metrics_match_golden(inprocess, golden: str) -> None:
    profile, flags = GOLDENS[golden]
    text = scripted(inprocess(profile, *flags), served="--dcgm-compat" in flags)
    assert_golden(GOLDEN_DIR / f"{golden}.prom", text)


@pytest.mark.parametrize("golden", GOLDENS)
def test_golden_passes_promtool(golden: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/install-deps.sh installs Debian's prometheus"
    text = (GOLDEN_DIR / f"{golden}.prom").read_text()
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    problems = lint_problems(result.stdout + result.stderr)
    # promtool exits 3 on lint problems alone, 1 on a malformed exposition.
    assert result.returncode in ((0, 3) if golden.endswith("-dcgm") else (0,)), result
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("profile", PROFILES)
def test_fast_text_renderer_writes_exactly_what_prometheus_client_writes(
    inprocess, profile: str
) -> None:
    from prometheus_client import generate_latest

    h = inprocess(profile)
    h.fake.set_utilization(0, 42)
    h.advance(3)
    families = h.agent.collector.families()
    # Adversarial label values: escaping must match too.
    families.add("gpuscope_collector_success", ('we"ird\\name\nwith newline',), 1)
    families.add("gpuscope_collector_duration_seconds", ("big",), 123456789.5)

    class Fixed:
        def collect(self):
            return families.metrics()

    assert families.render_text() == generate_latest(Fixed())  # type: ignore[arg-type]

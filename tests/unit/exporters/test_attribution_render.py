"""The attribution exposition from fixed records: golden text, promtool-clean."""

from __future__ import annotations

import os
import shutil
import subprocess

from gpuscope.agent.app.exposition import catalog
from gpuscope.agent.attribution.records import (
    Attribution,
    GpuHolding,
    GpuStatus,
    MigStatus,
    PodEnergy,
    PodGpuUsage,
    PodRef,
)
from gpuscope.agent.k8s.workloads import Workload
from gpuscope.exporters.prometheus.attribution import render_attribution
from gpuscope.exporters.prometheus.families import Families
from tests.support import GOLDEN_DIR

GOLDEN = GOLDEN_DIR / "attribution.prom"
G0 = "GPU-3c5a2f41-8d7e-4b1a-9c3d-0e1f2a3b4c5d"
G6 = "GPU-9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
JOB = Workload("PyTorchJob", "llama-ft", "worker-0")
NB_A = Workload("Deployment", "notebook-a")
NB_B = Workload("Deployment", "notebook-b")
WORKER = PodRef("0b8e6a9c-1d2f-4e3a-8b7c-6d5e4f3a2b1c", "ml-team", "llama-ft-worker-0", JOB)
POD_A = PodRef("7f6e5d4c-3b2a-4190-8f7e-6d5c4b3a2910", "research", "notebook-a-5d9f-abcde", NB_A)
POD_B = PodRef("1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d", "research", "notebook-b-77c4-fghij", NB_B)
HOST = PodRef("", "", "", Workload("", ""))
G5 = "GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"
MIG_A = "MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c4d"
MIG_B = "MIG-1b2c3d4e-5f6a-5b7c-9d8e-0f1a2b3c4d5e"
VLLM = Workload("Deployment", "vllm")

ATTRIBUTION = Attribution(
    holdings=(
        GpuHolding(0, G0, "ml-team", "llama-ft-worker-0", "pytorch", JOB),
        GpuHolding(6, G6, "research", "notebook-a-5d9f-abcde", "lab", NB_A),
        GpuHolding(6, G6, "research", "notebook-b-77c4-fghij", "lab", NB_B),
        # One container holding two MIG devices of GPU 5: one allocation series, two MIG ones.
        GpuHolding(5, G5, "infer", "vllm-0", "server", VLLM, MIG_A),
        GpuHolding(5, G5, "infer", "vllm-0", "server", VLLM, MIG_B),
    ),
    gpus=(
        GpuStatus(0, G0, True, 2 * 2**30, 0.0),
        GpuStatus(6, G6, True, 0, 1830.5),
        GpuStatus(7, "GPU-7", False, 0, 0.0),
    ),
    usage=(
        PodGpuUsage(0, G0, WORKER, "pytorch", 61 * 2**30, 0.93),
        PodGpuUsage(0, G0, HOST, "", 2 * 2**30, 0.0),
        PodGpuUsage(6, G6, POD_A, "lab", 5 * 2**30, 0.0),
        PodGpuUsage(6, G6, POD_B, "lab", 7 * 2**30, None),  # no utilization (MIG): omitted
    ),
    pods=(WORKER, POD_A, POD_B),
    idle_seconds_total={
        ("research", "Deployment", "notebook-a"): 915.25,
        ("research", "Deployment", "notebook-b"): 915.25,
        ("ml-team", "PyTorchJob", "llama-ft"): 0.0,
    },
    migs=(
        MigStatus(5, G5, MIG_A, True, 42.5),
        MigStatus(5, G5, MIG_B, True, 0.0),
    ),
    low_activity_seconds_total={("ml-team", "PyTorchJob", "llama-ft"): 120.5},
    energy=(
        PodEnergy(0, G0, WORKER, 5_400_000.0),
        PodEnergy(6, G6, POD_A, 1000.0),
        PodEnergy(6, G6, POD_B, 2500.5),
    ),
    dropped={"unreadable": 1, "loop": 0, "too_large": 0, "invalid": 0},
)


def render() -> str:
    out = Families(catalog())
    render_attribution(ATTRIBUTION, out)
    return out.render_text().decode()


def test_attribution_exposition_matches_golden() -> None:
    text = render()
    if os.environ.get("GPUSCOPE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_attribution_exposition_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool
    check = subprocess.run(
        [promtool, "check", "metrics"], input=render().encode(), capture_output=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr

"""Node labels computed from the fake nodes' GPUs: golden sets per profile, valid label
syntax whatever NVML says, health that follows the GPUs, and `gpuscope labels`."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from gpuscope.agent.accelerators.records import AcceleratorSnapshot
from gpuscope.agent.gpu.records import GpuSnapshot, nvidia
from gpuscope.exporters.labels.gpu import check, gpu_labels
from gpuscope.exporters.labels.values import is_valid_value, label_value
from tests.doubles.fakenvml.control import FakeNvml
from tests.doubles.make_sysfs import write_tree
from tests.support import GOLDEN_DIR, GPUSCOPE, REPO

GOLDEN = GOLDEN_DIR / "labels"
PROFILES = ["dgx-h100", "hgx-a100-mig", "pcie-l40s", "mixed"]


def snapshot(h) -> GpuSnapshot:
    snap = h.gpu.read()
    assert isinstance(snap, AcceleratorSnapshot)
    return snap


@pytest.mark.pinned_bindings("the golden files hold NVML's NUMA node, absent before 12.550")
@pytest.mark.parametrize("profile", PROFILES)
def test_label_sets_match_golden(inprocess, profile: str) -> None:
    labels = gpu_labels(snapshot(inprocess(profile)))
    check(labels)
    path = GOLDEN / f"{profile}.json"
    text = json.dumps(labels, indent=2, sort_keys=True) + "\n"
    if os.environ.get("GPUSCOPE_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()


def test_mixed_node_counts_each_model_and_uses_the_smallest_capabilities(inprocess) -> None:
    labels = gpu_labels(snapshot(inprocess("mixed")))
    assert labels["gpuscope.io/gpu.product"] == "mixed"
    models = {k: v for k, v in labels.items() if k.startswith("gpuscope.io/gpu.model.")}
    assert sum(int(v) for v in models.values()) == int(labels["gpuscope.io/gpu.count"])
    assert len(models) == 2
    # The L40S (Ada, 46068 MiB) bounds what a pod can rely on, whichever GPU it gets.
    assert labels["gpuscope.io/gpu.memory"] == "46068"
    assert labels["gpuscope.io/gpu.family"] == "ada-lovelace"
    assert labels["gpuscope.io/gpu.mig.capable"] == "false"  # the L40S have no MIG


def test_mig_node_reports_mixed_mode(inprocess) -> None:
    labels = gpu_labels(snapshot(inprocess("hgx-a100-mig")))
    assert labels["gpuscope.io/gpu.mig.capable"] == "true"
    assert labels["gpuscope.io/gpu.mig.mode"] == "mixed"


def test_healthy_count_follows_lost_gpus_row_remaps_and_critical_xids(inprocess) -> None:
    h = inprocess("dgx-h100")
    assert gpu_labels(snapshot(h))["gpuscope.io/gpu.healthy"] == "8"
    h.fake.lose_gpu(1)
    h.fake.set_remapped_rows(2, correctable=0, uncorrectable=1, pending=True, failure=False)
    h.fake.inject_xid(3, 31)  # an application fault: not critical
    h.fake.inject_xid(4, 79)  # fallen off the bus: critical
    from tests.support import wait_for

    wait_for(lambda: 79 in nvidia(snapshot(h).gpus[4]).xid_errors, what="XID 79 counted")
    labels = gpu_labels(snapshot(h))
    assert labels["gpuscope.io/gpu.healthy"] == "5"
    assert labels["gpuscope.io/gpu.count"] == "8"


ADVERSARIAL = [
    "NVIDIA H100 80GB HBM3",
    "NVIDIA GeForce RTX 4090 (Founders Edition) / überclocked™",
    "  leading and trailing  ",
    "-_.weird edges._-",
    'quotes"and\nnewlines\tand/slashes',
    "A" * 200,
    "B" * 200,
    "日本語のみ",
    "",
]


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_any_product_name_becomes_a_valid_label_value(name: str) -> None:
    value = label_value(name)
    assert is_valid_value(value), value
    assert label_value(name) == value  # deterministic
    assert len(label_value(name, 53)) <= 53


def test_long_names_keep_a_readable_prefix_and_do_not_collide() -> None:
    a, b = label_value("A" * 200), label_value("A" * 199 + "B")
    assert a != b and a.startswith("AAAA") and len(a) == 63
    assert label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"


def test_adversarial_product_on_a_mixed_node_gives_valid_keys(inprocess) -> None:
    snap = snapshot(inprocess("mixed"))
    gpus = tuple(
        replace(g, identity=replace(g.identity, model=ADVERSARIAL[i % len(ADVERSARIAL)] or "x"))
        for i, g in enumerate(snap.gpus)
    )
    check(gpu_labels(replace(snap, gpus=gpus)))


def test_no_gpus_means_present_false() -> None:
    assert gpu_labels(None) == {"gpuscope.io/gpu.present": "false"}


def test_gpuscope_labels_prints_json_without_an_api_server(fake_lib, tmp_path: Path) -> None:
    fake = FakeNvml("dgx-h100", tmp_path / "state", now=1_767_225_600.0)
    result = subprocess.run(
        [*GPUSCOPE, "labels", "--output", "json", "--label-prefix", "example.com"],
        cwd=REPO, env=os.environ | fake.env(), capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    labels = json.loads(result.stdout)["labels"]
    assert labels["example.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["example.com/gpu.count"] == "8"


def test_nic_affinity_and_rdma_on_the_dgx_sysfs_tree(fake_lib, tmp_path: Path) -> None:
    sysfs = write_tree(tmp_path / "sys")
    fake = FakeNvml("dgx-h100", tmp_path / "state", now=1_767_225_600.0)
    result = subprocess.run(
        [*GPUSCOPE, "labels", "--output", "json", "--sysfs", str(sysfs)],
        cwd=REPO, env=os.environ | fake.env(), capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    labels = json.loads(result.stdout)["labels"]
    assert labels["gpuscope.io/rdma.present"] == "true"
    assert labels["gpuscope.io/gpu.nic-affinity"] == "pix"  # a ConnectX-7 per GPU switch


def test_gpuscope_labels_table_and_no_driver(tmp_path: Path) -> None:
    env = os.environ | {"LD_LIBRARY_PATH": "/nonexistent"}
    env.pop("FAKENVML_STATE", None)
    result = subprocess.run(
        [*GPUSCOPE, "labels", "--sysfs", str(tmp_path)], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0
    assert result.stdout.split() == ["gpuscope.io/gpu.present", "false"]
    assert "no GPUs readable: NVML library libnvidia-ml.so.1 not found" in result.stderr


@pytest.mark.parametrize(
    ("profile", "interconnect"),
    [("dgx-h100", "nvswitch"), ("hgx-nvlink-bridge", "nvlink"), ("pcie-l40s", "pcie"),
     ("gb200-nvl", "nvswitch")],
)  # fmt: skip
def test_interconnect_from_the_far_ends_of_the_nvlinks(
    inprocess, profile: str, interconnect: str
) -> None:
    h = inprocess(profile)
    assert gpu_labels(snapshot(h))["gpuscope.io/gpu.interconnect"] == interconnect
    assert dict(h.gpu.nvml.errors) == {}  # every topology call made correctly


def test_multi_node_nvlink_fabric_gives_domain_and_clique(inprocess) -> None:
    labels = gpu_labels(snapshot(inprocess("gb200-nvl")))
    domain = labels["gpuscope.io/nvlink.domain"]
    assert labels["gpuscope.io/nvlink.clique"] == f"{domain}.7"


def test_no_fabric_no_domain_labels(inprocess) -> None:
    assert "gpuscope.io/nvlink.domain" not in gpu_labels(snapshot(inprocess("dgx-h100")))


def test_topology_annotation_matrices(inprocess, tmp_path: Path) -> None:
    from gpuscope.agent.net.placement import network_placement
    from gpuscope.exporters.labels.gpu import topology_annotation

    h = inprocess("dgx-h100")
    snap = snapshot(h)
    sysfs = write_tree(tmp_path / "sys")
    doc_text = topology_annotation(snap, network_placement(sysfs, snap.pci_bus_ids))
    assert len(doc_text.encode()) < 16 * 1024
    doc = json.loads(doc_text)
    assert doc["v"] == 1 and len(doc["gpus"]) == 8
    matrix = doc["gpu_gpu"]
    assert all(matrix[i][i] == "x" for i in range(8))
    assert {matrix[i][j] for i in range(8) for j in range(8) if i != j} == {"nv18"}
    assert sum(p["links"] for p in doc["gpus"][0]["nvlink"]) == 18
    # The ConnectX-7 sharing GPU i's PCIe switch is "pix" to it; GPUs on the other socket "sys".
    rdma_rows = [row for nic, row in zip(doc["nics"], doc["gpu_nic"], strict=True) if nic["rdma"]]
    assert sum(row.count("pix") for row in rdma_rows) == 8
    assert doc_text == topology_annotation(
        snap, network_placement(sysfs, snap.pci_bus_ids)
    )  # stable


def test_pcie_only_node_matrix_uses_pcie_levels(inprocess) -> None:
    from gpuscope.exporters.labels.gpu import topology_annotation

    doc = json.loads(topology_annotation(snapshot(inprocess("pcie-l40s"))))
    assert doc["gpu_gpu"][0] == ["x", "node", "sys", "sys"]
    assert "gpu_nic" not in doc


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("mi300x", {"gpu.count": "8", "gpu.interconnect": "xgmi", "gpu.family": "cdna3",
                    "gpu.memory": "196608", "gpu.partition.compute": "spx"}),
        ("mi300x-cpx", {"gpu.count": "8", "gpu.interconnect": "xgmi",
                        "gpu.partition.compute": "cpx", "gpu.partition.memory": "nps4"}),
        ("mi250x", {"gpu.count": "8", "gpu.family": "cdna2", "gpu.memory": "65536"}),
    ],
)  # fmt: skip
def test_gpuscope_labels_on_an_amd_node(
    tmp_path: Path, profile: str, expected: dict[str, str]
) -> None:
    """The same keys as on NVIDIA nodes: a scheduler selects on gpu.vendor, gpu.memory and
    gpu.interconnect whichever vendor's GPUs a node has."""
    from tests.doubles.fakeamdsmi import control

    profile = control.run_profile(profile)
    if reason := control.unreadable_reason(profile):
        pytest.skip(reason)
    fake = control.FakeAmdSmi(profile, tmp_path / "state", now=1_767_225_600.0)
    env = os.environ | fake.env() | {"LD_LIBRARY_PATH": "/nonexistent"}
    env.pop("FAKENVML_STATE", None)
    result = subprocess.run(
        [*GPUSCOPE, "labels", "--output", "json", "--sysfs", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    labels = {k.removeprefix("gpuscope.io/"): v for k, v in doc["labels"].items()}
    assert labels["gpu.present"] == "true" and labels["gpu.vendor"] == "amd"
    assert {k: labels.get(k) for k in expected} == expected
    topology = json.loads(doc["annotations"]["gpuscope.io/topology"])
    assert len(topology["gpus"]) == 8

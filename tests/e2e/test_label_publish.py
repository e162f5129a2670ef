"""The real agent publishes labels: it labels its Node through the API server double and
reacts to a lost GPU, keeps them when restarted before the driver is loaded, writes the NFD
features file, and `gpuscope labels --remove` cleans the Node for an uninstall."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.doubles.kube_apiserver import KubeApiServer
from tests.doubles.make_sysfs import write_tree
from tests.support import GPUSCOPE, REPO, wait_for
from tests.support.labels import FOREIGN, P, annotations_of, labels_of

pytestmark = pytest.mark.e2e


def test_the_agent_labels_its_node_and_reacts_to_a_lost_gpu(
    agent_process, fake_lib, tmp_path: Path
) -> None:
    fake = FakeNvml("dgx-h100", tmp_path / "state")
    with KubeApiServer() as server:
        server.add_node("gpu-node-1", labels=FOREIGN)
        env = fake.env() | {"KUBECONFIG": str(server.kubeconfig(tmp_path / "kubeconfig"))}
        agent_process(
            "--collectors", "gpu", "--node-name", "gpu-node-1", "--labels-interval", "3600",
            env=env,
        )  # fmt: skip
        wait_for(lambda: labels_of(server).get(f"{P}gpu.healthy") == "8", 10, "node labeled")
        assert labels_of(server)["kubernetes.io/hostname"] == "gpu-node-1"
        assert f"{P}topology" in annotations_of(server)
        fake.lose_gpu(3)  # long before the next hourly recompute
        wait_for(lambda: labels_of(server).get(f"{P}gpu.healthy") == "7", 10, "GPU loss seen")


def test_restarted_before_the_driver_the_agent_keeps_the_labels_until_it_loads(
    agent_process, fake_lib, tmp_path: Path
) -> None:
    fake = FakeNvml("dgx-h100", tmp_path / "state")
    with KubeApiServer() as server:
        server.add_node("gpu-node-1", labels=FOREIGN)
        env = fake.env() | {"KUBECONFIG": str(server.kubeconfig(tmp_path / "kubeconfig"))}
        args = ("--collectors", "gpu", "--node-name", "gpu-node-1", "--labels-interval", "1",
                "--sysfs", str(write_tree(tmp_path / "sys")))  # fmt: skip
        first = agent_process(*args, env=env)
        wait_for(lambda: labels_of(server).get(f"{P}gpu.healthy") == "8", 10, "node labeled")
        published = labels_of(server)
        assert len([k for k in published if k.startswith(P)]) == 20
        first.stop()

        later = tmp_path / "driver-loaded-later.state"  # absent: NVML says driver not loaded
        second = agent_process(*args, env=env | {"FAKENVML_STATE": str(later)})
        wait_for(lambda: labels_of(server).get(f"{P}gpu.healthy") == "0", 10, "healthy 0")
        assert labels_of(server) == {**published, f"{P}gpu.healthy": "0"}
        held = "holding the 20 node labels last published"
        wait_for(lambda: held in second.logs(), 10, "the hold logged")

        shutil.copy(fake.state_path, tmp_path / "copy.state")
        os.replace(tmp_path / "copy.state", later)  # the driver loads: the next try, in 10 s
        wait_for(lambda: labels_of(server) == published, 30, "labels back to healthy 8")
        wait_for(lambda: "GPUs readable again" in second.logs(), 10, "the recovery logged")
        assert second.logs().count(held) == 1
        assert "422" not in second.logs()


def test_the_agent_writes_the_features_file(agent_process, fake_lib, tmp_path: Path) -> None:
    fake = FakeNvml("pcie-l40s", tmp_path / "state")
    directory = tmp_path / "features.d"
    agent_process(
        "--collectors", "gpu", "--labels-mode", "file", "--labels-dir", str(directory),
        env=fake.env(),
    )  # fmt: skip
    wait_for(lambda: (directory / "gpuscope").exists(), 10, "features file")
    assert f"{P}gpu.product=NVIDIA-L40S" in (directory / "gpuscope").read_text()


def test_labels_remove_cleans_the_node_for_uninstall(tmp_path: Path) -> None:
    with KubeApiServer() as server:
        server.add_node(
            "gpu-node-1",
            labels={**FOREIGN, f"{P}gpu.count": "8"},
            annotations={f"{P}owned-labels": f"{P}gpu.count", "team": "ml"},
        )
        env = os.environ | {"KUBECONFIG": str(server.kubeconfig(tmp_path / "kubeconfig"))}
        result = subprocess.run(
            [*GPUSCOPE, "labels", "--remove", "--node-name", "gpu-node-1"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert labels_of(server) == FOREIGN
        assert annotations_of(server) == {"team": "ml"}

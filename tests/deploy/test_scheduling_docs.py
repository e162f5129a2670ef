"""docs/scheduling.md stays true: every YAML example parses as Kubernetes objects, every
`gpuscope.io/` key it names is one the agent emits (computed here from the fake GPU profiles),
the values it selects on are values the agent produces, and the pasted `gpuscope labels`
output is what the command prints today."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscope.agent.accelerators.records import AcceleratorSnapshot
from gpuscope.agent.amd.device import FAMILIES as AMD_FAMILIES
from gpuscope.agent.net.placement import NetworkPlacement
from gpuscope.agent.pci import LEVELS
from gpuscope.exporters.labels.gpu import gpu_labels
from gpuscope.exporters.labels.nvidia import FAMILIES
from gpuscope.exporters.labels.publish import OWNED
from tests.doubles.fakenvml.control import FakeNvml
from tests.doubles.make_sysfs import write_tree
from tests.support import GPUSCOPE, REPO

DOC = REPO / "docs" / "scheduling.md"
AMD_PROFILES = ("mi300x", "mi300x-cpx", "mi250x")
PROFILES = sorted(
    p.stem for p in (REPO / "tests" / "doubles" / "fakenvml" / "profiles").glob("*.json")
)
PREFIX = "gpuscope.io/"
KEY_RE = re.compile(r"gpuscope\.io/[A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9]")


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", DOC.read_text(), re.M | re.S)


def yaml_documents() -> list[dict[str, Any]]:
    return [d for block in blocks("yaml") for d in yaml.safe_load_all(block) if d is not None]


def walk(value: Any) -> Iterator[dict[str, Any]]:
    """Every mapping in a parsed document, depth first."""
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk(v)


@pytest.fixture(scope="module")
def emitted() -> dict[str, set[str]]:
    """label key -> values, over every fake profile (filled by the first test that asks)."""
    return {}


@pytest.fixture
def agent_labels(inprocess, amd_inprocess, emitted: dict[str, set[str]]) -> dict[str, set[str]]:
    if not emitted:
        snapshots = []
        for profile in PROFILES:
            h = inprocess(profile)
            snapshots.append(h.gpu.read())
            h.agent.stop()  # one NVML at a time: the next profile re-initializes it
        for profile in AMD_PROFILES:
            a = amd_inprocess(profile)
            snapshots.append(a.amd.read())
            a.agent.stop()
        for snapshot in snapshots:
            assert isinstance(snapshot, AcceleratorSnapshot)
            for network in (None, NetworkPlacement(rdma_present=True, nic_affinity="pix")):
                for key, value in gpu_labels(snapshot, PREFIX, network=network).items():
                    emitted.setdefault(key, set()).add(value)
        for key, value in gpu_labels(None, PREFIX).items():
            emitted.setdefault(key, set()).add(value)
    return emitted


def test_the_doc_has_yaml_examples() -> None:
    assert len(blocks("yaml")) >= 6
    kinds = {d["kind"] for d in yaml_documents()}
    assert {"Pod", "Deployment", "Job", "Topology", "ResourceFlavor", "ConfigMap"} <= kinds


def test_every_yaml_block_parses_into_kubernetes_objects() -> None:
    for block in blocks("yaml"):
        docs = [d for d in yaml.safe_load_all(block) if d is not None]
        assert docs, f"empty yaml block:\n{block}"
        for doc in docs:
            assert isinstance(doc, dict), doc
            assert re.fullmatch(r"([a-z0-9.-]+/)?v\d+((alpha|beta)\d+)?", doc.get("apiVersion", ""))
            assert doc.get("kind", "")[:1].isupper(), doc
            assert doc["metadata"].get("name") or doc["metadata"].get("generateName")


def test_embedded_configuration_files_parse() -> None:
    """The Volcano controller's configuration is YAML inside a ConfigMap: parse that too."""
    configmaps = [d for d in yaml_documents() if d["kind"] == "ConfigMap"]
    assert configmaps
    for cm in configmaps:
        for name, text in cm["data"].items():
            if name.endswith((".conf", ".yaml", ".yml")):
                assert isinstance(yaml.safe_load(text), dict), name


def test_every_gpuscope_key_in_the_examples_is_one_the_agent_emits(
    agent_labels: dict[str, set[str]],
) -> None:
    # Keys the docs may name: every label some profile produced, any gpu.model.<product>
    # (the family only mixed nodes carry), and the two annotations.
    annotations = {f"{PREFIX}topology", f"{PREFIX}{OWNED}"}
    referenced = {key for block in blocks("yaml") for key in KEY_RE.findall(block)}
    assert referenced, "the examples use no gpuscope.io/ labels at all"
    unknown = {
        key
        for key in referenced
        if key not in agent_labels
        and key not in annotations
        and not key.startswith(f"{PREFIX}gpu.model.")
    }
    assert not unknown, f"docs/scheduling.md uses keys the agent never emits: {sorted(unknown)}"
    # The keys the brief for this page promised to show.
    for key in ("gpu.memory", "gpu.family", "gpu.product", "nvlink.domain", "gpu.nic-affinity"):
        assert f"{PREFIX}{key}" in referenced


def _selectors(doc: dict[str, Any]) -> Iterator[tuple[str, str, list[str]]]:
    """(key, operator, values) of every node selector requirement and flavor nodeLabel."""
    for mapping in walk(doc):
        if "key" in mapping and "operator" in mapping:
            yield mapping["key"], mapping["operator"], [str(v) for v in mapping.get("values", [])]
    if doc["kind"] == "ResourceFlavor":
        for key, value in doc["spec"].get("nodeLabels", {}).items():
            yield key, "In", [str(value)]


def test_selected_values_are_values_the_agent_produces(
    agent_labels: dict[str, set[str]],
) -> None:
    families = {name for _, name in FAMILIES} | set(AMD_FAMILIES.values())
    affinities = {*LEVELS, "none"}
    checked = 0
    for doc in yaml_documents():
        for key, operator, values in _selectors(doc):
            if not key.startswith(PREFIX):
                continue
            checked += 1
            if operator in ("Gt", "Lt"):
                assert len(values) == 1 and values[0].isdigit(), (key, values)
            elif operator in ("Exists", "DoesNotExist"):
                assert not values, (key, values)
            elif key == f"{PREFIX}gpu.family":
                assert set(values) <= families, values
            elif key == f"{PREFIX}gpu.nic-affinity":
                assert set(values) <= affinities, values
            else:  # products, interconnects, booleans: what some fake node really has
                assert set(values) <= agent_labels[key], (key, values, agent_labels[key])
    assert checked >= 8


def test_kueue_flavors_and_topology_fit_together() -> None:
    docs = yaml_documents()
    topologies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Topology"}
    flavors = [d for d in docs if d["kind"] == "ResourceFlavor"]
    by_name = {f["metadata"]["name"]: f["spec"]["nodeLabels"] for f in flavors}
    assert len(by_name) == len(flavors)
    for flavor in flavors:
        name = flavor["spec"].get("topologyName")
        if name:
            levels = [level["nodeLabel"] for level in topologies[name]["spec"]["levels"]]
            assert levels[-1] == "kubernetes.io/hostname" and f"{PREFIX}nvlink.domain" in levels
    queues = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterQueue"}
    flavor_names = {f["metadata"]["name"] for f in flavors}
    for cq in (d for d in docs if d["kind"] == "ClusterQueue"):
        for group in cq["spec"]["resourceGroups"]:
            names = [f["name"] for f in group["flavors"]]
            assert set(names) <= flavor_names
            # The flavors of one group select disjoint nodes: some label differs.
            for i, a in enumerate(names):
                for b in names[i + 1 :]:
                    la, lb = by_name[a], by_name[b]
                    assert any(k in lb and lb[k] != v for k, v in la.items()), (a, b)
    for lq in (d for d in docs if d["kind"] == "LocalQueue"):
        assert lq["spec"]["clusterQueue"] in queues


def test_volcano_tiers_match_the_table() -> None:
    (cm,) = [d for d in yaml_documents() if d["kind"] == "ConfigMap"]
    conf = yaml.safe_load(cm["data"]["volcano-controller.conf"])
    (source,) = conf["networkTopologyDiscovery"]
    assert source["source"] == "label" and source["enabled"] is True
    ((name, levels),) = source["config"]["networkTopologyTypes"].items()
    assert len(name) <= 20
    labels = [level["nodeLabel"] for level in levels]
    assert labels[-1] == "kubernetes.io/hostname"
    # Tier N is the N-th label counted upwards from just above the hostname.
    tiers = {tier: label for tier, label in enumerate(reversed(labels[:-1]), start=1)}
    text = DOC.read_text()
    for tier, label in tiers.items():
        assert f"| {tier} | `{label}` |" in text


def test_pasted_labels_output_is_what_gpuscope_prints(fake_lib: Path, tmp_path: Path) -> None:
    (pasted,) = [b for b in blocks("text") if b.startswith("$ gpuscope labels")]
    command, _, expected = pasted.partition("\n")
    sysfs = write_tree(tmp_path / "dsys")
    fake = FakeNvml("dgx-h100", tmp_path / "d.state")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")} | fake.env()
    args = command.split()[2:]  # after "$ gpuscope"
    args[args.index("--sysfs") + 1] = str(sysfs)
    result = subprocess.run(
        [*GPUSCOPE, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected, (
        "docs/scheduling.md's `gpuscope labels` output is stale: paste the command's output"
    )

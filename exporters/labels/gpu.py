"""GPU node labels (prefix `gpuscope.io/` by default), from a `GpuSnapshot`.

What a scheduler can select on: presence and count, product (with per-model counts on
mixed nodes instead of a value that flaps between models), memory in MiB as an integer so
`Gt`/`Lt` node affinity works, family and compute capability, driver and CUDA versions, MIG
capability and mode, NVLink links, NUMA span, and how many GPUs are healthy enough to place
work on. On a mixed node every numeric capability is the minimum across GPUs: a pod that
requires `gpu.memory Gt 40000` must fit on whichever GPU it gets.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence

from gpuscope.agent.bounded import HASH_LENGTH
from gpuscope.agent.gpu import xid_catalog
from gpuscope.agent.gpu.records import GpuReading, GpuSnapshot, GpuTopology
from gpuscope.agent.net.placement import NetworkPlacement
from gpuscope.exporters.labels.validation import validate
from gpuscope.exporters.labels.values import MAX_LENGTH, label_value

MIB = 1024 * 1024

# XIDs that mean the GPU needs attention before it runs more work: the one list that the
# GPUXidCritical alert and the dashboards are generated from (agent/gpu/xid_catalog.py).
CRITICAL_XIDS = xid_catalog.CRITICAL_XIDS

FAMILIES: tuple[tuple[tuple[int, int], str], ...] = (
    ((12, 0), "blackwell"),
    ((10, 0), "blackwell"),
    ((9, 0), "hopper"),
    ((8, 9), "ada-lovelace"),
    ((8, 0), "ampere"),
    ((7, 5), "turing"),
    ((7, 0), "volta"),
    ((6, 0), "pascal"),
    ((5, 0), "maxwell"),
    ((3, 0), "kepler"),
)


def family(major: int, minor: int) -> str:
    for (fmajor, fminor), name in FAMILIES:
        if (major, minor) >= (fmajor, fminor):
            return name
    return "unknown"


def healthy(reading: GpuReading) -> bool:
    """Up, no row remap pending or failed, no critical XID since the agent started."""
    return (
        reading.up
        and not reading.row_remap_pending
        and not reading.row_remap_failure
        and not any(xid in CRITICAL_XIDS for xid in reading.xid_errors)
    )


def _version(text: str) -> tuple[str, str] | None:
    parts = text.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return str(int(parts[0])), str(int(parts[1]))


def gpu_labels(
    snapshot: GpuSnapshot | None,
    prefix: str = "gpuscope.io/",
    *,
    network: NetworkPlacement | None = None,
) -> dict[str, str]:
    """The label set; `snapshot` None (no NVML) gives `gpu.present=false` alone.

    Each label group is one function below that adds to `labels` in place: no dict per
    group, and the keys keep the insertion order they had before the split.
    """
    p = prefix
    net = _network_labels(snapshot, p, network)
    if snapshot is None or not snapshot.gpus:
        return {f"{p}gpu.present": "false", **net}
    gpus = snapshot.gpus
    known = [g for g in gpus if g.identity.model]
    labels: dict[str, str] = {
        f"{p}gpu.present": "true",
        f"{p}gpu.count": str(len(gpus)),
        f"{p}gpu.healthy": str(sum(1 for g in gpus if healthy(g))),
    }
    _add_models(labels, p, known)
    _add_capabilities(labels, p, gpus, known)
    _add_versions(labels, p, snapshot)
    _add_mig(labels, p, gpus)
    _add_links(labels, p, gpus)
    _add_interconnect(labels, p, snapshot)
    labels.update(net)
    return labels


def _network_labels(
    snapshot: GpuSnapshot | None, p: str, network: NetworkPlacement | None
) -> dict[str, str]:
    """RDMA presence, and NIC affinity only where there are GPUs for it to describe."""
    net: dict[str, str] = {}
    if network is not None:
        net[f"{p}rdma.present"] = "true" if network.rdma_present else "false"
        if snapshot is not None and snapshot.gpus:
            net[f"{p}gpu.nic-affinity"] = network.nic_affinity
    return net


def _add_models(labels: dict[str, str], p: str, known: Sequence[GpuReading]) -> None:
    """`gpu.product`; on a mixed node `mixed` plus a count per model, so the value does not
    flap between models from one publication to the next."""
    models = Counter(g.identity.model for g in known)
    if len(models) == 1:
        labels[f"{p}gpu.product"] = label_value(next(iter(models)))
    elif len(models) > 1:
        labels[f"{p}gpu.product"] = "mixed"
        per_key = Counter({model_key_name(model): 0 for model in sorted(models)})
        for model, count in models.items():
            per_key[model_key_name(model)] += count  # two names that sanitize alike add up
        for name, count in per_key.items():
            labels[f"{p}{name}"] = str(count)


MODEL_KEY = "gpu.model."


def model_key_name(model: str) -> str:
    """The name part `gpu.model.<product>` for a product name, valid whatever NVML says: a
    name with no character a label can hold (or one too long) still gets a non-empty,
    stable segment, so the key never ends in `.`."""
    segment = label_value(model, MAX_LENGTH - len(MODEL_KEY))
    if not segment:
        digest = hashlib.sha256(model.encode(errors="surrogatepass")).hexdigest()
        segment = f"unknown-{digest[:HASH_LENGTH]}"
    return MODEL_KEY + segment


def _add_capabilities(
    labels: dict[str, str], p: str, gpus: Sequence[GpuReading], known: Sequence[GpuReading]
) -> None:
    """Memory (MiB) and compute capability, each the minimum across GPUs: a pod that
    selects on them must fit whichever GPU it gets."""
    memories = [g.memory_total_bytes for g in gpus if g.memory_total_bytes]
    if memories:
        labels[f"{p}gpu.memory"] = str(min(memories) // MIB)

    capabilities = sorted(
        (int(major), int(minor))
        for g in known
        if g.identity.compute_capability
        for major, _, minor in [g.identity.compute_capability.partition(".")]
        if major.isdigit() and minor.isdigit()
    )
    if capabilities:
        major, minor = capabilities[0]
        labels[f"{p}gpu.family"] = family(major, minor)
        labels[f"{p}gpu.compute.major"] = str(major)
        labels[f"{p}gpu.compute.minor"] = str(minor)


def _add_versions(labels: dict[str, str], p: str, snapshot: GpuSnapshot) -> None:
    """Driver and CUDA versions as separate major/minor integers, so `Gt`/`Lt` work on them;
    a version that does not parse is left out."""
    for name, text in (("gpu.driver", snapshot.driver_version),
                       ("cuda.driver", snapshot.cuda_driver_version)):  # fmt: skip
        version = _version(text)
        if version:
            labels[f"{p}{name}.major"], labels[f"{p}{name}.minor"] = version


def _add_mig(labels: dict[str, str], p: str, gpus: Sequence[GpuReading]) -> None:
    """MIG capability (every GPU: a pod may land on any of them) and the mode, `mixed`
    when the GPUs disagree."""
    modes = [g.mig_mode for g in gpus if g.mig_mode is not None]
    capable = len(modes) == len(gpus)
    labels[f"{p}gpu.mig.capable"] = "true" if capable else "false"
    if modes:
        distinct = set(modes)
        labels[f"{p}gpu.mig.mode"] = distinct.pop() if len(distinct) == 1 else "mixed"


def _add_links(labels: dict[str, str], p: str, gpus: Sequence[GpuReading]) -> None:
    """Active NVLinks (the minimum over GPUs that are up) and how many NUMA nodes the GPUs
    span."""
    links = [sum(1 for link in g.nvlinks if link.up) for g in gpus if g.up]
    if links:  # no GPU up: unknown, not 0 (a held label keeps its last value)
        labels[f"{p}gpu.nvlink.links"] = str(min(links))
    numa = {g.identity.numa_node for g in gpus if g.identity.numa_node is not None}
    if numa:
        labels[f"{p}gpu.numa-nodes"] = str(len(numa))


def _add_interconnect(labels: dict[str, str], p: str, snapshot: GpuSnapshot) -> None:
    """How the GPUs are joined (nvswitch, nvlink or pcie), and the NVLink domain and clique
    only when every GPU's fabric registration completed, without error, into one and the
    same clique."""
    peers = snapshot.topology.nvlink_peers
    kinds = {peer.kind for ps in peers.values() for peer in ps}
    labels[f"{p}gpu.interconnect"] = (
        "nvswitch" if "switch" in kinds else "nvlink" if "gpu" in kinds else "pcie"
    )
    fabrics = list(snapshot.topology.fabric.values())
    registered = all(f.completed and f.cluster_uuid for f in fabrics)
    if fabrics and len(fabrics) == len(snapshot.gpus) and registered:
        domains = {f.cluster_uuid for f in fabrics}
        cliques = {f.clique_id for f in fabrics}
        if len(domains) == 1 and len(cliques) == 1:
            domain = domains.pop()
            labels[f"{p}nvlink.domain"] = label_value(domain)
            labels[f"{p}nvlink.clique"] = label_value(f"{domain}.{cliques.pop()}")


def gpu_pair_relation(topology: GpuTopology, bus_ids: Mapping[int, str], i: int, j: int) -> str:
    """nvidia-smi topo -m's cell for GPUs i and j: nv<N> when NVLink joins them, else PCIe."""
    if i == j:
        return "x"
    pi, pj = topology.nvlink_peers.get(i, ()), topology.nvlink_peers.get(j, ())
    direct = sum(p.links for p in pi if p.kind == "gpu" and p.pci_bus_id == bus_ids.get(j))
    if direct:
        return f"nv{direct}"
    if any(p.kind == "switch" for p in pi) and any(p.kind == "switch" for p in pj):
        return f"nv{min(sum(p.links for p in pi), sum(p.links for p in pj))}"
    return topology.pcie.get((min(i, j), max(i, j)), "sys")


ANNOTATION_VERSION = 1


def topology_annotation(
    snapshot: GpuSnapshot | None, network: NetworkPlacement | None = None
) -> str:
    """`gpuscope.io/topology`: compact, key-sorted JSON (version 1) with, per GPU, its index,
    UUID, PCI bus id, NUMA node and NVLink peers; the GPU x GPU matrix in `nvidia-smi topo
    -m` terms (nv<N>, pix, pxb, phb, node, sys); and the GPU x NIC matrix."""
    if snapshot is None or not snapshot.gpus:
        return json.dumps({"v": ANNOTATION_VERSION, "gpus": []}, separators=(",", ":"))
    topo = snapshot.topology
    indices = [g.identity.index for g in snapshot.gpus]
    bus = {g.identity.index: g.identity.pci_bus_id for g in snapshot.gpus}
    doc: dict[str, object] = {
        "v": ANNOTATION_VERSION,
        "gpus": [
            {
                "i": g.identity.index,
                "uuid": g.identity.uuid,
                "pci": g.identity.pci_bus_id,
                "numa": g.identity.numa_node,
                "nvlink": [
                    {"to": p.kind, "pci": p.pci_bus_id, "links": p.links}
                    for p in topo.nvlink_peers.get(g.identity.index, ())
                ],
            }
            for g in snapshot.gpus
        ],
        "gpu_gpu": [[gpu_pair_relation(topo, bus, i, j) for j in indices] for i in indices],
    }
    if network is not None:
        doc["nics"] = [{"name": n, "rdma": r} for n, r, _ in network.gpu_nic]
        doc["gpu_nic"] = [list(rel) for _, _, rel in network.gpu_nic]
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def check(labels: Mapping[str, str]) -> None:
    """Raise if any key or value is not a valid Kubernetes label (a bug, not bad input)."""
    dropped = validate(labels, {}).dropped
    if dropped:
        key, why = next(iter(dropped.items()))
        raise ValueError(f"invalid label {key}={labels[key]!r}: {why}")

"""NVIDIA's part of the node labels: what only NVML tells (compute capability and family, the
CUDA driver, MIG, NVLink links, NVSwitch and the multi-node NVLink domain, XID health) and
the topology annotation in `nvidia-smi topo -m` terms.

exporters/labels/gpu.py computes the labels every vendor shares and asks this module, by
the snapshot's vendor (`VENDOR_LABELS` there), for the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuscope.agent.gpu import xid_catalog
from gpuscope.agent.gpu.records import GpuSnapshot, GpuTopology, NvidiaGpu, node, nvidia
from gpuscope.exporters.labels.values import label_value, version

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


class NvidiaLabels:
    """The `VendorLabels` of NVIDIA GPUs (exporters/labels/gpu.py)."""

    def healthy(self, reading: NvidiaGpu) -> bool:
        """No row remap pending or failed, no critical XID since the agent started."""
        x = nvidia(reading)
        return (
            not x.row_remap_pending
            and not x.row_remap_failure
            and not any(xid in CRITICAL_XIDS for xid in x.xid_errors)
        )

    def add(self, labels: dict[str, str], p: str, snapshot: GpuSnapshot) -> None:
        gpus = snapshot.gpus
        _add_compute(labels, p, [g for g in gpus if g.identity.model])
        cuda = version(node(snapshot).cuda_driver_version)
        if cuda:
            labels[f"{p}cuda.driver.major"], labels[f"{p}cuda.driver.minor"] = cuda
        _add_mig(labels, p, gpus)
        links = [sum(1 for link in g.links if link.up) for g in gpus if g.up]
        if links:  # no GPU up: unknown, not 0 (a held label keeps its last value)
            labels[f"{p}gpu.nvlink.links"] = str(min(links))
        _add_interconnect(labels, p, snapshot)

    def attributes(self, reading: NvidiaGpu) -> dict[str, str]:
        """NodeFeature per-GPU attributes beyond the contract's."""
        return {"compute_capability": nvidia(reading).compute_capability}

    def topology(
        self, snapshot: GpuSnapshot
    ) -> tuple[dict[int, dict[str, object]], list[list[str]]]:
        """For the topology annotation: each GPU's NVLink peers (by index), and the GPU x GPU
        matrix in `nvidia-smi topo -m` terms (nv<N>, pix, pxb, phb, node, sys)."""
        topo = node(snapshot).topology
        indices = [g.identity.index for g in snapshot.gpus]
        bus = {g.identity.index: g.identity.pci_bus_id for g in snapshot.gpus}
        per_gpu: dict[int, dict[str, object]] = {
            i: {
                "nvlink": [
                    {"to": p.kind, "pci": p.pci_bus_id, "links": p.links}
                    for p in topo.nvlink_peers.get(i, ())
                ]
            }
            for i in indices
        }
        matrix = [[gpu_pair_relation(topo, bus, i, j) for j in indices] for i in indices]
        return per_gpu, matrix


def _add_compute(labels: dict[str, str], p: str, known: Sequence[NvidiaGpu]) -> None:
    """Family and compute capability, the minimum across GPUs: a pod that selects on them
    must fit whichever GPU it gets."""
    capabilities = sorted(
        (int(major), int(minor))
        for g in known
        if (cc := nvidia(g).compute_capability)
        for major, _, minor in [cc.partition(".")]
        if major.isdigit() and minor.isdigit()
    )
    if capabilities:
        major, minor = capabilities[0]
        labels[f"{p}gpu.family"] = family(major, minor)
        labels[f"{p}gpu.compute.major"] = str(major)
        labels[f"{p}gpu.compute.minor"] = str(minor)


def _add_mig(labels: dict[str, str], p: str, gpus: Sequence[NvidiaGpu]) -> None:
    """MIG capability (every GPU: a pod may land on any of them) and the mode, `mixed`
    when the GPUs disagree."""
    modes = [m for g in gpus if (m := nvidia(g).mig_mode) is not None]
    capable = len(modes) == len(gpus)
    labels[f"{p}gpu.mig.capable"] = "true" if capable else "false"
    if modes:
        distinct = set(modes)
        labels[f"{p}gpu.mig.mode"] = distinct.pop() if len(distinct) == 1 else "mixed"


def _add_interconnect(labels: dict[str, str], p: str, snapshot: GpuSnapshot) -> None:
    """How the GPUs are joined (nvswitch, nvlink or pcie), and the NVLink domain and clique
    only when every GPU's fabric registration completed, without error, into one and the
    same clique."""
    topology = node(snapshot).topology
    kinds = {peer.kind for ps in topology.nvlink_peers.values() for peer in ps}
    labels[f"{p}gpu.interconnect"] = (
        "nvswitch" if "switch" in kinds else "nvlink" if "gpu" in kinds else "pcie"
    )
    fabrics = list(topology.fabric.values())
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


LABELS = NvidiaLabels()

"""AMD's part of the node labels: what only AMD SMI tells (the family from the gfx target,
the gfx target itself, compute and memory partition modes, XGMI links, retired-page
health) and the topology annotation with XGMI links.

exporters/labels/gpu.py computes the labels every vendor shares (gpu.vendor, count,
product, memory, health, NUMA) and asks this module, by the snapshot's vendor, for the
rest. `gpu.family` and `gpu.interconnect` have the same keys as NVIDIA's, so one node
affinity rule can select across vendors (docs/scheduling.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuscope.agent.amd.records import AmdGpu, AmdGpus, GpuLink, amd, node
from gpuscope.exporters.labels.values import label_value


class AmdLabels:
    """The `VendorLabels` of AMD GPUs (exporters/labels/gpu.py)."""

    def healthy(self, reading: AmdGpu) -> bool:
        """No retired page pending (the GPU wants a reset before its memory is whole) and
        no GPU reset since the agent started that did not complete."""
        x = amd(reading)
        events = x.events
        resets_open = events.get("gpu_pre_reset", 0) > events.get("gpu_post_reset", 0)
        return not x.bad_pages.get("pending") and not resets_open

    def add(self, labels: dict[str, str], p: str, snapshot: AmdGpus) -> None:
        gpus = snapshot.gpus
        known = [g for g in gpus if amd(g).gfx_target]
        if known:
            targets = sorted({amd(g).gfx_target for g in known})
            families = sorted({g.identity.architecture for g in known})
            labels[f"{p}gpu.family"] = families[0] if len(families) == 1 else "mixed"
            labels[f"{p}gpu.gfx-target"] = label_value(targets[0]) if len(targets) == 1 else "mixed"
        _add_partitions(labels, p, gpus)
        links = [sum(1 for link in g.links if link.up) for g in gpus if g.up and g.links]
        if links:  # no GPU up: unknown, not 0
            labels[f"{p}gpu.xgmi.links"] = str(min(links))
        labels[f"{p}gpu.interconnect"] = interconnect(snapshot)

    def attributes(self, reading: AmdGpu) -> dict[str, str]:
        """NodeFeature per-GPU attributes beyond the contract's."""
        x = amd(reading)
        found = {"gfx_target": x.gfx_target}
        if x.compute_partition:
            found["compute_partition"] = x.compute_partition
        return found

    def topology(self, snapshot: AmdGpus) -> tuple[dict[int, dict[str, object]], list[list[str]]]:
        """For the topology annotation: each GPU's XGMI links (up, down), and the GPU x GPU
        matrix: `xgmi` (a direct link), `xgmi-<hops>` (through other GPUs), `pcie`, or
        `unknown` where the library did not say."""
        links = node(snapshot).links
        indices = [g.identity.index for g in snapshot.gpus]
        per_gpu: dict[int, dict[str, object]] = {
            g.identity.index: {
                "xgmi": {
                    "up": sum(1 for link in g.links if link.up),
                    "down": sum(1 for link in g.links if link.up is False),
                }
            }
            for g in snapshot.gpus
            if g.links
        }
        matrix = [[_cell(links.get((i, j))) if i != j else "x" for j in indices] for i in indices]
        return per_gpu, matrix


def interconnect(snapshot: AmdGpus) -> str:
    """`xgmi` when every pair of GPUs has a direct XGMI link (an MI300X platform: all to
    all), `xgmi-partial` when some do (MI250X: the GCDs of a package and some packages),
    else `pcie`."""
    indices = [g.identity.index for g in snapshot.gpus]
    links = node(snapshot).links
    pairs = [(i, j) for i in indices for j in indices if i != j]
    direct = [
        (i, j) for i, j in pairs if (lk := links.get((i, j))) and lk.kind == "xgmi" and lk.hops == 1
    ]
    if pairs and len(direct) == len(pairs):
        return "xgmi"
    if direct or any(lk.kind == "xgmi" for lk in links.values()):
        return "xgmi-partial"
    return "pcie"


def _cell(link: GpuLink | None) -> str:
    if link is None:
        return "unknown"
    if link.kind == "xgmi":
        return "xgmi" if link.hops <= 1 else f"xgmi-{link.hops}"
    return link.kind


def _add_partitions(labels: dict[str, str], p: str, gpus: Sequence[AmdGpu]) -> None:
    """The compute and memory partition modes, `mixed` when the GPUs disagree (AMD's node
    labeller's compute-memory-partition, split so each can be selected on)."""
    for key, modes in (
        ("gpu.partition.compute", {amd(g).compute_partition for g in gpus}),
        ("gpu.partition.memory", {amd(g).memory_partition for g in gpus}),
    ):
        known = {m for m in modes if m}
        if known:
            labels[f"{p}{key}"] = known.pop().lower() if len(known) == 1 else "mixed"


LABELS = AmdLabels()

"""GPU node labels (prefix `gpuscope.io/` by default), from any vendor's accelerator records.

What a scheduler can select on: presence and count, product (with per-model counts on
mixed nodes instead of a value that flaps between models), memory in MiB as an integer so
`Gt`/`Lt` node affinity works, the driver version, NUMA span, and how many GPUs are healthy
enough to place work on; the vendor adds what only it knows (`VendorLabels`; NVIDIA's in
exporters/labels/nvidia.py: family and compute capability, CUDA version, MIG, NVLink;
AMD's in exporters/labels/amd.py: family and gfx target, partitions, XGMI), under the
same keys where the meaning is the same (gpu.family, gpu.interconnect). On a
mixed node every numeric capability is the minimum across GPUs: a pod that requires
`gpu.memory Gt 40000` must fit on whichever GPU it gets.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gpuscope.agent.bounded import HASH_LENGTH
from gpuscope.exporters.labels import amd, nvidia
from gpuscope.exporters.labels.validation import validate
from gpuscope.exporters.labels.values import MAX_LENGTH, label_value, version

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyAccelerators, AnyReading
    from gpuscope.agent.net.placement import NetworkPlacement

MIB = 1024 * 1024


class VendorLabels(Protocol):
    """What one vendor adds to the labels every vendor shares."""

    def healthy(self, reading: Any) -> bool:
        """Beyond answering: nothing the vendor knows makes the device unfit for work."""
        ...

    def add(self, labels: dict[str, str], p: str, snapshot: Any) -> None:
        """The vendor's own labels of a snapshot with devices."""
        ...

    def attributes(self, reading: Any) -> dict[str, str]:
        """The vendor's NodeFeature attributes of one device."""
        ...

    def topology(self, snapshot: Any) -> tuple[dict[int, dict[str, object]], list[list[str]]]:
        """Per device (by index), the vendor's link entries; the device x device matrix."""
        ...


# By the snapshot's `vendor`.
VENDOR_LABELS: Mapping[str, VendorLabels] = {"nvidia": nvidia.LABELS, "amd": amd.LABELS}


def vendor_labels(snapshot: AnyAccelerators) -> VendorLabels | None:
    return VENDOR_LABELS.get(snapshot.vendor)


def healthy(reading: AnyReading, vendor: VendorLabels | None = None) -> bool:
    """Up, and fit for work by what its vendor knows (NVIDIA: no row remap pending or
    failed, no critical XID since the agent started)."""
    return reading.up and (vendor is None or vendor.healthy(reading))


def gpu_labels(
    snapshot: AnyAccelerators | None,
    prefix: str = "gpuscope.io/",
    *,
    network: NetworkPlacement | None = None,
) -> dict[str, str]:
    """The label set; `snapshot` None (no library) gives `gpu.present=false` alone.

    The labels every vendor shares first, then the vendor's (`VendorLabels.add`), then the
    network's; each adds to `labels` in place, no dict per group. Nothing reads the order:
    publishers patch by key and `gpuscope labels` prints them sorted.
    """
    p = prefix
    net = _network_labels(snapshot, p, network)
    if snapshot is None or not snapshot.gpus:
        return {f"{p}gpu.present": "false", **net}
    gpus = snapshot.gpus
    vendor = vendor_labels(snapshot)
    labels: dict[str, str] = {
        f"{p}gpu.present": "true",
        f"{p}gpu.vendor": label_value(snapshot.vendor),
        f"{p}gpu.count": str(len(gpus)),
        f"{p}gpu.healthy": str(sum(1 for g in gpus if healthy(g, vendor))),
    }
    _add_models(labels, p, [g for g in gpus if g.identity.model])
    memories = [g.memory_total_bytes for g in gpus if g.memory_total_bytes]
    if memories:  # the minimum: a pod that selects on it must fit whichever GPU it gets
        labels[f"{p}gpu.memory"] = str(min(memories) // MIB)
    driver = version(snapshot.driver_version)
    if driver:  # major and minor apart, so Gt/Lt work; a version that does not parse: none
        labels[f"{p}gpu.driver.major"], labels[f"{p}gpu.driver.minor"] = driver
    numa = {g.identity.numa_node for g in gpus if g.identity.numa_node is not None}
    if numa:
        labels[f"{p}gpu.numa-nodes"] = str(len(numa))
    if vendor is not None:
        vendor.add(labels, p, snapshot)
    labels.update(net)
    return labels


def _network_labels(
    snapshot: AnyAccelerators | None, p: str, network: NetworkPlacement | None
) -> dict[str, str]:
    """RDMA presence, and NIC affinity only where there are GPUs for it to describe."""
    net: dict[str, str] = {}
    if network is not None:
        net[f"{p}rdma.present"] = "true" if network.rdma_present else "false"
        if snapshot is not None and snapshot.gpus:
            net[f"{p}gpu.nic-affinity"] = network.nic_affinity
    return net


def _add_models(labels: dict[str, str], p: str, known: Sequence[AnyReading]) -> None:
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


ANNOTATION_VERSION = 1


def topology_annotation(
    snapshot: AnyAccelerators | None, network: NetworkPlacement | None = None
) -> str:
    """`gpuscope.io/topology`: compact, key-sorted JSON (version 1) with, per GPU, its index,
    UUID, PCI bus id, NUMA node and the vendor's link entries (NVIDIA: NVLink peers); the GPU
    x GPU matrix in the vendor's terms (NVIDIA: `nvidia-smi topo -m`'s nv<N>, pix, pxb, phb,
    node, sys); and the GPU x NIC matrix."""
    if snapshot is None or not snapshot.gpus:
        return json.dumps({"v": ANNOTATION_VERSION, "gpus": []}, separators=(",", ":"))
    vendor = vendor_labels(snapshot)
    per_gpu, matrix = vendor.topology(snapshot) if vendor is not None else ({}, [])
    doc: dict[str, object] = {
        "v": ANNOTATION_VERSION,
        "gpus": [
            {
                "i": g.identity.index,
                "uuid": g.identity.uuid,
                "pci": g.identity.pci_bus_id,
                "numa": g.identity.numa_node,
                **per_gpu.get(g.identity.index, {}),
            }
            for g in snapshot.gpus
        ],
        "gpu_gpu": matrix,
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

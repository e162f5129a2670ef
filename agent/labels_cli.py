"""`gpuscope labels`: print the node labels the agent would publish, without an API server.

Users run it on a node to see what a scheduler will see. It starts the GPU source once,
reads every GPU, and prints a table (default) or JSON (`--output json`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from agent import logs
from agent.config import ConfigError, parse
from agent.gpu.device import sysfs_pci_address
from agent.gpu.records import GpuSnapshot
from agent.gpu.source import GpuConfig, GpuSource
from agent.net.nic import read_nics
from agent.pci import locate, nic_affinity, relationship
from agent.sources import SourceUnavailable
from exporters.labels.gpu import NetworkPlacement, check, gpu_labels, topology_annotation


def network_placement(sysfs: Path, snapshot: GpuSnapshot | None) -> NetworkPlacement | None:
    """RDMA NICs and their PCIe distance to the GPUs; None when sysfs has no network class."""
    try:
        nics = read_nics(sysfs).nics
    except SourceUnavailable:
        return None
    rdma = [locate(sysfs, n.pci_bus_id) for n in nics if n.rdma and n.pci_bus_id]
    gpus = [
        locate(sysfs, sysfs_pci_address(g.identity.pci_bus_id))
        for g in (snapshot.gpus if snapshot else ())
        if g.identity.pci_bus_id
    ]
    located = [(n, locate(sysfs, n.pci_bus_id)) for n in nics if n.pci_bus_id]
    gpu_nic = tuple(
        (n.device, n.rdma, tuple(relationship(g, where) if g else "" for g in gpus))
        for n, where in located
        if where is not None
    )
    return NetworkPlacement(
        rdma_present=bool(rdma),
        nic_affinity=nic_affinity(
            [g for g in gpus if g is not None], [n for n in rdma if n is not None]
        ),
        gpu_nic=gpu_nic,
    )


def labels_main(argv: Sequence[str]) -> int:
    args = list(argv)
    output, prefix = "table", "gpuscope.io/"
    for flag in ("--output", "--label-prefix"):
        while flag in args:
            i = args.index(flag)
            if i + 1 >= len(args):
                print(f"gpuscope labels: {flag} needs a value", file=sys.stderr)
                return 2
            if flag == "--output":
                output = args[i + 1]
            else:
                prefix = args[i + 1]
            del args[i : i + 2]
    if output not in ("table", "json"):
        print(f"gpuscope labels: --output: expected table or json, got {output!r}", file=sys.stderr)
        return 2
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    try:
        config = parse(["--collectors", "gpu", *args])
    except ConfigError as exc:
        print(f"gpuscope labels: {exc}", file=sys.stderr)
        return 2
    logs.setup(config.log_format, "warning")

    source = GpuSource(GpuConfig(sysfs=config.sysfs, background=False))
    snapshot: GpuSnapshot | None = None
    try:
        source.start()
        snapshot = source.collect()
    except SourceUnavailable as exc:
        print(f"gpuscope labels: no GPUs readable: {exc}", file=sys.stderr)
    finally:
        source.stop()

    placement = network_placement(config.sysfs, snapshot)
    labels = gpu_labels(snapshot, prefix, network=placement)
    check(labels)
    annotations = (
        {f"{prefix}topology": topology_annotation(snapshot, placement)}
        if snapshot is not None and snapshot.gpus
        else {}
    )
    if output == "json":
        print(json.dumps({"labels": labels, "annotations": annotations}, indent=2, sort_keys=True))
    else:
        width = max(len(k) for k in (*labels, *annotations))
        for key in sorted(labels):
            print(f"{key:<{width}}  {labels[key]}")
        for key, value in annotations.items():
            print(f"{key:<{width}}  {value}")
    return 0

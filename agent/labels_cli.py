"""`gpuscope labels`: print the node labels the agent would publish, without an API server.

Users run it on a node to see what a scheduler will see. It starts the GPU source once,
reads every GPU, and prints a table (default) or JSON (`--output json`).
`gpuscope labels --remove --node-name N` takes the agent's keys off Node N (uninstall).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from gpuscope.agent import logs
from gpuscope.agent.config import ConfigError, parse
from gpuscope.agent.gpu.collector import GPU
from gpuscope.agent.gpu.records import GpuSnapshot
from gpuscope.agent.gpu.source import GpuConfig, GpuSource
from gpuscope.agent.labels_options import label_prefix
from gpuscope.agent.placement import network_placement
from gpuscope.agent.sources import SourceUnavailable
from gpuscope.exporters.labels.gpu import gpu_labels, topology_annotation
from gpuscope.exporters.labels.validation import validate


def remove_from_node(node: str, prefix: str) -> int:
    """`gpuscope labels --remove`: take every key the agent owns off the Node (uninstall)."""
    from lightkube import Client

    from gpuscope.exporters.labels.publish import NodePublisher

    try:
        changed = NodePublisher(Client(), node, prefix).remove()
    except Exception as exc:  # noqa: BLE001 - API and config errors alike: one line
        print(
            f"gpuscope labels: {str(exc).splitlines()[0] if str(exc) else exc!r}", file=sys.stderr
        )
        return 1
    print(f"removed gpuscope's labels from node {node}" if changed else "nothing to remove")
    return 0


def labels_main(argv: Sequence[str]) -> int:
    args = list(argv)
    output, prefix = "table", "gpuscope.io/"
    remove = "--remove" in args
    if remove:
        args.remove("--remove")
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
    try:
        prefix = label_prefix("--label-prefix", prefix)
        config = parse(["--collectors", GPU.name, *args])
    except ConfigError as exc:
        print(f"gpuscope labels: {exc}", file=sys.stderr)
        return 2
    logs.setup(config.agent.log_format, "warning")
    if remove:
        return remove_from_node(config.agent.node_name, prefix)

    source = GpuSource(GpuConfig(sysfs=config.agent.sysfs, background=False))
    snapshot: GpuSnapshot | None = None
    try:
        source.start()
        snapshot = source.collect()
    except SourceUnavailable as exc:
        print(f"gpuscope labels: no GPUs readable: {exc}", file=sys.stderr)
    finally:
        source.stop()

    placement = network_placement(config.agent.sysfs, snapshot)
    annotations = (
        {f"{prefix}topology": topology_annotation(snapshot, placement)}
        if snapshot is not None and snapshot.gpus
        else {}
    )
    checked = validate(gpu_labels(snapshot, prefix, network=placement), annotations)
    for key, why in checked.dropped.items():
        print(f"gpuscope labels: left out {key}: {why}", file=sys.stderr)
    labels, annotations = checked.labels, checked.annotations
    if output == "json":
        print(json.dumps({"labels": labels, "annotations": annotations}, indent=2, sort_keys=True))
    else:
        width = max((len(k) for k in (*labels, *annotations)), default=0)
        for key in sorted(labels):
            print(f"{key:<{width}}  {labels[key]}")
        for key, value in annotations.items():
            print(f"{key:<{width}}  {value}")
    return 0

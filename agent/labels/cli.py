"""`gpuscope labels`: print the node labels the agent would publish, without an API server.

Users run it on a node to see what a scheduler will see. It starts the GPU source once,
reads every GPU, and prints a table (default) or JSON (`--output json`).
`gpuscope labels --remove --node-name N` takes the agent's keys off Node N (uninstall).

Its flags are its own argparse parser (a subparser of `gpuscope`'s, so `gpuscope --help`
lists the command and `gpuscope labels --help` shows these), but the agent flags it takes
are the agent's declared ones: same help, same GPUSCOPE_* variables, same checks
(agent/app/config.py parses them), so `gpuscope labels` inside the agent's pod sees the node, the
host's /sys and the label prefix the agent does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpuscope.agent import logs
from gpuscope.agent.app.config import Config, ConfigError, all_flags, parse
from gpuscope.agent.app.registry import DEFAULT_COLLECTORS, accelerators
from gpuscope.agent.runtime.help_format import HelpFormatter

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyAccelerators
    from gpuscope.agent.runtime.options import Flag

# The agent's parser imports this module for `add_arguments` (`gpuscope --help` lists the
# command): what only the command itself runs is imported where it runs, so that an agent
# imports none of it (tests/integration/test_light_imports.py).

SUMMARY = "print the node labels gpuscope computes from this node's GPUs (no API server)"
DESCRIPTION = (
    "Print the node labels and annotations the agent would publish for this node's GPUs, "
    "read once through NVML, without contacting an API server. With --remove, take every "
    "key the agent owns off the Node instead (uninstall)."
)
# The agent flags that mean something here, declared (help, variable, check) by the agent.
AGENT_FLAGS = ("--node-name", "--sysfs", "--label-prefix", "--gpu-read-deadline", "--log-format")


def read_accelerators(config: Config) -> AnyAccelerators | None:
    """The devices of the first accelerator collector that finds any, each source built from
    its declaration as the agent builds it (so the collector's options, --gpu-read-deadline
    and GPUSCOPE_* variables, apply here too); None when none could read, each reason said."""
    from gpuscope.agent.clock import SystemClock
    from gpuscope.agent.runtime.sources import SourceUnavailable
    from gpuscope.agent.runtime.spec import BuildContext

    found: AnyAccelerators | None = None
    unreadable: list[str] = []
    for spec in accelerators(config.collectors):
        ctx = BuildContext(config.agent, config.of(spec), SystemClock(), background=False)
        source = spec.build(ctx)
        try:
            source.start()
            found = source.read()
        except SourceUnavailable as exc:
            unreadable.append(str(exc))
        finally:
            source.stop()
        if found is not None and found.gpus:
            return found  # one vendor's GPUs: the others' absence is no news
    for why in unreadable:
        print(f"gpuscope labels: no GPUs readable: {why}", file=sys.stderr)
    return found


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's flags, on its own parser or on `gpuscope`'s subparser."""
    parser.add_argument(
        "--output",
        choices=("table", "json"),
        default="table",
        help="table (key and value per line) or json ({labels, annotations}) (default: table)",
    )
    parser.add_argument(
        "--remove",
        action="store_true",
        help="take every label and annotation the agent owns off the Node --node-name names "
        "(uninstall), instead of printing",
    )
    for f in _agent_flags():
        parser.add_argument(
            f.name, dest=f.attr, help=f"{f.meta.help} (default: {f.default_text}) [{f.env}]"
        )


def _agent_flags() -> list[Flag]:
    declared = {f.name: f for _title, flags in all_flags() for f in flags}
    return [declared[name] for name in AGENT_FLAGS]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuscope labels", description=DESCRIPTION, formatter_class=HelpFormatter
    )
    add_arguments(parser)
    return parser


def labels_main(argv: Sequence[str]) -> int:
    """`gpuscope labels ARGV`: usage errors exit 2 (argparse), no GPU still prints labels."""
    args = build_parser().parse_args(list(argv))
    agent_args = ["--collectors", ",".join(c.name for c in accelerators(DEFAULT_COLLECTORS))]
    for f in _agent_flags():
        value = getattr(args, f.attr)
        if value is not None:
            agent_args.append(f"{f.name}={value}")  # '=': a value may start with '-'
    try:
        config = parse(agent_args)
    except ConfigError as exc:
        print(f"gpuscope labels: {exc}", file=sys.stderr)
        return 2
    output, prefix, remove = args.output, config.labels.label_prefix, args.remove
    logs.setup(config.agent.log_format, "warning")
    if remove:
        return remove_from_node(config.agent.node_name, prefix)

    from gpuscope.agent.net.placement import network_placement
    from gpuscope.exporters.labels.gpu import gpu_labels, topology_annotation
    from gpuscope.exporters.labels.validation import validate

    snapshot = read_accelerators(config)

    placement = network_placement(config.agent.sysfs, snapshot.pci_bus_ids if snapshot else ())
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
        import json  # here: the agent imports this module for its flags, not to print JSON

        print(json.dumps({"labels": labels, "annotations": annotations}, indent=2, sort_keys=True))
    else:
        width = max((len(k) for k in (*labels, *annotations)), default=0)
        for key in sorted(labels):
            print(f"{key:<{width}}  {labels[key]}")
        for key, value in annotations.items():
            print(f"{key:<{width}}  {value}")
    return 0

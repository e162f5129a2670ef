"""`gpuscope bpf-load`: compile the eBPF probes, attach them, pin their maps and links under
bpffs, and exit; `--unload` removes every pin.

It takes the agent's own flags (and GPUSCOPE_* variables), so the DaemonSet's init container
and the agent it prepares cannot disagree on what to load; the agent runs it as a child
process when it finds no pins for its options. The one line it writes to stderr at the end
starts with "gpuscope bpf-load: " and says what it did, or why it could not.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.bpf.host import HeaderTree
    from gpuscope.agent.bpf.loader import Loaded
    from gpuscope.agent.net.source import NetConfig

SUMMARY = "compile, attach and pin the eBPF probes under bpffs, then exit (--unload: remove them)"
DESCRIPTION = (
    "Loads the net collector's eBPF probes with bcc and pins their maps and links under "
    "--bpf-pin-root (bpffs), where the agent reads them without a compiler. Run once per "
    "node boot or upgrade (the DaemonSet's init container); pins of other program hashes "
    "are removed. Takes the agent's flags. --unload removes every pin under --bpf-pin-root."
)
PREFIX = "gpuscope bpf-load: "
EXIT_FAILED = 1
EXIT_USAGE = 2

log = logging.getLogger("gpuscope.bpf")


def _say(text: str) -> None:
    print(PREFIX + text, file=sys.stderr, flush=True)


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if "-h" in args or "--help" in args:
        print(f"usage: gpuscope bpf-load [--unload] [AGENT FLAGS]\n\n{DESCRIPTION}")
        return 0
    unload = "--unload" in args
    args = [a for a in args if a != "--unload"]

    from gpuscope.agent import logs
    from gpuscope.agent.app.config import ConfigError, parse
    from gpuscope.agent.net.collector import NET, net_config

    try:
        config = parse(args)
    except ConfigError as exc:
        _say(str(exc))
        return EXIT_USAGE
    logs.setup(config.agent.log_format, config.agent.log_level)
    net = net_config(config.agent, config.of(NET))

    from gpuscope.agent.bpf import loader

    if unload:
        removed = loader.unload(net.pin_root)
        _say(f"removed {len(removed)} pin directories under {net.pin_root}"
             + (f": {', '.join(removed)}" if removed else ""))  # fmt: skip
        return 0
    if "net" not in config.collectors:
        _say("the net collector is not enabled (--collectors): nothing to load")
        return 0

    from gpuscope.agent.runtime.sources import SourceUnavailable

    try:
        loaded, headers = _load(net)
    except SourceUnavailable as exc:
        _say(str(exc))
        return EXIT_FAILED
    except OSError as exc:
        _say(f"{type(exc).__name__}: {exc}")
        return EXIT_FAILED
    how = (
        "pins already there"
        if loaded.reused
        else f"compiled against headers {headers.path} ({headers.how}) and pinned"
    )
    stale = f"; removed {', '.join(loaded.removed)}" if loaded.removed else ""
    _say(
        f"net probes {how} at {loaded.directory} ("
        + ", ".join(f"{k}={v}" for k, v in loaded.modes.items())
        + f") in {loaded.seconds:.2f} s, peak RSS {loaded.peak_rss_bytes / 1e6:.0f} MB{stale}"
    )
    return 0


def _load(net: NetConfig) -> tuple[Loaded, HeaderTree]:
    from gpuscope.agent.bpf import host, loader, pins
    from gpuscope.agent.net.probes import plan_probes
    from gpuscope.agent.runtime.sources import SourceUnavailable

    mount = pins.bpffs_mount(net.pin_root, net.procfs / "self" / "mounts")
    if mount is None:
        raise SourceUnavailable(
            f"no bpffs at {net.pin_root}; mount it: mount -t bpf bpf {net.pin_root.parent}"
            " (in Kubernetes: a hostPath volume of /sys/fs/bpf)"
        )
    # Capabilities first: in the agent's container (which runs this only when its pins are
    # gone) CAP_PERFMON is what is missing, before tracefs and the headers are.
    host.require_capabilities(net.procfs)
    tracefs = host.require_tracefs()
    plan = plan_probes(tracefs, net.traffic_mode)
    if plan.traffic == "cgroup_skb":
        host.require_capabilities(net.procfs, attach_cgroup=True)
    headers = host.require_kernel_headers(net.modules_dir, net.fallback_headers)
    root = net.cgroup_v2_root()
    loaded = loader.load(
        net.family(root), pin_root=net.pin_root, tracefs=tracefs, headers=headers, cgroup_root=root
    )
    return loaded, headers

"""`gpuscope`: parse flags, start the sources, serve until SIGTERM/SIGINT.

Without a command, `gpuscope [flags]` is the agent (serve). Commands are argparse subparsers
with their own flags and help (`gpuscope labels --help`, `gpuscope check --help`);
`gpuscope --help` lists them.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuscope.agent import check as first_contact
from gpuscope.agent import codecache, logs
from gpuscope.agent.app import bpf_load
from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import Config, ConfigError, from_parsed
from gpuscope.agent.app.config import build_parser as agent_parser
from gpuscope.agent.app.registry import accelerators
from gpuscope.agent.labels import cli as labels_cli
from gpuscope.agent.runtime.help_format import HelpFormatter
from gpuscope.agent.serve.server import MetricsServer

if TYPE_CHECKING:
    from gpuscope.agent.labels.loop import LabelsLoop

log = logging.getLogger("gpuscope")


EXIT_USAGE = 2
EXIT_RUNTIME = 1


def build_parser() -> argparse.ArgumentParser:
    """The agent's flags (declared in agent/app/config.py) and the commands."""
    parser = agent_parser()
    commands = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        help="without one, gpuscope runs the agent with the options below",
    )
    labels_cli.add_arguments(
        commands.add_parser(
            "labels",
            help=labels_cli.SUMMARY,
            description=labels_cli.DESCRIPTION,
            formatter_class=HelpFormatter,
        )
    )
    # Listed here; parsed by the check itself, imported only when it runs (main()).
    commands.add_parser(
        "check", help=first_contact.SUMMARY, add_help=False, formatter_class=HelpFormatter
    )
    commands.add_parser(
        "bpf-load", help=bpf_load.SUMMARY, add_help=False, formatter_class=HelpFormatter
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["labels"]:
        return labels_cli.labels_main(args[1:])
    if args[:1] == ["bpf-load"]:
        return bpf_load.main(args[1:])
    if args[:1] == ["check"]:
        from gpuscope.agent.check.main import main as check_main

        return check_main(args[1:])
    # --help, --version and unknown flags end here (argparse: exit 0 or 2).
    parsed = vars(build_parser().parse_args(args))
    command = parsed.pop("command")
    if command is not None:
        # Flags before a command are the agent's; the command would silently ignore them.
        print(f"gpuscope: the command comes first: gpuscope {command} [FLAGS]", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = from_parsed(parsed)
    except ConfigError as exc:
        print(f"gpuscope: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logs.setup(config.agent.log_format, config.agent.log_level)
    limit_malloc_arenas()

    agent = Agent(config)
    host, port = config.agent.listen
    # Bind before starting sources: a port conflict is the most common deployment error and
    # should fail fast, not after NVML and BPF have been set up.
    try:
        server = MetricsServer(
            (host, port),
            lambda: agent.registry,  # made on the first OpenMetrics scrape
            agent.collector.render_text,
            lambda: agent.ready,
            health=agent.health_detail,
            web=config.agent.web_config_file,
        )
    except OSError as exc:
        where = f"[{host}]:{port}" if ":" in host else f"{host or '*'}:{port}"
        reason = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        print(f"gpuscope: cannot listen on {where}: {reason}", file=sys.stderr)
        return EXIT_RUNTIME

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    def on_hangup(_signum: int, _frame: object) -> None:
        # The default action of SIGHUP is to die silently (a terminal closing, a careless
        # `kill -HUP` taken from another daemon's habits). There is nothing to reload: the
        # configuration is flags and environment, read once; a restart applies new ones.
        log.warning("received SIGHUP: ignored (gpuscope reads its flags only at start)")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)

    server.start()
    bound, bound_port = server.address
    log.info(
        "serving on %s://%s:%d/metrics (node %s)",
        server.scheme,
        f"[{bound}]" if ":" in bound else bound,
        bound_port,
        config.agent.node_name,
    )
    if config.agent.web_config_file is not None:
        web = config.agent.web_config_file
        log.info("web config %s: %s", web, web.summary())
    labels = None
    try:
        agent.start()
        # The start's imports are done: keep the dataclass methods they compiled for the
        # next start and free the cache (agent/codecache.py).
        codecache.release()
        trim_heap()
        labels = start_labels(config, agent)
        stop.wait()
    finally:
        if labels is not None:
            labels.stop()
        server.stop()
        agent.stop()
    return 0


M_ARENA_MAX = -8  # glibc's mallopt() parameter (malloc.h)


def limit_malloc_arenas(arenas: int = 1) -> bool:
    """One malloc arena for the process, before its threads start, unless $MALLOC_ARENA_MAX
    says otherwise. glibc gives each thread that allocates an arena of its own; the agent's
    threads (render, per-GPU reads, sampler, XID, stages) run Python under one GIL, so the
    arenas bought no parallelism and held about 1 MB of a GPU-only agent's ~31 MB resident
    (issue #24). False where the C library has no mallopt (musl) or refuses."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    import ctypes

    mallopt = _libc("mallopt", ctypes.c_int, ctypes.c_int)
    return mallopt is not None and bool(mallopt(M_ARENA_MAX, arenas))


def trim_heap() -> bool:
    """Give the kernel back the heap the start freed (the imports' transient objects, the
    dataclass-method cache): glibc keeps freed memory below the heap's top until asked
    (malloc_trim(3)). False where the C library has no malloc_trim (musl)."""
    import ctypes

    malloc_trim = _libc("malloc_trim", ctypes.c_size_t)
    return malloc_trim is not None and bool(malloc_trim(0))


def _libc(name: str, *argtypes: Any) -> Any:
    """The C library's function `name` returning an int, or None where it has none."""
    import ctypes

    try:
        function = getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


def start_labels(config: Config, agent: Agent) -> LabelsLoop | None:
    enabled = accelerators(config.collectors)
    if config.labels.labels_mode == "none" or not enabled:
        return None  # and the labels loop, its publishers and their clients stay unimported
    from gpuscope.agent.labels.loop import LabelsLoop, make_publisher
    from gpuscope.agent.runtime.accelerators import DeviceWatch

    publish = make_publisher(config)
    if publish is None:
        return None
    # A stand-in for a missing dependency is no watch.
    watches = {
        spec.name: source
        for spec in enabled
        if isinstance(source := agent.source(spec.name), DeviceWatch)
    }
    loop = LabelsLoop(config, agent.runner, watches, publish)
    loop.start()
    return loop


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""`gpuscope check`: its flags, the order of the checks, and the child modes."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuscope.agent import logs
from gpuscope.agent.amd.source import AmdSource
from gpuscope.agent.check import DESCRIPTION, SUMMARY
from gpuscope.agent.check.accounting import check_busy, check_idle
from gpuscope.agent.check.amd import inventory as amd_inventory
from gpuscope.agent.check.amd import run_amd_checks, start_amd_agent
from gpuscope.agent.check.common import FAIL, Check, say, scrape
from gpuscope.agent.check.costs import check_costs
from gpuscope.agent.check.fields import check_fields
from gpuscope.agent.check.inventory import inventory
from gpuscope.agent.check.load import fault_child, make_load
from gpuscope.agent.check.load_generator import check_load
from gpuscope.agent.check.nvidia_smi import check_nvidia_smi
from gpuscope.agent.check.nvml_errors import check_nvml_errors
from gpuscope.agent.check.phases import run_phases
from gpuscope.agent.check.process_path import check_process_path, process_probe
from gpuscope.agent.check.process_util import check_process_util
from gpuscope.agent.check.report import print_summary, report_path, write_report
from gpuscope.agent.check.series_budget import check_series_budget
from gpuscope.agent.check.session import census_nvml, start_agent
from gpuscope.agent.check.stream import StreamRecorder
from gpuscope.agent.check.util_samples import check_util_samples
from gpuscope.agent.check.xid import check_xid_delivery, check_xid_registration

if TYPE_CHECKING:
    from gpuscope.agent.app.agent import Agent
    from gpuscope.agent.gpu.nvml import Nvml
    from gpuscope.agent.gpu.source import GpuSource


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The check's flags, for its own parser and for `gpuscope --help`'s list of commands."""
    p.add_argument("--json", help="report path (default: $OUT or . / gpu-check-report.json)")
    p.add_argument(
        "--vendor",
        choices=("auto", "nvidia", "amd"),
        default="auto",
        help="whose GPUs to check (auto: NVIDIA's where NVML answers, else AMD's)",
    )
    p.add_argument("--quick", action="store_true", help="a few seconds per phase (tests)")
    p.add_argument("--idle-seconds", type=float, help="idle window (default 60, quick 3)")
    p.add_argument("--duty-seconds", type=float, help="duty window (default 60, quick 5)")
    p.add_argument("--settle-seconds", type=float, help="before each window (default 2)")
    p.add_argument("--duty", type=float, default=0.5, help="busy share of each slot")
    p.add_argument("--slot", type=float, default=0.1, help="duty-cycle slot, seconds")
    p.add_argument("--assume-duty", type=float, help="the duty the load really has (hooks)")
    p.add_argument("--fake-load", metavar="CMD", help="run CMD start|stop|xid instead of CUDA")
    p.add_argument("--provoke-xid", action="store_true", help="fault a kernel of a child")
    p.add_argument("--sample-interval", type=float, default=1.0, help="the agent's, seconds")
    p.add_argument("--reps", type=int, help="timed repetitions per call (default 100)")
    p.add_argument("--budget", type=float, help="seconds at most per timed call (default 1.5)")
    p.add_argument("--xid-wait", type=float, help="seconds for a provoked XID (default 10)")
    p.add_argument("--process-probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--apply-caps", type=lambda v: int(v, 0), help=argparse.SUPPRESS)
    p.add_argument("--fault-child", action="store_true", help=argparse.SUPPRESS)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="gpuscope check",
        description=SUMMARY,
        epilog=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    args = p.parse_args(argv)
    quick = args.quick
    for name, full, short in (
        ("idle_seconds", 60.0, 3.0),
        ("duty_seconds", 60.0, 5.0),
        ("settle_seconds", 2.0, 1.0),
        ("reps", 100, 20),
        ("budget", 1.5, 0.3),
        ("xid_wait", 10.0, 3.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)
    return args


def run_checks(args: Any, agent: Agent, source: GpuSource, nvml: Nvml) -> list[Check]:
    load, why = make_load(args)
    rec = StreamRecorder(nvml.lib, source.devices[0].handle)
    rec.start()
    phases = run_phases(agent, source, load, rec, args)
    say("process path, field and cost census")
    checks = [
        check_load(load, why, phases),
        check_util_samples(rec, "duty_end" in phases.marks),
        check_idle(phases, source),
        check_busy(phases, source, load, args),
        check_process_util(rec, load, phases),
    ]
    rec.stop()
    checks.append(check_process_path(load, source))
    checks.append(check_fields(nvml, source.devices[0], args))
    checks.append(check_costs(nvml, source, args))
    checks.append(check_xid_registration(nvml, source, scrape(agent)))
    checks.append(check_series_budget(agent, args))
    checks.append(check_xid_delivery(args, load, source))
    checks.append(check_nvidia_smi(phases, load))
    checks.append(check_nvml_errors(source))
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.process_probe:
        return process_probe(args.apply_caps)
    if args.fault_child:
        return fault_child()
    logs.setup("text", "warning")
    t0 = time.monotonic()
    path = report_path(args.json)
    extra: dict[str, Any] = {"args": vars(args), "started": time.time()}
    started = start(args)
    if isinstance(started, Check):
        write_report(path, [started], extra)
        print_summary([started], {}, path, time.monotonic() - t0)
        return 1
    agent, source = started
    if isinstance(source, AmdSource):
        try:
            extra["inventory"] = amd_inventory(source)
            checks = run_amd_checks(args, agent, source)
        finally:
            agent.stop()
        return finish(path, checks, extra, t0)
    try:
        with census_nvml() as nvml:
            extra["inventory"] = inventory(nvml, source)
            checks = run_checks(args, agent, source, nvml)
    finally:
        agent.stop()
    return finish(path, checks, extra, t0)


def finish(path: Path, checks: list[Check], extra: dict[str, Any], t0: float) -> int:
    extra["wall_s"] = time.monotonic() - t0
    write_report(path, checks, extra)
    print_summary(checks, extra["inventory"], path, extra["wall_s"])
    return 1 if any(c.status == FAIL for c in checks) else 0


def start(args: Any) -> tuple[Agent, GpuSource | AmdSource] | Check:
    """The agent for the vendor asked for; `auto`: NVIDIA's where NVML answers, else AMD's
    where AMD SMI does, else NVIDIA's failure (the suite's first user)."""
    if args.vendor == "amd":
        return start_amd_agent(args)
    started = start_agent(args)
    if args.vendor == "auto" and isinstance(started, Check):
        amd = start_amd_agent(args)
        if not isinstance(amd, Check):
            return amd
    return started

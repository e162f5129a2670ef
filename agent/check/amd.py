"""`gpuscope check` on an AMD node: what a first MI300X slot must tell in four minutes.

The `amd` collector rests on facts the fake library models but no hardware has confirmed
(docs/amd.md, "Inferred"): the scale of the activity accumulators, the firmware's sample
rate, XGMI counters in KiB, a partitioned GPU's memory, the process list's visibility, the
events. Each check here measures one of them against another source on the same GPU, and
says pass, fail, or not checked with the numbers behind it:

* `amd_inventory`: GPUs, partitions, library and bindings versions;
* `amd_accumulators`: over a window, the accumulators' busy share against the activity
  the library reports, sampled every 100 ms; the accumulation counter's rate;
* `amd_costs`: every call the collector makes on GPU 0, timed; one whole `read()`;
* `amd_processes`: the process list as the agent sees it (count, PIDs resolvable in
  /proc, VRAM reported), and whether a refusal is NO_PERM;
* `amd_events`: every processor registered for the health events;
* `amd_memory`: a partitioned GPU's memory as the collector derives it against
  `vram_info`'s size;
* `amd_xgmi`: links up, and the per-link counters against gpu_metrics' accumulators;
* `series_budget`: at most 40 series per GPU at the default level.

No load is generated (a HIP kernel needs ROCm's runtime, which the agent's image has not):
run it beside a job for a busy window, or idle for an idle one; the report says which.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuscope.agent.amd import device as dev
from gpuscope.agent.amd.library import AmdSmi, AmdSmiCallError, number, status_name
from gpuscope.agent.amd.sampler import read_accumulators
from gpuscope.agent.amd.source import AmdSource
from gpuscope.agent.check.common import (
    FAIL,
    Check,
    not_checked,
    stats,
    timed,
    verdict,
)
from gpuscope.agent.check.series_budget import check_series_budget
from gpuscope.agent.check.session import start_agent

if TYPE_CHECKING:
    from gpuscope.agent.app.agent import Agent

ACTIVITY_TOLERANCE = 0.05  # accumulator vs sampled busy share, absolute
SAMPLE_EVERY = 0.1  # seconds between the sampled activity reads


def start_amd_agent(args: Any) -> tuple[Agent, AmdSource] | Check:
    """The agent with the `amd` collector only, at full detail."""
    return start_agent(args, "amd", AmdSource)


def inventory(source: AmdSource) -> dict[str, Any]:
    return {
        "vendor": "amd",
        "library": source.library_version,
        "bindings": source.lib.bindings_version,
        "driver": source.driver_version,
        "gpus": [
            {
                "index": d.identity.index,
                "model": d.identity.model,
                "uuid": d.identity.uuid,
                "pci": d.identity.pci_bus_id,
                "gfx": d.gfx_target,
                "partition": f"{d.compute_partition}/{d.memory_partition}",
                "processors": len(d.processors),
                "package": d.package,
            }
            for d in source.devices
        ],
    }


def run_amd_checks(args: Any, agent: Agent, source: AmdSource) -> list[Check]:
    lib = source.lib
    checks = [
        check_accumulators(lib, source.devices, args.duty_seconds),
        check_costs(lib, source, args),
        check_processes(lib, source.devices),
        check_events(source),
        check_memory(lib, source),
        check_xgmi(lib, source.devices, args.settle_seconds),
        check_series_budget(agent, args, "amd"),
    ]
    return checks


def _accumulators(lib: AmdSmi, h: Any) -> dict[str, Any]:
    """The fields as the agent's sampler reads them (from the wrapper's struct); {} where a
    GPU does not answer, which the check then reports."""
    try:
        return read_accumulators(lib, h)
    except AmdSmiCallError:
        return {}


def _metrics(lib: AmdSmi, h: Any) -> dict[str, Any]:
    try:
        return lib.query("amdsmi_get_gpu_metrics_info", h) or {}
    except AmdSmiCallError:
        return {}


def check_accumulators(lib: AmdSmi, devices: Sequence[dev.Device], window: float) -> Check:
    """The accumulators' busy share of a window against the mean of the activity sampled
    every 100 ms in it, per GPU; the counter's rate (the docs assume 1,000 a second)."""
    with_acc = [
        d
        for d in devices
        if number(_accumulators(lib, d.primary).get("gfx_activity_acc")) is not None
    ]
    if not with_acc:
        return not_checked("amd_accumulators", "no GPU has activity accumulators (pre-MI300)")
    start = {d.identity.uuid: _accumulators(lib, d.primary) for d in with_acc}
    t0 = time.monotonic()
    samples: dict[str, list[float]] = {d.identity.uuid: [] for d in with_acc}
    while time.monotonic() - t0 < window:
        for d in with_acc:
            got = lib.query("amdsmi_get_gpu_activity", d.primary) or {}
            gfx = number(got.get("gfx_activity"))
            if gfx is not None and gfx <= 100:
                samples[d.identity.uuid].append(gfx / 100)
        time.sleep(SAMPLE_EVERY)
    elapsed = time.monotonic() - t0
    problems: list[str] = []
    per_gpu: dict[str, Any] = {}
    for d in with_acc:
        end = _accumulators(lib, d.primary)
        a, b = start[d.identity.uuid], end
        ticks = (number(b.get("accumulation_counter")) or 0) - (
            number(a.get("accumulation_counter")) or 0
        )
        acc = (number(b.get("gfx_activity_acc")) or 0) - (number(a.get("gfx_activity_acc")) or 0)
        sampled = samples[d.identity.uuid]
        mean = sum(sampled) / len(sampled) if sampled else None
        ratio = acc / (100 * ticks) if ticks > 0 else None
        per_gpu[d.identity.uuid] = {
            "accumulator_ratio": ratio,
            "sampled_mean": mean,
            "samples": len(sampled),
            "counter_per_second": ticks / elapsed if elapsed > 0 else None,
            "acc_delta": acc,
            "counter_delta": ticks,
        }
        if ratio is None or mean is None:
            problems.append(f"GPU {d.identity.index}: no counter growth or no samples")
        elif abs(ratio - mean) > ACTIVITY_TOLERANCE:
            problems.append(
                f"GPU {d.identity.index}: accumulator {ratio:.3f} vs sampled {mean:.3f}"
            )
    rates = [g["counter_per_second"] for g in per_gpu.values() if g["counter_per_second"]]
    ok = (
        f"accumulator and sampled busy share agree within {ACTIVITY_TOLERANCE:g} on "
        f"{len(with_acc)} GPU(s) over {elapsed:.0f} s; counter {min(rates, default=0):.0f}-"
        f"{max(rates, default=0):.0f}/s"
    )
    return verdict("amd_accumulators", problems, ok, {"window_s": elapsed, "per_gpu": per_gpu})


def check_costs(lib: AmdSmi, source: AmdSource, args: Any) -> Check:
    """Each call the collector makes on GPU 0, timed, and a whole collection."""
    d = source.devices[0]
    h = d.primary
    m = lib.module
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("amdsmi_get_gpu_vram_usage", (h,)),
        ("amdsmi_get_gpu_activity", (h,)),
        ("amdsmi_get_power_info", (h,)),
        ("amdsmi_get_energy_count", (h,)),
        ("amdsmi_get_gpu_metrics_info", (h,)),
        ("amdsmi_get_pcie_info", (h,)),
        ("amdsmi_get_gpu_xgmi_link_status", (h,)),
        ("amdsmi_get_link_metrics", (h,)),
        ("amdsmi_get_gpu_total_ecc_count", (h,)),
        ("amdsmi_get_gpu_bad_page_info", (h,)),
        ("amdsmi_get_gpu_process_list", (h,)),
        ("amdsmi_get_clock_info", (h, m.AmdSmiClkType.GFX)),
        (
            "amdsmi_get_temp_metric",
            (h, m.AmdSmiTemperatureType.JUNCTION, m.AmdSmiTemperatureMetric.CURRENT),
        ),
    ]
    rows: list[dict[str, Any]] = []
    for name, call_args in calls:

        def one(name: str = name, call_args: tuple[Any, ...] = call_args) -> Any:
            try:
                return lib.call(name, *call_args)
            except AmdSmiCallError as exc:
                return status_name(exc.status) if exc.status >= 0 else "missing"

        times, result = timed(one, args.reps, args.budget)
        rows.append({"call": name, "answer": _kind(result), "seconds": stats(times)})
    read_times, _ = timed(source.read, max(3, args.reps // 10), args.budget * 4)
    read = stats(read_times)
    slowest = max(rows, key=lambda r: r["seconds"]["p90"] or 0)
    details = {"calls": rows, "read_seconds": read}
    p90 = read["p90"] or 0
    problems = [f"one read() p90 {p90 * 1e3:.0f} ms, over 250 ms"] if p90 > 0.25 else []
    ok = (
        f"read() p90 {p90 * 1e3:.1f} ms for {len(source.devices)} GPU(s); slowest call "
        f"{slowest['call']} p90 {(slowest['seconds']['p90'] or 0) * 1e3:.2f} ms"
    )
    return verdict("amd_costs", problems, ok, details)


def _kind(result: Any) -> str:
    if isinstance(result, str):
        return result
    return "answered" if result is not None else "none"


def check_processes(lib: AmdSmi, devices: Sequence[dev.Device]) -> Check:
    """The processes the library lists, as this process (the DaemonSet runs with uid 0 and
    BPF, PERFMON, NET_ADMIN only): how many, whether their PIDs are in /proc, whether each
    has VRAM reported. Without any process on the node there is nothing to see."""
    listed: list[dict[str, Any]] = []
    refused: Counter[str] = Counter()
    for d in devices:
        for p in d.processors:
            try:
                got = lib.call("amdsmi_get_gpu_process_list", p.handle)
            except AmdSmiCallError as exc:
                refused[status_name(exc.status) if exc.status >= 0 else "missing"] += 1
                continue
            for entry in got:
                pid = number(entry.get("pid"))
                memory = entry.get("memory_usage") or {}
                listed.append(
                    {
                        "gpu": d.identity.index,
                        "pid": int(pid) if pid is not None else None,
                        "in_proc": pid is not None and Path(f"/proc/{int(pid)}").exists(),
                        "vram": number(memory.get("vram_mem")),
                        "name": entry.get("name"),
                    }
                )
    details = {"processes": listed, "refused": dict(refused)}
    if refused and not listed:
        return Check(
            "amd_processes",
            FAIL,
            f"the process list was refused on every processor: {dict(refused)}",
            details,
        )
    if not listed:
        return not_checked("amd_processes", "no process on any GPU: run beside a job", details)
    problems = [f"PID {p['pid']} not in /proc" for p in listed if not p["in_proc"]]
    problems += [f"PID {p['pid']} without VRAM" for p in listed if p["vram"] is None]
    ok = f"{len(listed)} process(es) seen on {len({p['gpu'] for p in listed})} GPU(s)"
    return verdict("amd_processes", problems, ok, details)


def check_events(source: AmdSource) -> Check:
    watcher = source.events
    if watcher is None or watcher.watched is None:
        return not_checked("amd_events", "the library delivers no event notification here")
    missing = [d.identity.index for d in source.devices if d.identity.uuid not in watcher.watched]
    details = {"watched": sorted(watcher.watched), "drained": watcher.poll()}
    problems = [f"GPU(s) {missing} refused event registration"] if missing else []
    ok = f"{len(watcher.watched)} GPU(s) registered for vm_fault, thermal and reset events"
    return verdict("amd_events", problems, ok, details)


# The HBM of each model, from AMD's data sheets: the reference a GPU's memory as the
# collector reports it is held to (a partitioned GPU's is derived from its XCPs').
NOMINAL_MIB = {
    "AMD Instinct MI300X": 192 * 1024,
    "AMD Instinct MI325X": 256 * 1024,
    "AMD Instinct MI250X / MI250": 64 * 1024,  # per GCD
}


def check_memory(lib: AmdSmi, source: AmdSource) -> Check:
    """Each GPU's memory total as the collector reports it (derived from the XCPs on a
    partitioned GPU) against the model's data sheet; what each XCP and `vram_info` report,
    for the record."""
    known = [d for d in source.devices if d.identity.model in NOMINAL_MIB]
    if not known:
        models = sorted({d.identity.model for d in source.devices})
        return not_checked("amd_memory", f"no data-sheet size for {models}")
    by_uuid = {r.identity.uuid: r for r in source.read().gpus}
    problems: list[str] = []
    per_gpu: dict[str, Any] = {}
    for d in known:
        info = lib.query("amdsmi_get_gpu_vram_info", d.primary) or {}
        xcps = [lib.query("amdsmi_get_gpu_vram_usage", p.handle) or {} for p in d.processors]
        reported = by_uuid[d.identity.uuid].memory_total_bytes
        nominal = NOMINAL_MIB[d.identity.model] * dev.MIB
        per_gpu[d.identity.uuid] = {
            "reported_bytes": reported,
            "nominal_bytes": nominal,
            "vram_info_mb": number(info.get("vram_size")),
            "xcp_total_mb": [number(x.get("vram_total")) for x in xcps],
            "partition": f"{d.compute_partition}/{d.memory_partition}",
        }
        # The usable total is a little under the nominal (firmware reserves some): 3 %.
        if reported is None or not 0.97 * nominal <= reported <= nominal:
            problems.append(f"GPU {d.identity.index}: {reported} bytes, data sheet {nominal}")
    return verdict(
        "amd_memory", problems, f"{len(known)} GPU(s) report their data-sheet memory", per_gpu
    )


def check_xgmi(lib: AmdSmi, devices: Sequence[dev.Device], window: float) -> Check:
    """Links up per GPU, and the per-link counters' growth against gpu_metrics' XGMI
    accumulators over a window (the same bytes, two sources: their units agree or not)."""
    if not any(lib.query("amdsmi_get_gpu_xgmi_link_status", d.primary) for d in devices):
        return not_checked("amd_xgmi", "no XGMI link status (no hive, or the release lacks it)")

    def totals(d: dev.Device) -> tuple[float | None, float | None]:
        links = dev.xgmi_links(lib, d.primary)
        per_link = sum(link.transmit_bytes or 0 for link in links) if links else None
        acc = _metrics(lib, d.primary).get("xgmi_write_data_acc")
        accs = [v for v in (number(x) for x in (acc or [])) if v is not None]
        return per_link, (sum(accs) * dev.KIB if accs else None)

    before = {d.identity.uuid: totals(d) for d in devices}
    time.sleep(window)
    after = {d.identity.uuid: totals(d) for d in devices}
    per_gpu: dict[str, Any] = {}
    problems: list[str] = []
    for d in devices:
        links = dev.xgmi_links(lib, d.primary)
        (l0, a0), (l1, a1) = before[d.identity.uuid], after[d.identity.uuid]
        grew_links = l1 - l0 if l0 is not None and l1 is not None else None
        grew_acc = a1 - a0 if a0 is not None and a1 is not None else None
        per_gpu[d.identity.uuid] = {
            "up": sum(1 for link in links if link.up),
            "down": sum(1 for link in links if link.up is False),
            "link_bytes": grew_links,
            "metrics_bytes": grew_acc,
        }
        down = per_gpu[d.identity.uuid]["down"]
        if down:
            problems.append(f"GPU {d.identity.index}: {down} XGMI link(s) down")
        if grew_links and grew_acc and abs(grew_links - grew_acc) > 0.05 * max(grew_links, 1):
            problems.append(
                f"GPU {d.identity.index}: link counters grew {grew_links:.0f} B, "
                f"gpu_metrics {grew_acc:.0f} B"
            )
    ups = sorted({g["up"] for g in per_gpu.values()})
    return verdict("amd_xgmi", problems, f"links up per GPU: {ups}", {"per_gpu": per_gpu})

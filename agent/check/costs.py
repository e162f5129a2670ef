"""Check `costs`: every sampler-tick and scrape-time NVML call, timed."""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuscope.agent.check.common import COLLECT_BUDGET, TICK_SHARE, Check, ms, stats, timed, verdict
from gpuscope.agent.gpu import device as dev
from gpuscope.agent.gpu import fields as gpu_fields
from gpuscope.agent.gpu import gpm
from gpuscope.agent.gpu.nvml import NOT_FOUND, Nvml
from gpuscope.agent.gpu.processes import ProcessReader
from gpuscope.agent.gpu.sampler import Sampler

if TYPE_CHECKING:
    from gpuscope.agent.gpu.source import GpuSource

# Every NVML call device.read makes per GPU per scrape (besides the field batch).
SCRAPE_CALLS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("nvmlDeviceGetMigMode", ()),
    ("nvmlDeviceGetUtilizationRates", ()),
    ("nvmlDeviceGetMemoryInfo", (dev.NVML_MEMORY_V2,)),
    ("nvmlDeviceGetPowerUsage", ()),
    ("nvmlDeviceGetEnforcedPowerLimit", ()),
    ("nvmlDeviceGetTotalEnergyConsumption", ()),
    ("nvmlDeviceGetTemperature", (dev.NVML_TEMPERATURE_GPU,)),
    *(("nvmlDeviceGetClockInfo", (c,)) for _, c in dev.CLOCKS),
    *(("nvmlDeviceGetMaxClockInfo", (c,)) for _, c in dev.CLOCKS),
    ("nvmlDeviceGetCurrentClocksEventReasons", ()),
    ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
    ("nvmlDeviceGetCurrPcieLinkGeneration", ()),
    ("nvmlDeviceGetMaxPcieLinkGeneration", ()),
    ("nvmlDeviceGetCurrPcieLinkWidth", ()),
    ("nvmlDeviceGetMaxPcieLinkWidth", ()),
    ("nvmlDeviceGetPcieReplayCounter", ()),
    ("nvmlDeviceGetTotalEccErrors", (0, dev.NVML_VOLATILE_ECC)),
    ("nvmlDeviceGetTotalEccErrors", (1, dev.NVML_VOLATILE_ECC)),
    ("nvmlDeviceGetRemappedRows", ()),
)


def cost_row(name: str, fn: Callable[[], Any], args: Any, used: bool = True) -> dict[str, Any]:
    times, result = timed(fn, args.reps, args.budget)
    return {
        "call": name,
        "used_by_agent": used,
        "answered": result is not None,
        "seconds": stats(times),
    }


def tick_calls(nvml: Nvml, source: GpuSource, args: Any) -> list[dict[str, Any]]:
    """The NVML calls Sampler.tick makes for GPU 0, each on its own; the PCIe throughput and
    power reads are marked by whether the agent's sampler really makes them here."""
    assert source.sampler is not None
    device = source.devices[0]
    h = device.handle
    state = source.sampler.accounting()[device.identity.uuid]
    since = state.last_sample_us
    absent = frozenset({NOT_FOUND})
    q = nvml.query
    return [
        cost_row(
            f"nvmlDeviceGetSamples(since newest) [{state.util_mode}]",
            lambda: q("nvmlDeviceGetSamples", h, 1, since, absent=absent) or (),
            args,
        ),
        cost_row(
            "nvmlDeviceGetSamples(whole buffer)",
            lambda: q("nvmlDeviceGetSamples", h, 1, 0, absent=absent),
            args,
            False,
        ),
        cost_row(
            "nvmlDeviceGetUtilizationRates", lambda: q("nvmlDeviceGetUtilizationRates", h), args
        ),
        *(
            cost_row(
                f"nvmlDeviceGetPcieThroughput({way})",
                functools.partial(q, "nvmlDeviceGetPcieThroughput", h, c),
                args,
                state.integrates_pcie,
            )
            for way, c in (("tx", 0), ("rx", 1))
        ),
        cost_row(
            "nvmlDeviceGetPowerUsage",
            lambda: q("nvmlDeviceGetPowerUsage", h),
            args,
            state.integrates_energy,
        ),
    ]


def gpm_calls(nvml: Nvml, device: dev.Device, args: Any) -> list[dict[str, Any]]:
    """The GPM calls a sampler tick makes for one GPU, each timed on its own, and the whole
    of the agent's GPM read (GpmReader.read: every scope of the GPU). Rows are there on
    every GPU; `used_by_agent` says whether this one has GPM (Hopper and later, R520+)."""
    h = device.handle
    has_gpm = gpm.supported(nvml, h)
    support = gpm.GpmSupport(version=gpm.GPM_SUPPORT_VERSION)

    def ok(code: int) -> int | None:
        return code if code == 0 else None

    rows = [
        cost_row(
            "nvmlGpmQueryDeviceSupport (first tick only)",
            lambda: ok(nvml.raw_call("nvmlGpmQueryDeviceSupport", h, ctypes.byref(support))),
            args,
        )
    ]
    if not has_gpm:
        for name in ("nvmlGpmSampleGet", "nvmlGpmMetricsGet", "GpmReader.read"):
            rows.append({"call": name, "used_by_agent": False, "answered": False, "seconds": {}})
        return rows
    first, second = ctypes.c_void_p(), ctypes.c_void_p()
    nvml.raw_call("nvmlGpmSampleAlloc", ctypes.byref(first))
    nvml.raw_call("nvmlGpmSampleAlloc", ctypes.byref(second))
    try:
        nvml.raw_call("nvmlGpmSampleGet", h, first)
        rows.append(
            cost_row(
                "nvmlGpmSampleGet",
                lambda: ok(nvml.raw_call("nvmlGpmSampleGet", h, second)),
                args,
            )
        )
        request = gpm.GpmMetricsGet(version=gpm.GPM_METRICS_GET_VERSION)
        request.numMetrics = len(gpm.METRIC_IDS)
        request.sample1, request.sample2 = first.value, second.value
        for slot, metric in zip(request.metrics, gpm.METRIC_IDS, strict=False):
            slot.metricId = metric
        rows.append(
            cost_row(
                f"nvmlGpmMetricsGet({len(gpm.METRIC_IDS)} metrics)",
                lambda: ok(nvml.raw_call("nvmlGpmMetricsGet", ctypes.byref(request))),
                args,
            )
        )
        instances = gpm.gpu_instances(nvml, h)
        if instances:
            gi = ctypes.c_uint(instances[0])
            rows.append(
                cost_row(
                    f"nvmlGpmMigSampleGet (1 of {len(instances)} GPU instances)",
                    lambda: ok(nvml.raw_call("nvmlGpmMigSampleGet", h, gi, second)),
                    args,
                )
            )
    finally:
        nvml.raw_call("nvmlGpmSampleFree", first)
        nvml.raw_call("nvmlGpmSampleFree", second)
    reader = gpm.GpmReader(nvml, h, time.monotonic)
    reader.read()  # support, scopes, first samples
    try:
        rows.append(cost_row("GpmReader.read (every scope of the GPU)", reader.read, args))
    finally:
        reader.close()
    return rows


def scrape_calls(nvml: Nvml, device: dev.Device, args: Any) -> list[dict[str, Any]]:
    h = device.handle
    request = gpu_fields.device_fields(dev.nvlink_count(nvml, device))
    rows = [
        cost_row(
            f"{name}{args_ if args_ else '()'}",
            functools.partial(nvml.query, name, h, *args_),
            args,
        )
        for name, args_ in SCRAPE_CALLS
    ]
    rows.append(
        cost_row(
            f"nvmlDeviceGetFieldValues({len(request.ids)} fields)",
            lambda: nvml.field_values(h, request.ids),
            args,
        )
    )
    reader = ProcessReader(nvml)
    rows.append(
        cost_row(
            "ProcessReader.read (process list + utilization)",
            lambda: reader.read(device) or (),
            args,
        )
    )
    rows.append(
        cost_row(
            "nvmlDeviceGetProcessUtilization(since now-1s)",
            lambda: (
                nvml.query(
                    "nvmlDeviceGetProcessUtilization",
                    h,
                    int((time.time() - 1) * 1e6),
                    absent=frozenset({NOT_FOUND}),
                )
                or ()
            ),
            args,
        )
    )
    return rows


def check_costs(nvml: Nvml, source: GpuSource, args: Any) -> Check:
    sampler = Sampler(nvml, source.devices, source.clock, interval=args.sample_interval)
    first, _ = timed(sampler.tick, 1, 0.0)  # probes each GPU once
    ticks, _ = timed(sampler.tick, args.reps, args.budget)
    sampler.stop()  # frees its GPM sample buffers
    collects, _ = timed(source.read, args.reps, args.budget)
    tick, collect = stats(ticks), stats(collects)
    details = {
        "gpus": len(source.devices),
        "sample_interval_s": args.sample_interval,
        "first_tick_s": first[0],
        "tick_s": tick,
        "collect_s": collect,
        "per_tick_calls_gpu0": tick_calls(nvml, source, args)
        + gpm_calls(nvml, source.devices[0], args),
        "per_scrape_calls_gpu0": scrape_calls(nvml, source.devices[0], args),
    }
    problems = []
    if (tick["p90"] or 0) > TICK_SHARE * args.sample_interval:
        problems.append(
            f"sampler tick p90 {ms(tick['p90'])} over {len(source.devices)} GPUs, "
            f"more than 30% of its {args.sample_interval:g} s interval"
        )
    if (collect["p90"] or 0) > COLLECT_BUDGET:
        problems.append(
            f"GpuSource.read() p90 {ms(collect['p90'])} over "
            f"{len(source.devices)} GPUs, more than {ms(COLLECT_BUDGET)}"
        )
    ok = (
        f"tick median {ms(tick['median'])} / p90 {ms(tick['p90'])}, collect median "
        f"{ms(collect['median'])} / p90 {ms(collect['p90'])} ({len(source.devices)} GPUs)"
    )
    return verdict("costs", problems, ok, details)

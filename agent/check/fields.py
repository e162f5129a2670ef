"""Check `fields`: the agent's batched nvmlDeviceGetFieldValues request, field by field."""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from gpuscope.agent.check.common import (
    FAIL,
    FIELD_BUDGET,
    Check,
    error_names,
    ms,
    stats,
    timed,
    verdict,
)
from gpuscope.agent.gpu import device as dev
from gpuscope.agent.gpu import fields as gpu_fields
from gpuscope.agent.gpu.nvml import Nvml, union_value

PROBE_FIELDS = (0, 250, 1000, 9999)  # field ids no driver knows: how does it answer?


def read_slot(v: Any) -> dict[str, Any]:
    """One nvmlFieldValue_t as NVML filled it in (pynvml's attribute override bypassed)."""
    get = ctypes.Structure.__getattribute__
    ret, vtype = int(get(v, "nvmlReturn")), int(get(v, "valueType"))
    return {
        "return": ret,
        "value_type": vtype,
        "value": union_value(vtype, get(v, "value")) if ret == 0 else None,
        "latency_us": int(get(v, "latencyUsec")),
        "timestamp_us": int(get(v, "timestamp")),
    }


def fields_alone(nvml: Nvml, handle: Any, ids: Sequence[tuple[int, int]]) -> list[Any]:
    """Each (field, scope) in a call of its own: its return code, or the call's error."""
    out: list[Any] = []
    for pair in ids:
        try:
            out.append(read_slot(nvml.field_slots(handle, (pair,))[0])["return"])
        except nvml.lib.NVMLError as exc:
            out.append(f"call failed: {exc}")
    return out


def check_fields(nvml: Nvml, device: dev.Device, args: Any) -> Check:
    request = gpu_fields.device_fields(dev.nvlink_count(nvml, device))
    names = error_names(nvml.lib)
    try:
        raw_times, values = timed(
            lambda: nvml.field_slots(device.handle, request.ids), args.reps, args.budget
        )
    except nvml.lib.NVMLError as exc:
        return Check("fields", FAIL, f"nvmlDeviceGetFieldValues failed: {exc}", {})
    agent_times, _ = timed(
        lambda: nvml.field_values(device.handle, request.ids), args.reps, args.budget
    )
    alone = fields_alone(nvml, device.handle, request.ids)
    rows = []
    for key, (fid, scope), v, single in zip(request.keys, request.ids, values, alone, strict=True):
        row = {"key": f"{key[0]}/{key[1]}", "field": fid, "scope": scope, **read_slot(v)}
        row.update(alone=single, return_name=names.get(row["return"], str(row["return"])))
        rows.append(row)
    probes = dict(
        zip(
            map(str, PROBE_FIELDS),
            fields_alone(nvml, device.handle, [(f, 0) for f in PROBE_FIELDS]),
            strict=True,
        )
    )
    batched = stats(raw_times)
    details = {
        "gpu": 0,
        "fields": len(rows),
        "nvlink_count": device.nvlink_count,
        "batched_s": batched,
        "agent_path_s": stats(agent_times),
        "per_field": rows,
        "unknown_field_probes": probes,
        "returns": dict(Counter(r["return_name"] for r in rows)),
    }
    return verdict(
        "fields",
        field_problems(rows, batched, names),
        (
            f"{len(rows)} fields in {ms(batched['median'])} (median), returns "
            f"{details['returns']}, unknown ids answer {probes}"
        ),
        details,
    )


def field_problems(
    rows: Sequence[Mapping[str, Any]], batched: Mapping[str, Any], names: Mapping[int, str]
) -> list[str]:
    """Codes the agent would count as errors on every scrape, answers that change when a
    field is asked alone, and a batched call too slow for the collection budget."""
    problems = []
    bad = [r for r in rows if r["return"] not in (0, 3, 13)]
    if bad:
        listed = ", ".join(f"{r['key']} (field {r['field']}): {r['return_name']}" for r in bad[:8])
        problems.append(
            f"{len(bad)} fields answered codes the agent counts as errors on every scrape: {listed}"
        )
    differ = [r for r in rows if r["alone"] != r["return"]]
    if differ:
        listed = ", ".join(
            f"{r['key']}: batched {r['return_name']}, alone "
            f"{names.get(r['alone'], r['alone']) if isinstance(r['alone'], int) else r['alone']}"
            for r in differ[:8]
        )
        problems.append(f"{len(differ)} fields answer differently alone: {listed}")
    median = batched["median"]
    if median is not None and median > FIELD_BUDGET:
        problems.append(
            f"batched nvmlDeviceGetFieldValues latency {ms(median)} (median), "
            f"more than {ms(FIELD_BUDGET)} of the collection budget"
        )
    return problems

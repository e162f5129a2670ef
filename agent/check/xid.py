"""Checks `xid_registration` and `xid_delivery`: XID events registered, and a provoked one
counted."""

from __future__ import annotations

import ctypes
import json
import subprocess
import time
from typing import TYPE_CHECKING, Any

from gpuscope.agent.check.common import (
    FAIL,
    PASS,
    Check,
    Metrics,
    child_env,
    myself,
    not_checked,
    value,
    verdict,
)
from gpuscope.agent.check.load import HookLoad, Load
from gpuscope.agent.gpu.xid import NVML_EVENT_TYPE_XID_CRITICAL_ERROR

if TYPE_CHECKING:
    from gpuscope.agent.gpu.nvml import Nvml
    from gpuscope.agent.gpu.source import GpuSource


def check_xid_registration(nvml: Nvml, source: GpuSource, final: Metrics) -> Check:
    per_gpu, problems = {}, []
    for device in source.devices:
        i = str(device.identity.index)
        supported = nvml.query("nvmlDeviceGetSupportedEventTypes", device.handle)
        watched = value(final, "gpuscope_gpu_xid_events_watched", gpu=i)
        per_gpu[i] = {"supported_event_types": supported, "watched": watched}
        if supported is not None and not supported & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
            continue  # the GPU does not report XIDs: nothing to register
        if watched != 1:
            problems.append(
                f"GPU {i}: XID events not registered (supported event types "
                f"{hex(supported) if supported is not None else 'unknown'}): "
                f"gpuscope_gpu_xid_events_watched {watched}"
            )
    errors = [f"{f}: {m}" for (f, m), _ in source.nvml.errors.items() if "Event" in f]
    details = {"per_gpu": per_gpu, "agent_event_errors": errors}
    if errors and problems:
        problems.append(f"agent errors: {'; '.join(errors)}")
    watched_n = sum(1 for g in per_gpu.values() if g["watched"] == 1)
    return verdict(
        "xid_registration", problems, f"{watched_n} of {len(per_gpu)} GPUs watched", details
    )


NOT_PROVOKED = (
    "not provoked: pass --provoke-xid to fault a kernel in a child process of this script "
    "(a store to address 0 on GPU 0: CUDA_ERROR_ILLEGAL_ADDRESS, which the driver reports as "
    "XID 31). It needs no root and harms no other context, but the kernel logs it and node "
    "health monitors may react, so it is off by default"
)


def provoke(load: Load | None) -> tuple[dict[str, Any], str]:
    """Cause one XID on GPU 0; returns what happened and, if nothing could be done, why."""
    if isinstance(load, HookLoad):
        return {"how": "hook"}, "" if load.run("xid", "0") else load.error
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return {}, f"libcuda.so.1 not loadable: {exc}"
    done = subprocess.run(
        [*myself(), "--fault-child"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        child = json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {"stderr": done.stderr[-400:]}, f"fault child failed (rc {done.returncode})"
    if child.get("error") or child.get("sync") == 0:
        return child, f"the kernel did not fault: {child}"
    return {"how": "cuda", **child}, ""


def check_xid_delivery(args: Any, load: Load | None, source: GpuSource) -> Check:
    if not args.provoke_xid:
        return not_checked("xid_delivery", NOT_PROVOKED)
    assert source.xid is not None
    uuid = source.devices[0].identity.uuid
    if uuid not in source.xid.watched:
        return not_checked("xid_delivery", "GPU 0 is not watched for XID events")
    before = dict(source.xid.counts(uuid))
    t0 = time.monotonic()
    details, why = provoke(load)
    if why:
        return not_checked("xid_delivery", why, details)
    while time.monotonic() - t0 < args.xid_wait:
        after = dict(source.xid.counts(uuid))
        new = {x: n - before.get(x, 0) for x, n in after.items() if n > before.get(x, 0)}
        if new:
            details.update(new_xids=new, seconds=time.monotonic() - t0)
            return Check(
                "xid_delivery",
                PASS,
                f"XID {new} counted on GPU 0 in {time.monotonic() - t0:.1f} s",
                details,
            )
        time.sleep(0.1)
    return Check(
        "xid_delivery",
        FAIL,
        f"an XID was provoked on GPU 0 ({details}) but none reached the agent "
        f"in {args.xid_wait:g} s",
        details,
    )

"""After a fatal XID the agent stops calling that GPU, as DCGM does: it reads as fenced and
down, no NVML call reaches it but one cheap probe with backoff on the agent's clock, and a
probe that answers (after a reset, say) brings it back."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gpuscope.agent.gpu.nvml import GPU_IS_LOST, Nvml
from gpuscope.agent.gpu.xid import FATAL_XIDS, handle_address
from tests.support import T0, InProcess, wait_for


def calls_on(h: InProcess, gpu: int) -> list[str]:
    """Record every NVML function the agent calls on one GPU's handle, from now on."""
    nvml: Nvml = h.gpu.nvml
    address = handle_address(h.gpu.devices[gpu].handle)
    seen: list[str] = []

    def on(handle: Any) -> bool:
        try:
            return handle_address(handle) == address
        except Exception:  # noqa: BLE001 - not a handle
            return False

    def wrap(method: Callable[..., Any], first: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            name, handle = first(*args)
            if handle is not None and on(handle):
                seen.append(name)
            return method(*args, **kwargs)

        return wrapped

    invoke, raw, fetch = nvml._invoke, nvml.raw_call, nvml.field_slots
    nvml._invoke = wrap(invoke, lambda f, a: (f, a[0] if a else None))  # type: ignore[method-assign]
    nvml.raw_call = wrap(raw, lambda f, *a: (f, a[0] if a else None))  # type: ignore[method-assign]
    nvml.field_slots = wrap(fetch, lambda h, r: ("nvmlDeviceGetFieldValues", h))  # type: ignore[method-assign]
    return seen


def tick_to(h: InProcess, t: float) -> None:
    """Tick the sampler (where probes run) once per second up to `t` s after the start."""
    h.advance(t - (h.clock.monotonic() - T0))


def fence(h: InProcess, gpu: int, xid: int) -> None:
    h.fake.inject_xid(gpu, xid)
    wait_for(lambda: h.gpu.gates.gate(gpu).fenced_xid == xid, what=f"GPU {gpu} fenced")


def test_the_fatal_xids_are_the_ones_that_stop_the_driver_answering() -> None:
    assert frozenset({79, 119, 120}) == FATAL_XIDS


def test_a_fatal_xid_fences_the_gpu_and_a_probe_backs_off_until_it_answers(
    inprocess, caplog
) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    seen = calls_on(h, 2)
    with caplog.at_level(logging.INFO, logger="gpuscope.gpu"):
        fence(h, 2, 119)
        h.fake.error_storm(GPU_IS_LOST, function="nvmlDeviceGetTemperature", gpu=2)
        seen.clear()

        h.advance(2)  # past --collection-max-age
        metrics = h.scrape()
        assert metrics.value("gpuscope_gpu_up", gpu="2") == 0
        assert metrics.value("gpuscope_gpu_fenced", gpu="2") == 1
        assert metrics.series("gpuscope_gpu_fatal_xid_info", gpu="2", xid="119")
        assert metrics.value("gpuscope_gpu_xid_errors_total", gpu="2", xid="119") == 1
        assert metrics.get("gpuscope_gpu_memory_used_bytes", gpu="2") is None
        assert metrics.value("gpuscope_gpu_fenced", gpu="1") == 0
        assert metrics.value("gpuscope_gpu_up", gpu="1") == 1

        # Probes at 10, 30, 70, 150 s after the XID (10 s doubling), nothing else.
        for t, probes in ((9, 0), (10, 1), (29, 1), (30, 2), (69, 2), (70, 3), (149, 3)):
            tick_to(h, t)
            h.scrape()
            assert seen == ["nvmlDeviceGetTemperature"] * probes, t
        h.fake.clear_error_storm()  # a reset: the GPU answers again
        tick_to(h, 150)
        assert seen == ["nvmlDeviceGetTemperature"] * 4

        h.advance(2)
        back = h.scrape()
    assert back.value("gpuscope_gpu_up", gpu="2") == 1
    assert back.value("gpuscope_gpu_fenced", gpu="2") == 0
    assert not back.series("gpuscope_gpu_fatal_xid_info")
    assert back.get("gpuscope_gpu_memory_used_bytes", gpu="2") is not None
    assert len(seen) > 4  # read again
    lines = [r.getMessage() for r in caplog.records if "GPU 2 (" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "XID 119 is fatal" in lines[0]
    assert "answers a probe after XID 119" in lines[1]


def test_a_gpu_fallen_off_the_bus_stays_fenced_until_it_is_back(inprocess) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    h.fake.lose_gpu(4)
    fence(h, 4, 79)
    tick_to(h, 31)  # two probes, both answered GPU_IS_LOST
    assert h.scrape().value("gpuscope_gpu_fenced", gpu="4") == 1
    h.fake.restore_gpu(4)
    tick_to(h, 71)
    metrics = h.scrape()
    assert metrics.value("gpuscope_gpu_fenced", gpu="4") == 0
    assert metrics.value("gpuscope_gpu_up", gpu="4") == 1


def test_other_xids_are_counted_and_the_gpu_is_still_read(inprocess) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    h.fake.inject_xid(0, 48)  # a double-bit ECC error: the driver still answers
    wait_for(
        lambda: h.gpu.xid is not None and h.gpu.xid.counts(h.fake.gpu_uuid(0)).get(48) == 1,
        what="XID 48 counted",
    )
    h.advance(2)
    metrics = h.scrape()
    assert metrics.value("gpuscope_gpu_fenced", gpu="0") == 0
    assert metrics.value("gpuscope_gpu_up", gpu="0") == 1
    assert metrics.get("gpuscope_gpu_memory_used_bytes", gpu="0") is not None

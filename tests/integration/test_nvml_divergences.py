"""Where real drivers and bindings are less kind than the fake used to be (issue "truth on
real NVIDIA drivers"): a function the bindings or the driver lack, an XID registration the
driver refuses, a GPU that appears after start, an XID storm. Each drives the real pynvml
bindings over the fake library; what a real driver does differently is injected at pynvml's
own boundary (its function-pointer lookup, its wrappers), so the agent sees exactly the
exceptions pynvml raises on such a driver."""

from __future__ import annotations

import logging
import os
from typing import Any

import pynvml
import pytest

from tests.support import wait_for

FUNCTION_NOT_FOUND = 13
NOT_SUPPORTED = 3


def _without_symbol(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The loaded library lacks `name`, as a driver from before it was added does: pynvml's
    lookup raises NVMLError(FUNCTION_NOT_FOUND), and unversioned wrappers over it raise
    NVMLLibraryMismatchError."""
    lookup = pynvml._nvmlGetFunctionPointer

    def missing(fn: str) -> Any:
        if fn == name:
            raise pynvml.NVMLError(FUNCTION_NOT_FOUND)
        return lookup(fn)

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", missing)


@pytest.mark.pinned_bindings("removes a function the oldest bindings do not have")
def test_bindings_without_a_function_read_it_as_unsupported(inprocess, monkeypatch) -> None:
    """nvidia-ml-py 12.535 has no nvmlDeviceGetNumaNodeId: the GPU collector still starts,
    and the NUMA node is simply unknown."""
    monkeypatch.delattr(pynvml, "nvmlDeviceGetNumaNodeId")
    h = inprocess("dgx-h100")
    m = h.scrape()
    assert m.value("gpuscope_collector_success", collector="gpu") == 1
    assert len(m.series("gpuscope_gpu_up")) == 8
    assert m.series("gpuscope_gpu_info", gpu="0", numa_node="")
    assert not any("nvmlDeviceGetNumaNodeId" in f for f, _ in h.gpu.nvml.errors)


@pytest.mark.pinned_bindings("NVMLLibraryMismatchError exists from nvidia-ml-py 12.550")
def test_a_driver_without_v3_process_calls_falls_back_to_v2(inprocess, monkeypatch) -> None:
    """Before driver 510 there is no nvmlDeviceGetComputeRunningProcesses_v3, and pynvml's
    unversioned wrapper raises NVMLLibraryMismatchError, which is not an NVMLError."""
    _without_symbol(monkeypatch, "nvmlDeviceGetComputeRunningProcesses_v3")
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(None)

    def setup(fake: Any) -> None:
        fake.add_process(2, os.getpid(), used_memory_bytes=3 << 30)

    h = inprocess("dgx-h100", setup=setup)
    m = h.scrape()
    assert m.value("gpuscope_collector_success", collector="gpu") == 1
    assert m.value("gpuscope_pod_gpu_memory_bytes", gpu="2") == 3 << 30


def _refuse_registration(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    """The driver refuses XID events for one GPU (NOT_SUPPORTED from RegisterEvents)."""
    register = pynvml.nvmlDeviceRegisterEvents

    def refusing(handle: Any, types: int, event_set: Any) -> None:
        if pynvml.nvmlDeviceGetIndex(handle) == index:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        register(handle, types, event_set)

    monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", refusing)


def test_a_refused_xid_registration_is_said_not_hidden(inprocess, monkeypatch, caplog) -> None:
    _refuse_registration(monkeypatch, 3)
    with caplog.at_level(logging.WARNING, logger="gpuscope.gpu.xid"):
        h = inprocess("dgx-h100", "--metrics-detail", "full")
    m = h.scrape()
    assert m.value("gpuscope_gpu_xid_events_watched", gpu="3") == 0
    assert all(m.value("gpuscope_gpu_xid_events_watched", gpu=str(g)) == 1 for g in (0, 7))
    assert "GPU 3: XID events not registered" in caplog.text
    assert h.gpu.xid is not None
    assert h.fake.gpu_uuid(3) not in h.gpu.xid.watched


def test_a_gpu_found_after_start_is_registered_for_xids(inprocess) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full", setup=lambda fake: fake.lose_gpu(7))
    assert h.scrape().value("gpuscope_gpu_up", gpu="7") == 0
    h.fake.restore_gpu(7)
    m = h.scrape()
    assert m.value("gpuscope_gpu_up", gpu="7") == 1
    assert m.value("gpuscope_gpu_xid_events_watched", gpu="7") == 1
    h.fake.inject_xid(7, 13)
    wait_for(
        lambda: h.scrape().by_label("gpuscope_gpu_xid_errors_total", "xid", gpu="7") == {"13": 1},
        what="the XID on the late GPU",
    )


def test_an_xid_storm_is_counted_in_full_and_logged_once(inprocess, caplog) -> None:
    h = inprocess("dgx-h100")
    with caplog.at_level(logging.WARNING, logger="gpuscope.gpu.xid"):
        for _ in range(40):
            h.fake.inject_xid(4, 31)
        wait_for(
            lambda: (
                h.scrape().by_label("gpuscope_gpu_xid_errors_total", "xid", gpu="4") == {"31": 40}
            ),
            what="40 XIDs counted",
        )
    lines = [r.getMessage() for r in caplog.records if "XID 31" in r.getMessage()]
    assert len(lines) == 1, lines


def test_a_dry_sample_ring_on_an_idle_gpu_still_accrues_idle_time(inprocess, monkeypatch) -> None:
    """A real driver's utilization ring holds no new sample while the GPU idles
    (nvmlDeviceGetSamples answers NOT_FOUND): the agent then reads the current rate, so the
    reserved-but-idle clock keeps running instead of the time going unsampled."""
    h = inprocess("dgx-h100")
    h.fake.set_utilization(5, 0)
    samples = pynvml.nvmlDeviceGetSamples
    dry = pynvml.nvmlDeviceGetHandleByIndex(5)

    def dry_when_idle(handle: Any, kind: int, since: int) -> Any:
        if pynvml.nvmlDeviceGetIndex(handle) == pynvml.nvmlDeviceGetIndex(dry):
            raise pynvml.NVMLError(6)  # NVML_ERROR_NOT_FOUND
        return samples(handle, kind, since)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", dry_when_idle)
    h.advance(30)
    util = h.gpu.sampler._states[h.fake.gpu_uuid(5)].util  # type: ignore[union-attr]
    assert util.idle_seconds == pytest.approx(29, abs=1.01)  # all but the first reading
    assert util.busy_seconds == 0
    # At the default detail level the counter is served once any time went unsampled.
    assert (h.scrape().get("gpuscope_gpu_unsampled_seconds_total", gpu="5") or 0.0) <= 1.01


def test_fabric_registration_completing_after_start_reaches_the_labels(inprocess) -> None:
    """On Hopper/Blackwell with NVSwitch, Fabric Manager registration can complete after
    the agent started: the NVLink-domain labels appear on the next labels round, without a
    restart; before it completes, no domain is claimed and no status is read."""
    from gpuscope.agent.app.config import parse
    from gpuscope.agent.labels.loop import LabelsLoop

    def registering(fake: Any) -> None:
        for g in range(fake.gpu_count()):
            fake.set_fabric(g, state="in_progress", status=1)  # status: meaningless yet

    h = inprocess("gb200-nvl", setup=registering)
    published: list[dict[str, str]] = []
    loop = LabelsLoop(
        parse(["--collectors", "gpu", "--labels-mode", "file"], env={}),
        h.agent.runner,
        h.gpu,
        lambda labels, _annotations, _snap: published.append(dict(labels)) is None,
    )
    loop.run_once()
    assert "gpuscope.io/nvlink.domain" not in published[-1]
    assert all(not f.completed for f in h.gpu.topology.fabric.values())

    for g in range(h.fake.gpu_count()):
        h.fake.set_fabric(g, state="completed", status=0)
    loop.run_once()
    domain = published[-1]["gpuscope.io/nvlink.domain"]
    assert published[-1]["gpuscope.io/nvlink.clique"] == f"{domain}.7"
    assert not any("Fabric" in f for f, _ in h.gpu.nvml.errors)


def test_blackwell_nvlink_errors_come_from_the_nvlink5_counters(inprocess) -> None:
    """On Blackwell, NVML answers NOT_SUPPORTED for the DL replay/recovery/CRC fields; the
    link recovery counters take their place, so NVLink error alerts do not go quiet."""
    h = inprocess("gb200-nvl", "--metrics-detail", "full")
    h.fake.add_nvlink_errors(0, 3, "recovery", 4)
    h.fake.set_nvlink_up(0, 5, False)
    m = h.scrape()
    errors = "gpuscope_gpu_nvlink_link_errors_total"
    assert m.value(errors, gpu="0", link="3", type="recovery") == 4
    assert m.value(errors, gpu="0", link="5", type="recovery_failed") == 1
    assert not m.series(errors, gpu="0", type="replay")
    assert m.value("gpuscope_gpu_nvlink_errors_total", gpu="0", type="recovery_failed") == 1
    assert not any("FieldValues" in f for f, _ in h.gpu.nvml.errors)


def test_hopper_nvlink_errors_keep_the_dl_counters(inprocess) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    h.fake.add_nvlink_errors(1, 2, "replay", 3)
    m = h.scrape()
    assert m.value("gpuscope_gpu_nvlink_link_errors_total", gpu="1", link="2", type="replay") == 3
    assert m.value("gpuscope_gpu_nvlink_errors_total", gpu="1", type="replay") == 3
    assert not m.series("gpuscope_gpu_nvlink_errors_total", type="recovery_failed")


def test_the_oldest_supported_driver_branch_r470_serves_every_gpu(inprocess) -> None:
    """R470 (A100 fleets): no _v3 process calls, no NUMA node, fabric or NVLink DL fields in
    NVML. Every GPU is served, processes come from _v2, and no call is counted as failing."""

    def setup(fake: Any) -> None:
        fake.add_process(3, os.getpid(), used_memory_bytes=2 << 30)

    h = inprocess("hgx-a100-r470", setup=setup)
    m = h.scrape()
    assert m.value("gpuscope_collector_success", collector="gpu") == 1
    assert len(m.series("gpuscope_gpu_up")) == 8
    assert m.series("gpuscope_gpu_info", driver_version="470.223.02")
    assert m.value("gpuscope_pod_gpu_memory_bytes", gpu="3") == 2 << 30
    assert m.get("gpuscope_gpu_memory_used_bytes", gpu="0") is not None
    assert dict(h.gpu.nvml.errors) == {}


def _pynvml_entry_size() -> int:
    """The running-process entry the installed nvidia-ml-py passes (24 or 32 bytes)."""
    import ctypes

    entry = getattr(pynvml, "c_nvmlProcessInfo_v3_t", None) or pynvml.c_nvmlProcessInfo_t
    return ctypes.sizeof(entry)


def test_early_r535_process_entries_are_read_with_their_own_layout(inprocess) -> None:
    """Driver 535.54's nvml.h declared nvmlProcessInfo_t with usedGpuCcProtectedMemory (32
    bytes); 535.104 moved it out. pynvml 13 passes 24-byte entries, so every process after
    the first was misread; the agent lays the entries out as the driver writes them."""
    pids = [os.getpid(), os.getppid(), 1]

    def setup(fake: Any) -> None:
        fake.set_driver("535.54.03")
        for i, pid in enumerate(pids):
            fake.add_process(6, pid, used_memory_bytes=(i + 1) << 30)

    h = inprocess("dgx-h100", setup=setup)
    if _pynvml_entry_size() == 24:  # pynvml 13's own struct misreads this driver's list
        handle = pynvml.nvmlDeviceGetHandleByIndex(6)
        assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)] != pids
    procs = next(r for r in h.gpu.read().gpus if r.identity.index == 6).processes
    assert [(p.pid, p.used_memory_bytes) for p in procs] == sorted(
        (pid, (i + 1) << 30) for i, pid in enumerate(pids)
    )


def test_r535_104_and_later_write_the_short_entry(inprocess) -> None:
    def setup(fake: Any) -> None:
        fake.set_driver("535.104.05")
        fake.add_process(2, os.getpid(), used_memory_bytes=1 << 30)
        fake.add_process(2, 1, used_memory_bytes=2 << 30)

    h = inprocess("dgx-h100", setup=setup)
    if _pynvml_entry_size() == 24:  # pynvml 12.535's 32-byte struct misreads this one
        handle = pynvml.nvmlDeviceGetHandleByIndex(2)
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        assert sorted(p.pid for p in listed) == sorted([os.getpid(), 1])
    procs = next(r for r in h.gpu.read().gpus if r.identity.index == 2).processes
    assert sorted(p.pid for p in procs) == sorted([os.getpid(), 1])


def _refuse_process_list(monkeypatch: pytest.MonkeyPatch, gpu: int, *, mig_too: bool) -> None:
    """A MIG GPU's process list refused without CAP_SYS_ADMIN (NO_PERMISSION), through the
    parent handle and, with `mig_too`, through every MIG device handle as well."""
    lookup = pynvml._nvmlGetFunctionPointer

    def guarded_lookup(name: str) -> Any:
        fn = lookup(name)
        if not name.startswith("nvmlDeviceGetComputeRunningProcesses"):
            return fn

        def guarded(handle: Any, count: Any, infos: Any) -> int:
            mig = pynvml.nvmlDeviceIsMigDeviceHandle(handle)
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle) if mig else handle
            if pynvml.nvmlDeviceGetIndex(parent) == gpu and (mig_too or not mig):
                return 4  # NVML_ERROR_NO_PERMISSION
            return int(fn(handle, count, infos))

        return guarded

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", guarded_lookup)


def _mig_process(fake: Any) -> None:
    fake.add_process(6, os.getpid(), 5 << 30, mig_uuid=fake.mig_devices(6)[0]["uuid"])


def test_a_mig_gpu_refusing_its_parent_list_is_read_through_its_mig_devices(
    inprocess, monkeypatch
) -> None:
    _refuse_process_list(monkeypatch, 6, mig_too=False)
    h = inprocess("hgx-a100-mig", setup=_mig_process)
    m = h.scrape()
    assert m.value("gpuscope_pod_gpu_memory_bytes", gpu="6") == 5 << 30
    assert not m.series("gpuscope_gpu_processes_refused")


def test_a_refused_process_list_is_said_not_reported_as_empty(inprocess, monkeypatch) -> None:
    _refuse_process_list(monkeypatch, 6, mig_too=True)
    h = inprocess("hgx-a100-mig", setup=_mig_process)
    m = h.scrape()
    assert m.value("gpuscope_gpu_processes_refused", gpu="6") == 1
    assert len(m.series("gpuscope_gpu_processes_refused")) == 1
    assert not m.series("gpuscope_pod_gpu_memory_bytes", gpu="6")

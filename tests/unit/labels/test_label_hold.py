"""What a labels round publishes while the GPUs cannot be read: the labels last published,
with gpu.healthy 0, until an absence is confirmed for the whole grace."""

from __future__ import annotations

from gpuscope.agent.gpu.records import GpuIdentity, GpuReading, GpuSnapshot
from gpuscope.agent.labels.hold import AbsenceClock, Reading, classify, decide
from gpuscope.agent.runtime.sources import SourceResult
from tests.support import gpu_records

P = "gpuscope.io/"
LAST = {
    f"{P}gpu.present": "true",
    f"{P}gpu.count": "8",
    f"{P}gpu.healthy": "8",
    f"{P}gpu.product": "NVIDIA-H100-80GB-HBM3",
    f"{P}gpu.memory": "81559",
    f"{P}gpu.driver.major": "550",
    f"{P}rdma.present": "true",
}
NO_GPU = {f"{P}gpu.present": "false", f"{P}rdma.present": "false"}


def result(
    records: GpuSnapshot | None = None, error: str | None = None, *, absent: bool = False
) -> SourceResult[GpuSnapshot]:
    return SourceResult("gpu", records, error is None, 0.01, error, absent=absent)


def snapshot(*up: bool) -> GpuSnapshot:
    gpus = tuple(GpuReading(identity=identity(i), up=answering) for i, answering in enumerate(up))
    return gpu_records.snapshot(gpus, driver_version="550.54.15", nvml_version="")


def identity(index: int) -> GpuIdentity:
    return gpu_records.identity(index, f"GPU-{index}", pci_bus_id="", serial="", numa_node=None)


def test_what_counts_as_absence_and_what_as_a_fault() -> None:
    assert classify(result(snapshot(True, True))) is Reading.READ
    assert classify(result(snapshot(True, False))) is Reading.PARTIAL
    assert classify(result(snapshot())) is Reading.ABSENT  # NVML works and finds no GPU
    no_driver = "NVIDIA driver is not loaded (nvmlInit: driver not loaded)"
    assert classify(result(error=no_driver, absent=True)) is Reading.ABSENT  # SourceAbsent
    # The words do not decide: the source's typed answer does.
    assert classify(result(error=no_driver)) is Reading.FAILED
    assert classify(result(error="nvmlInit failed: Unknown Error")) is Reading.FAILED
    assert classify(result(error="collector gpu stuck for 12 s")) is Reading.FAILED
    assert classify(None) is Reading.FAILED


def test_a_fault_holds_the_last_labels_with_healthy_0_and_fresh_rdma() -> None:
    d = decide(Reading.FAILED, False, LAST, {f"{P}topology": "{}"}, NO_GPU, {}, P)
    assert d.labels == {**LAST, f"{P}gpu.healthy": "0", f"{P}rdma.present": "false"}
    assert d.annotations == {f"{P}topology": "{}"}
    assert d.holding and not d.withdrawn


def test_gpus_not_answering_keep_what_describes_them_and_count_what_is_true() -> None:
    fresh = {f"{P}gpu.present": "true", f"{P}gpu.count": "8", f"{P}gpu.healthy": "2",
             f"{P}gpu.driver.major": "560", f"{P}rdma.present": "true"}  # fmt: skip
    d = decide(Reading.PARTIAL, False, LAST, None, fresh, {}, P)
    assert d.labels == {**LAST, f"{P}gpu.healthy": "2", f"{P}gpu.driver.major": "560"}


def test_a_confirmed_absence_withdraws_and_nothing_published_means_nothing_held() -> None:
    assert decide(Reading.ABSENT, True, LAST, None, NO_GPU, {}, P).labels == NO_GPU
    assert decide(Reading.ABSENT, True, LAST, None, NO_GPU, {}, P).withdrawn
    assert decide(Reading.FAILED, False, None, None, NO_GPU, {}, P).labels == NO_GPU
    assert decide(Reading.FAILED, False, NO_GPU, None, NO_GPU, {}, P).labels == NO_GPU
    assert not decide(Reading.READ, False, LAST, None, LAST, {}, P).holding


def test_absence_must_last_the_whole_grace_without_a_break() -> None:
    clock = AbsenceClock(600)
    assert not clock.observe(Reading.ABSENT, 0)
    assert not clock.observe(Reading.ABSENT, 599)
    assert clock.deadline() == 600
    assert not clock.observe(Reading.FAILED, 599.5)  # a different fault: not absence
    assert clock.deadline() is None
    assert not clock.observe(Reading.ABSENT, 700)
    assert clock.observe(Reading.ABSENT, 1300)

"""Per-pod cgroup signals on fixture trees: every file parsed, cgroup v2 and the v1 files of
hybrid hosts, a file that is missing (nothing, not zero, no log line), content that is not
the kernel's (dropped, counted, logged once), one read per interval whatever the scrape
rate, and which pods the attribution stage asks for."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from gpuscope.agent.attribution.options import AttributionOptions
from gpuscope.agent.attribution.stage import Attributor
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.gpu.records import GpuProcess, GpuReading
from gpuscope.agent.hostfs import HostFs
from gpuscope.agent.k8s.pod_cgroup_usage import (
    CgroupRoots,
    PodCgroupReader,
    PodCgroupUsage,
    Pressure,
    find_pod_dirs,
    parse_blkio,
    parse_io_stat,
    parse_pressure,
)
from gpuscope.agent.k8s.records import PodMeta, PodsSnapshot
from gpuscope.agent.k8s.workloads import Workload
from gpuscope.agent.runtime.sources import Collection, SourceResult
from tests.support import gpu_records

UID = "eadf4777-07b8-449a-873e-2a219705c38d"
OTHER = "0b6a3f1e-5a4d-4c1b-9f8e-7d6c5b4a3928"
CID = "a" * 64


def systemd_pod(root: Path, uid: str = UID, qos: str = "burstable") -> Path:
    """A pod's cgroup as the kubelet's systemd driver makes it, with one container."""
    pod = (
        root
        / "kubepods.slice"
        / f"kubepods-{qos}.slice"
        / f"kubepods-{qos}-pod{uid.replace('-', '_')}.slice"
    )
    (pod / f"cri-containerd-{CID}.scope").mkdir(parents=True)
    return pod


def psi(some: int, full: int | None = None) -> str:
    text = f"some avg10=0.00 avg60=0.00 avg300=0.00 total={some}\n"
    if full is not None:
        text += f"full avg10=0.00 avg60=0.00 avg300=0.00 total={full}\n"
    return text


def write(directory: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (directory / name).write_text(text)


V2_FILES = {
    "cpu.pressure": psi(2_500_000, 1_000_000),
    "memory.pressure": psi(30, 10),
    "io.pressure": psi(4_000_000, 3_000_000),
    "cpu.stat": "usage_usec 900\nuser_usec 600\nsystem_usec 300\nnr_periods 40\n"
    "nr_throttled 12\nthrottled_usec 1500000\nnr_bursts 0\nburst_usec 0\n",
    "io.stat": "254:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n"
    "259:1 rbytes=1000 wbytes=0 rios=3 wios=0 dbytes=0 dios=0\n",
    "memory.events": "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n",
}

BLKIO_BYTES = (
    "8:0 Read 4096\n8:0 Write 512\n8:0 Sync 4608\n8:0 Async 0\n8:0 Discard 0\n8:0 Total 4608\n"
    "8:16 Read 100\n8:16 Write 0\n8:16 Total 100\nTotal 4708\n"
)
BLKIO_OPS = "8:0 Read 3\n8:0 Write 1\n8:0 Total 4\nTotal 4\n"


# --- parsers ----------------------------------------------------------------------------------


def test_pressure_totals_are_microseconds_for_some_and_full() -> None:
    assert parse_pressure(psi(2_500_000, 1_000_000)) == Pressure(2.5, 1.0)
    assert parse_pressure(psi(30)) == Pressure(30e-6, None)  # kernels before full for cpu
    assert parse_pressure("") is None
    assert parse_pressure("some avg10=0.00 total=x\n") is None


def test_io_stat_sums_read_and_write_over_devices() -> None:
    assert parse_io_stat(V2_FILES["io.stat"]) == (5096, 8192, 4, 2)
    assert parse_io_stat("") == (0, 0, 0, 0)  # the controller is on and nothing was read
    assert parse_io_stat("254:0 rbytes=lots\n") is None
    assert parse_io_stat("rbytes=1\n") is None


def test_blkio_sums_devices_and_skips_the_total_line() -> None:
    assert parse_blkio(BLKIO_BYTES) == (4196, 512)
    assert parse_blkio(BLKIO_OPS) == (3, 1)
    assert parse_blkio("Total 0\n") == (0, 0)
    assert parse_blkio("8:0 Read many\n") is None


# --- reading pods -----------------------------------------------------------------------------


def test_every_v2_file_of_a_pod_is_read_in_base_units(tmp_path: Path) -> None:
    write(systemd_pod(tmp_path), V2_FILES)
    got = PodCgroupReader(CgroupRoots(tmp_path), clock=ManualClock()).read({UID})
    assert got == {
        UID: PodCgroupUsage(
            pod_uid=UID,
            cpu_pressure=Pressure(2.5, 1.0),
            memory_pressure=Pressure(30e-6, 10e-6),
            io_pressure=Pressure(4.0, 3.0),
            cpu_throttled_periods=12,
            cpu_throttled_seconds=1.5,
            io_read_bytes=5096,
            io_write_bytes=8192,
            io_read_operations=4,
            io_write_operations=2,
            oom_kills=2,
        )
    }


def test_a_pod_whose_controllers_are_not_enabled_gets_nothing_for_them_and_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Only PSI and the core cpu.stat (no nr_throttled without the cpu controller).
    write(
        systemd_pod(tmp_path),
        {"cpu.pressure": psi(10), "cpu.stat": "usage_usec 9\nuser_usec 5\nsystem_usec 4\n"},
    )
    caplog.set_level(logging.INFO)
    reader = PodCgroupReader(CgroupRoots(tmp_path), clock=ManualClock())
    assert reader.read({UID}) == {UID: PodCgroupUsage(UID, cpu_pressure=Pressure(10e-6, None))}
    assert caplog.records == []
    assert sum(reader.fs.counts().values()) == 0


def test_a_pod_without_a_cgroup_here_is_left_out(tmp_path: Path) -> None:
    write(systemd_pod(tmp_path), V2_FILES)
    assert set(PodCgroupReader(CgroupRoots(tmp_path), clock=ManualClock()).read({UID, OTHER})) == {
        UID
    }


def test_a_hybrid_host_reads_throttling_blkio_and_oom_kills_from_v1(tmp_path: Path) -> None:
    (tmp_path / "fs" / "cgroup" / "unified").mkdir(parents=True)
    base = tmp_path / "fs" / "cgroup"
    (base / "unified" / "cgroup.controllers").write_text("hugetlb\n")
    for controller, marker in (
        ("cpu", "cpu.stat"),
        ("blkio", "blkio.throttle.io_service_bytes"),
        ("memory", "memory.oom_control"),
    ):
        (base / controller).mkdir()
        (base / controller / marker).write_text("")
    write(systemd_pod(base / "unified"), {"io.pressure": psi(7_000_000, 6_000_000)})
    write(
        systemd_pod(base / "cpu"),
        {"cpu.stat": "nr_periods 33\nnr_throttled 33\nthrottled_time 2919677873\n"},
    )
    write(
        systemd_pod(base / "blkio"),
        {
            "blkio.throttle.io_service_bytes": "Total 0\n",  # the pod itself has no tasks
            "blkio.throttle.io_service_bytes_recursive": BLKIO_BYTES,
            "blkio.throttle.io_serviced_recursive": BLKIO_OPS,
        },
    )
    write(
        systemd_pod(base / "memory"),
        {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"},
    )
    roots = CgroupRoots.detect(tmp_path)
    assert roots == CgroupRoots(base / "unified", base / "cpu", base / "blkio", base / "memory")
    usage = PodCgroupReader(roots, clock=ManualClock()).read({UID})[UID]
    assert usage == PodCgroupUsage(
        UID,
        io_pressure=Pressure(7.0, 6.0),
        cpu_throttled_periods=33,
        cpu_throttled_seconds=2.919677873,
        io_read_bytes=4196,
        io_write_bytes=512,
        io_read_operations=3,
        io_write_operations=1,
        oom_kills=1,
    )


def test_a_unified_host_reads_no_v1_hierarchy(tmp_path: Path) -> None:
    base = tmp_path / "fs" / "cgroup"
    (base / "cpu").mkdir(parents=True)  # a cgroup that happens to be named cpu
    (base / "cpu" / "cpu.stat").write_text("usage_usec 1\n")
    (base / "cgroup.controllers").write_text("cpu io memory\n")
    assert CgroupRoots.detect(tmp_path) == CgroupRoots(base)
    assert CgroupRoots.detect(tmp_path, tmp_path / "elsewhere") == CgroupRoots(
        tmp_path / "elsewhere"
    )


def test_content_that_is_not_the_kernels_drops_that_signal_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = dict(V2_FILES, **{"io.stat": "254:0 rbytes=\xff\n", "cpu.pressure": "garbage\n"})
    write(systemd_pod(tmp_path), files)
    clock = ManualClock()
    reader = PodCgroupReader(CgroupRoots(tmp_path), clock=clock, fs=HostFs("pod cgroups"))
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        usage = reader.read({UID})[UID]
        clock.advance(5)
    assert usage.cpu_pressure is None and usage.io_read_bytes is None
    assert usage.memory_pressure == Pressure(30e-6, 10e-6) and usage.oom_kills == 2
    assert reader.fs.counts()["invalid"] == 6
    assert len(caplog.records) == 2, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("memory.events", "low 0\nhigh 0\nmax 7\noom 2\noom_kill 184467440737095516159999999\n"),
        ("cpu.stat", f"nr_periods 40\nnr_throttled {2**64}\nthrottled_usec 1500000\n"),
        ("io.stat", f"254:0 rbytes={2**64} wbytes=8192 rios=1 wios=2\n"),
        ("cpu.pressure", f"some avg10=0.00 avg60=0.00 avg300=0.00 total={2**64}\n"),
    ],
)
def test_a_count_past_u64_is_no_kernels_and_is_dropped_and_counted(
    tmp_path: Path, name: str, text: str
) -> None:
    """The kernel keeps these counts in u64: `oom_kill 184467440737095516159999999` once
    became gpuscope_pod_oom_kills_total 1.84e+26. 2**64-1 still reads."""
    pod = systemd_pod(tmp_path)
    write(pod, dict(V2_FILES, **{name: text}))
    reader = PodCgroupReader(CgroupRoots(tmp_path), clock=ManualClock(), fs=HostFs("pods"))
    usage = reader.read({UID})[UID]
    lost = {
        "memory.events": usage.oom_kills,
        "cpu.stat": usage.cpu_throttled_periods,
        "io.stat": usage.io_read_bytes,
        "cpu.pressure": usage.cpu_pressure,
    }
    assert lost.pop(name) is None
    assert None not in lost.values()  # the other files still read
    assert reader.fs.counts()["invalid"] == 1
    write(pod, {name: text.replace(str(2**64), str(2**64 - 1)).replace("159999999", "15")})
    assert reader.read({UID}) != {}


def test_files_are_read_at_most_once_per_interval_whatever_the_scrape_rate(
    tmp_path: Path,
) -> None:
    pod = systemd_pod(tmp_path)
    write(pod, V2_FILES)
    clock = ManualClock()
    reader = PodCgroupReader(CgroupRoots(tmp_path), clock=clock, interval=1.0)
    assert reader.read({UID})[UID].oom_kills == 2
    (pod / "memory.events").write_text("oom_kill 3\n")
    clock.advance(0.5)
    assert reader.read({UID})[UID].oom_kills == 2  # a scrape within the interval: cached
    clock.advance(0.5)
    assert reader.read({UID})[UID].oom_kills == 3


def test_the_tree_is_searched_again_for_a_missing_pod_only_after_the_search_interval(
    tmp_path: Path,
) -> None:
    searches: list[Path] = []

    def counting(root: Path, fs: HostFs) -> dict[str, Path]:
        searches.append(root)
        return find_pod_dirs(root, fs)

    clock = ManualClock()
    reader = PodCgroupReader(
        CgroupRoots(tmp_path), clock=clock, interval=1.0, search_interval=10.0, find=counting
    )
    for _ in range(5):
        assert reader.read({UID}) == {}
        clock.advance(1)
    assert len(searches) == 1  # a pod with no cgroup here does not list the tree every tick
    write(systemd_pod(tmp_path), V2_FILES)
    clock.advance(5)
    assert set(reader.read({UID})) == {UID}
    for _ in range(5):
        clock.advance(1)
        reader.read({UID})
    assert len(searches) == 2  # found: no more searches


def test_pod_directories_are_found_in_every_kubelet_layout_and_containers_are_not_pods(
    tmp_path: Path,
) -> None:
    systemd = systemd_pod(tmp_path / "kubelet.slice", qos="besteffort")  # kind's prefix
    cgroupfs = tmp_path / "kubepods" / "burstable" / f"pod{OTHER}"
    (cgroupfs / CID).mkdir(parents=True)
    (tmp_path / "system.slice" / "containerd.service").mkdir(parents=True)
    assert find_pod_dirs(tmp_path) == {UID: systemd, OTHER: cgroupfs}


# --- which pods the attribution stage reads ---------------------------------------------------


def collection(gpu_pids: list[int]) -> Collection:
    identity = gpu_records.identity(0, "GPU-0", "H100")
    reading = GpuReading(
        identity, True, processes=tuple(GpuProcess(pid, 2**30, 0.5) for pid in gpu_pids)
    )
    pods = {
        u: PodMeta(u, "ml", name, Workload("Job", name))
        for u, name in ((UID, "train"), (OTHER, "web"))
    }
    return Collection(
        results={
            "gpu": SourceResult("gpu", gpu_records.snapshot((reading,)), True, 0),
            "pods": SourceResult("pods", PodsSnapshot(pods), True, 0),
        },
        collected_at=1000.0,
    )


@pytest.mark.parametrize("all_pods", [False, True])
def test_the_stage_reads_gpu_pods_or_with_the_flag_every_pod(
    tmp_path: Path, all_pods: bool
) -> None:
    cgroups = tmp_path / "cgroup"
    write(systemd_pod(cgroups), V2_FILES)
    write(systemd_pod(cgroups, OTHER), V2_FILES)
    procfs = tmp_path / "proc"
    (procfs / "7").mkdir(parents=True)
    gpu_pod_cgroup = next(cgroups.glob(f"**/cri-containerd-{CID}.scope"))
    (procfs / "7" / "cgroup").write_text(f"0::/{gpu_pod_cgroup.relative_to(cgroups)}\n")
    clock = ManualClock()
    attributor = Attributor(
        procfs,
        clock=clock,
        options=AttributionOptions(pod_signals_all_pods=all_pods),
        pod_signals=PodCgroupReader(CgroupRoots(cgroups), clock=clock),
    )
    signals = attributor.attribute(collection([7])).pod_signals
    assert [(s.pod.name, s.pod.workload.name) for s in signals] == (
        [("web", "web"), ("train", "train")] if all_pods else [("train", "train")]
    )  # by pod UID
    assert signals[-1].usage.io_pressure == Pressure(4.0, 3.0)


def test_a_pod_file_the_stage_cannot_use_is_counted_with_the_stages_dropped_inputs(
    tmp_path: Path,
) -> None:
    cgroups = tmp_path / "cgroup"
    write(systemd_pod(cgroups, OTHER), dict(V2_FILES, **{"memory.pressure": "nonsense\n"}))
    clock = ManualClock()
    attributor = Attributor(
        tmp_path / "proc",
        clock=clock,
        options=AttributionOptions(pod_signals_all_pods=True),
        pod_signals=PodCgroupReader(CgroupRoots(cgroups), clock=clock),
    )
    att = attributor.attribute(collection([]))
    assert att.dropped["invalid"] == 1
    (signals,) = att.pod_signals
    assert signals.usage.memory_pressure is None and signals.usage.oom_kills == 2


def test_a_controller_enabled_later_shows_within_the_search_interval(tmp_path: Path) -> None:
    pod = systemd_pod(tmp_path)
    write(pod, {"cpu.pressure": psi(10)})
    clock = ManualClock()
    reader = PodCgroupReader(CgroupRoots(tmp_path), clock=clock, search_interval=10.0)
    assert reader.read({UID})[UID].oom_kills is None
    (pod / "memory.events").write_text("oom_kill 4\n")  # the memory controller comes on
    clock.advance(5)
    assert reader.read({UID})[UID].oom_kills is None  # absent files are not reopened per tick
    clock.advance(5)
    assert reader.read({UID})[UID].oom_kills == 4


def test_a_pod_asked_for_later_is_read_at_once_from_the_last_search(tmp_path: Path) -> None:
    write(systemd_pod(tmp_path), V2_FILES)
    write(systemd_pod(tmp_path, OTHER), V2_FILES)
    searches: list[Path] = []

    def counting(root: Path, fs: HostFs) -> dict[str, Path]:
        searches.append(root)
        return find_pod_dirs(root, fs)

    reader = PodCgroupReader(CgroupRoots(tmp_path), clock=ManualClock(), find=counting)
    assert set(reader.read({UID})) == {UID}
    assert set(reader.read({UID, OTHER})) == {UID, OTHER}  # e.g. a new GPU holder
    assert len(searches) == 1


def test_the_agent_reads_pods_under_its_cgroup_root_at_the_pod_signals_interval(
    tmp_path: Path,
) -> None:
    """--cgroup-root is the agent's host root (the net collector's too) and
    --pod-signals-interval the reader's own pace, whatever the GPU sampler's."""
    pod = systemd_pod(tmp_path / "cgroup")
    write(pod, V2_FILES)
    clock = ManualClock()
    argv = ["--cgroup-root", str(tmp_path / "cgroup"), "--pod-signals-interval", "5",
            "--sample-interval", "0.5"]  # fmt: skip
    agent = Agent(parse(argv, env={}), clock=clock, sources=[])
    reader = agent.attributor.context.pod_signals
    assert reader is not None and reader.roots.v2 == tmp_path / "cgroup"
    assert reader.read({UID})[UID].oom_kills == 2
    (pod / "memory.events").write_text("oom_kill 3\n")
    clock.advance(4.0)
    assert reader.read({UID})[UID].oom_kills == 2  # within --pod-signals-interval: cached
    clock.advance(1.0)
    assert reader.read({UID})[UID].oom_kills == 3

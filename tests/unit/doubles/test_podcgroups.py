"""tests/doubles/podcgroups.py on fixture trees: which v1 hierarchies a kubelet joins (from
mountinfo text), where each limit is written on a hybrid and on a pure cgroup v2 node, and
that a spawned process is in every hierarchy's cgroup before it runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.doubles.podcgroups import (
    Cgroup,
    Hierarchies,
    enable_v2_controllers,
    parse_v1_mounts,
    set_cpu_limit,
    set_read_limit,
    spawn_in,
)

# This project's Debian 12 machine: v1 controllers mounted one by one, v2 at unified/.
HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
# systemd's usual hybrid layout: cpu and cpuacct co-mounted, optional fields before "-".
COMOUNTED = """\
30 24 0:26 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:14 - cgroup cgroup rw,cpu,cpuacct
36 25 0:32 / /sys/fs/cgroup/blkio rw,nosuid shared:17 - cgroup cgroup rw,blkio
37 25 0:33 / /mnt/cgroup\\040v1/blkio rw shared:18 - cgroup cgroup rw,blkio
"""
PURE_V2 = "25 30 0:23 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_the_v1_hierarchies_a_pod_joins_come_from_mountinfo() -> None:
    assert parse_v1_mounts(HYBRID) == {
        "cpu": Path("/sys/fs/cgroup/cpu"),
        "blkio": Path("/sys/fs/cgroup/blkio"),
    }
    assert parse_v1_mounts(COMOUNTED) == {
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),  # the first mount of blkio wins
        "blkio": Path("/sys/fs/cgroup/blkio"),
    }
    escaped = COMOUNTED.splitlines()[-1]
    assert parse_v1_mounts(escaped) == {"blkio": Path("/mnt/cgroup v1/blkio")}
    assert parse_v1_mounts(PURE_V2) == {}
    assert parse_v1_mounts("garbage\n\n1 2 - cgroup\n") == {}


def cgroup_files(directory: Path, files: dict[str, str] | None = None) -> Path:
    """A directory holding interface files of these names and contents."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (files or {}).items():
        (directory / name).write_text(text)
    return directory


def test_a_cpu_limit_is_the_v1_quota_on_a_hybrid_host_and_cpu_max_on_pure_v2(
    tmp_path: Path,
) -> None:
    v2 = cgroup_files(tmp_path / "unified" / "pod", {"cpu.pressure": ""})
    v1 = cgroup_files(
        tmp_path / "cpu" / "pod", {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "50000"}
    )
    assert set_cpu_limit(Cgroup(v2, {"cpu": v1}), 0.1)
    assert (v1 / "cpu.cfs_quota_us").read_text() == "5000"  # of the cgroup's own period
    assert not (v2 / "cpu.max").exists()

    pure = cgroup_files(tmp_path / "pure" / "pod", {"cpu.max": "max 100000"})
    assert set_cpu_limit(Cgroup(pure, {}), 0.25)
    assert (pure / "cpu.max").read_text() == "25000 100000"

    assert not set_cpu_limit(Cgroup(cgroup_files(tmp_path / "none"), {}), 1.0)


def test_a_read_limit_is_blkio_throttle_on_a_hybrid_host_and_io_max_on_pure_v2(
    tmp_path: Path,
) -> None:
    v2 = cgroup_files(tmp_path / "unified" / "c", {"io.pressure": ""})
    v1 = cgroup_files(tmp_path / "blkio" / "c", {"blkio.throttle.read_bps_device": ""})
    assert set_read_limit(Cgroup(v2, {"blkio": v1}), "254:0", 20_000_000)
    assert (v1 / "blkio.throttle.read_bps_device").read_text() == "254:0 20000000"

    pure = cgroup_files(tmp_path / "pure" / "c", {"io.max": ""})
    assert set_read_limit(Cgroup(pure, {}), "8:0", 1 << 20)
    assert (pure / "io.max").read_text() == "8:0 rbps=1048576"

    assert not set_read_limit(Cgroup(cgroup_files(tmp_path / "none"), {}), "8:0", 1)


def test_v2_controllers_are_enabled_only_where_offered_and_not_yet_on(tmp_path: Path) -> None:
    level = cgroup_files(
        tmp_path / "pure",
        {"cgroup.controllers": "cpuset cpu io memory pids", "cgroup.subtree_control": ""},
    )
    (level / "cgroup.subtree_control").write_text("cpu io")
    enable_v2_controllers(level)
    assert (level / "cgroup.subtree_control").read_text() == "+memory"  # one write each
    hybrid = cgroup_files(tmp_path / "unified", {"cgroup.controllers": "hugetlb"})
    (hybrid / "cgroup.subtree_control").write_text("")
    enable_v2_controllers(hybrid)
    assert (hybrid / "cgroup.subtree_control").read_text() == ""  # cpu, io, memory are v1's


def test_a_cgroup_is_made_at_one_path_in_every_hierarchy(tmp_path: Path) -> None:
    roots = {name: (tmp_path / name) for name in ("unified", "cpu,cpuacct", "blkio")}
    for root in roots.values():
        root.mkdir()
    hier = Hierarchies(roots["unified"], {"cpu": roots["cpu,cpuacct"], "blkio": roots["blkio"]})
    pod, made = hier.make(["t", "kubepods.slice", "kubepods-pod1.slice"])
    assert pod.dirs == [roots[r] / "t/kubepods.slice/kubepods-pod1.slice" for r in roots]
    assert len(made) == 9 and all(d.is_dir() for d in made)
    container, made = hier.make(["t", "kubepods.slice", "kubepods-pod1.slice", "c1"])
    assert container == pod.child("c1") and made == container.dirs  # the rest existed
    hier.remove("t")
    assert not any((root / "t").exists() for root in roots.values())

    comounted = Hierarchies(roots["unified"], {"cpu": roots["blkio"], "blkio": roots["blkio"]})
    assert len(comounted.make(["p"])[0].dirs) == 2  # one directory per hierarchy


def test_a_spawned_process_is_in_every_cgroup_before_it_runs(tmp_path: Path) -> None:
    cgroup = Cgroup(tmp_path / "v2", {"cpu": tmp_path / "cpu", "blkio": tmp_path / "blkio"})
    for directory in cgroup.dirs:
        directory.mkdir()
    proc = spawn_in(
        cgroup,
        ["/bin/sh", "-c", 'cat "$0"/cgroup.procs "$1"/cgroup.procs', *map(str, cgroup.v1.values())],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert out.split() == [str(proc.pid)] * 2  # it read its own pid, written before it ran
    assert (cgroup.v2 / "cgroup.procs").read_text().strip() == str(proc.pid)

    # A cgroup that cannot be joined stops it before it runs.
    missing = Cgroup(tmp_path / "absent", {})
    failed = spawn_in(missing, ["/bin/echo", "ran"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out_b, _ = failed.communicate(timeout=10)
    assert failed.returncode == 97 and out_b == b""

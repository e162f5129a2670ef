"""Cgroup paths map to pods for every layout kubelets produce; cgroup v2 ids resolve to paths
by walking a real directory tree, with re-walks on a miss that are rate-limited."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpuscope.agent.clock import ManualClock
from gpuscope.agent.hostfs import HostFs
from gpuscope.agent.k8s import cgroups
from gpuscope.agent.k8s.cgroups import (
    CgroupResolver,
    PodCgroup,
    QosClass,
    Runtime,
    detect_cgroup_v2_root,
    parse_cgroup_path,
    parse_proc_cgroup,
)

UID = "eadf4777-07b8-449a-873e-2a219705c38d"
SD = UID.replace("-", "_")  # how the systemd driver writes it
UID2 = "7016b86a-50ae-448d-9590-311480676626"
SD2 = UID2.replace("-", "_")
STATIC = "9dd4e461268c8034f5c8564e155c67a6"  # a static pod: the kubelet's hash of the manifest
C1 = "5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9"
C2 = "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b"
UNKNOWN = 0  # no inode has number 0
OTHER_UNKNOWN = 2**64 - 1
KIND = "d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35"  # the kind node

BURSTABLE_SLICE = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD}.slice"
KIND_BESTEFFORT = (
    "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
    f"/kubelet-kubepods-besteffort-pod{SD}.slice"
)


def pod(container: str | None, qos: QosClass, runtime: Runtime | None, uid: str = UID) -> PodCgroup:
    return PodCgroup(pod_uid=uid, container_id=container, qos=qos, runtime=runtime)


LAYOUTS = [
    # systemd cgroup driver
    pytest.param(
        f"{BURSTABLE_SLICE}/cri-containerd-{C1}.scope",
        pod(C1, "burstable", "containerd"),
        id="systemd-burstable-containerd",
    ),
    pytest.param(
        f"/kubepods.slice/kubepods-pod{SD}.slice/cri-containerd-{C1}.scope",
        pod(C1, "guaranteed", "containerd"),
        id="systemd-guaranteed-has-no-qos-level",
    ),
    pytest.param(
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SD}.slice"
        f"/cri-containerd-{C1}.scope",
        pod(C1, "besteffort", "containerd"),
        id="systemd-besteffort-containerd",
    ),
    pytest.param(BURSTABLE_SLICE, pod(None, "burstable", None), id="systemd-pod-level"),
    pytest.param(
        f"/kubepods.slice/kubepods-pod{SD}.slice",
        pod(None, "guaranteed", None),
        id="systemd-guaranteed-pod-level",
    ),
    pytest.param(
        f"{BURSTABLE_SLICE}/crio-{C1}.scope", pod(C1, "burstable", "cri-o"), id="systemd-crio"
    ),
    pytest.param(
        f"{BURSTABLE_SLICE}/crio-conmon-{C1}.scope",
        pod(None, "burstable", "cri-o"),
        id="systemd-crio-conmon-is-pod-level",
    ),
    pytest.param(
        f"{BURSTABLE_SLICE}/docker-{C1}.scope",
        pod(C1, "burstable", "docker"),
        id="systemd-docker",
    ),
    pytest.param(
        f"{BURSTABLE_SLICE}/cri-containerd-{C1}.scope/init.scope",
        pod(C1, "burstable", "containerd"),
        id="systemd-nested-in-container",
    ),
    pytest.param(
        f"{BURSTABLE_SLICE}/crio-{C1}.scope/container/system.slice/sshd.service",
        pod(C1, "burstable", "cri-o"),
        id="systemd-deeply-nested-in-container",
    ),
    pytest.param(
        f"{BURSTABLE_SLICE}/cri-containerd-{C1[:12]}.scope",
        pod(None, "burstable", None),
        id="systemd-short-container-id-is-pod-level",
    ),
    pytest.param(
        f"{BURSTABLE_SLICE}/kata_{C1}",
        pod(None, "burstable", None),
        id="systemd-unknown-child-is-pod-level",
    ),
    pytest.param(
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice"
        f"/cri-containerd-{C1}.scope",
        pod(C1, "burstable", "containerd", uid=STATIC),
        id="systemd-static-pod-hash-uid",
    ),
    # kind and other prefixes
    pytest.param(
        f"{KIND_BESTEFFORT}/cri-containerd-{C1}.scope",
        pod(C1, "besteffort", "containerd"),
        id="kind-kubelet-slice",
    ),
    pytest.param(
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{SD}.slice"
        f"/cri-containerd-{C1}.scope",
        pod(C1, "guaranteed", "containerd"),
        id="kind-kubelet-slice-guaranteed",
    ),
    pytest.param(
        f"/system.slice/docker-{KIND}.scope{KIND_BESTEFFORT}/cri-containerd-{C1}.scope",
        pod(C1, "besteffort", "containerd"),
        id="kind-seen-from-the-host",
    ),
    pytest.param(
        f"/system.slice/containerd.service/kubepods-burstable-pod{SD}.slice:cri-containerd:{C1}",
        pod(C1, "burstable", "containerd"),
        id="runc-systemd-path-under-containerd-service",
    ),
    pytest.param(
        f"/system.slice/crio.service/kubepods-pod{SD}.slice:crio:{C1}",
        pod(C1, "guaranteed", "cri-o"),
        id="runc-systemd-path-under-crio-service",
    ),
    pytest.param(
        f"/../../kubepods-besteffort-pod{SD}.slice/cri-containerd-{C1}.scope",
        pod(C1, "besteffort", "containerd"),
        id="cgroup-namespace-relative",
    ),
    pytest.param(
        f"/sys/fs/cgroup{BURSTABLE_SLICE}/cri-containerd-{C1}.scope",
        pod(C1, "burstable", "containerd"),
        id="absolute-filesystem-path",
    ),
    pytest.param(
        f"{BURSTABLE_SLICE}/cri-containerd-{C1}.scope (deleted)",
        pod(C1, "burstable", "containerd"),
        id="dead-cgroup-marker",
    ),
    # cgroupfs driver
    pytest.param(
        f"/kubepods/burstable/pod{UID}/{C1}", pod(C1, "burstable", None), id="cgroupfs-burstable"
    ),
    pytest.param(f"/kubepods/pod{UID}/{C1}", pod(C1, "guaranteed", None), id="cgroupfs-guaranteed"),
    pytest.param(
        f"/kubepods/besteffort/pod{UID}", pod(None, "besteffort", None), id="cgroupfs-pod-level"
    ),
    pytest.param(
        f"/kubepods/burstable/pod{UID}/crio-{C1}", pod(C1, "burstable", "cri-o"), id="cgroupfs-crio"
    ),
    pytest.param(
        f"/kubepods/burstable/pod{UID}/crio-conmon-{C1}",
        pod(None, "burstable", "cri-o"),
        id="cgroupfs-crio-conmon",
    ),
    pytest.param(
        f"/kubepods/pod{UID}/{C1}/sub/deeper", pod(C1, "guaranteed", None), id="cgroupfs-nested"
    ),
    pytest.param(
        f"/docker/{KIND}/kubepods/besteffort/pod{UID}/{C1}",
        pod(C1, "besteffort", None),
        id="cgroupfs-kind-in-docker",
    ),
    pytest.param(
        f"/kubelet/kubepods/burstable/pod{UID}/{C1}",
        pod(C1, "burstable", None),
        id="cgroupfs-custom-cgroup-root",
    ),
    pytest.param(
        f"/kubepods/burstable/pod{STATIC}/{C1}",
        pod(C1, "burstable", None, uid=STATIC),
        id="cgroupfs-static-pod-hash-uid",
    ),
    pytest.param(
        f"/kubepods/burstable/pod{UID}/{C1}/kubepods/besteffort/pod{UID2}/{C2}",
        pod(C1, "burstable", None),
        id="nested-kubelet-outermost-pod-wins",
    ),
    pytest.param(
        f"  /kubepods/pod{UID}/{C1}/\n", pod(C1, "guaranteed", None), id="whitespace-and-slash"
    ),
    # no pod
    pytest.param("/", None, id="root"),
    pytest.param("", None, id="empty"),
    pytest.param("/init.scope", None, id="init-scope"),
    pytest.param("/system.slice/containerd.service", None, id="containerd-service"),
    pytest.param("/system.slice/kubelet.service", None, id="kubelet-itself"),
    pytest.param("/user.slice/user-1000.slice/session-3.scope", None, id="user-slice"),
    pytest.param("/kubepods.slice", None, id="kubepods-slice-alone"),
    pytest.param("/kubepods.slice/kubepods-burstable.slice", None, id="qos-slice-without-pod"),
    pytest.param("/kubepods.slice/kubepods-besteffort.slice", None, id="besteffort-slice-alone"),
    pytest.param("/kubepods", None, id="cgroupfs-kubepods-alone"),
    pytest.param("/kubepods/burstable", None, id="cgroupfs-qos-without-pod"),
    pytest.param(
        "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice",
        None,
        id="kind-qos-without-pod",
    ),
    pytest.param(f"/system.slice/docker-{C1}.scope", None, id="plain-docker-container"),
    pytest.param(f"/docker/{C1}", None, id="plain-docker-cgroupfs"),
    pytest.param(f"/system.slice/pod{UID}/{C1}", None, id="pod-dir-without-kubepods"),
    pytest.param(
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID}.slice",
        None,
        id="malformed-systemd-uid-with-dashes",
    ),
    pytest.param(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_5678.slice",
        None,
        id="malformed-short-uid",
    ),
    pytest.param(f"/kubepods/burstable/pod{SD}/{C1}", None, id="malformed-cgroupfs-underscores"),
    pytest.param(f"/kubepods/pod{UID.upper()}/{C1}", None, id="malformed-uppercase-uid"),
    pytest.param(f"/kubepods/pod{UID[:-1]}g/{C1}", None, id="malformed-non-hex-uid"),
    pytest.param(f"/kubepods/guaranteed/pod{UID}/{C1}", None, id="malformed-unknown-qos-dir"),
]


@pytest.mark.parametrize(("path", "expected"), LAYOUTS)
def test_parse_cgroup_path(path: str, expected: PodCgroup | None) -> None:
    assert parse_cgroup_path(path) == expected


V1_LINES = [
    "12:hugetlb:/kubepods/burstable/pod{uid}/{cid}",
    "11:memory:/kubepods/burstable/pod{uid}/{cid}",
    "10:cpu,cpuacct:/kubepods/burstable/pod{uid}/{cid}",
    "9:pids:/kubepods/burstable/pod{uid}/{cid}",
    "1:name=systemd:/kubepods/burstable/pod{uid}/{cid}",
]


def v1(uid: str = UID, cid: str = C1) -> str:
    return "\n".join(line.format(uid=uid, cid=cid) for line in V1_LINES) + "\n"


PROC = [
    pytest.param(v1(), pod(C1, "burstable", None), id="v1-only-several-controllers"),
    pytest.param(
        "4:cpuset:/\n3:memory:/system.slice/containerd.service\n"
        f"2:devices:/kubepods/pod{UID}/{C1}\n1:name=systemd:/kubepods/pod{UID2}/{C2}\n",
        pod(C1, "guaranteed", None),
        id="v1-first-line-that-maps",
    ),
    pytest.param(
        f"0::{BURSTABLE_SLICE}/cri-containerd-{C1}.scope\n",
        pod(C1, "burstable", "containerd"),
        id="v2-only",
    ),
    pytest.param(
        v1(UID2, C2) + f"0::{BURSTABLE_SLICE}/cri-containerd-{C1}.scope\n",
        pod(C1, "burstable", "containerd"),
        id="hybrid-v2-line-wins",
    ),
    pytest.param(v1() + "0::/\n", pod(C1, "burstable", None), id="hybrid-v2-unused-falls-back"),
    pytest.param(
        f"0::/system.slice/containerd.service/kubepods-burstable-pod{SD}.slice:cri-containerd:{C1}",
        pod(C1, "burstable", "containerd"),
        id="v2-path-with-colons",
    ),
    pytest.param(
        f"0::{BURSTABLE_SLICE}/cri-containerd-{C1}.scope (deleted)\n",
        pod(C1, "burstable", "containerd"),
        id="v2-dead-cgroup",
    ),
    pytest.param("0::/\n", None, id="v2-private-cgroup-namespace"),
    pytest.param(
        "2:memory:/system.slice/kubelet.service\n1:name=systemd:/system.slice/kubelet.service\n"
        "0::/system.slice/kubelet.service\n",
        None,
        id="hybrid-host-process",
    ),
    pytest.param("", None, id="empty"),
    pytest.param(
        f"garbage\n\n0::{BURSTABLE_SLICE}\n", pod(None, "burstable", None), id="junk-lines-skipped"
    ),
]


@pytest.mark.parametrize(("text", "expected"), PROC)
def test_parse_proc_cgroup(text: str, expected: PodCgroup | None) -> None:
    assert parse_proc_cgroup(text) == expected


# --- the resolver, on real directory trees ---

CONTAINER = f"{BURSTABLE_SLICE}/cri-containerd-{C1}.scope"


def make(root: Path, relative: str) -> int:
    """Create a cgroup-like directory (with an interface file, as cgroupfs has) -> its id."""
    directory = root / relative.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup.procs").touch()
    return os.stat(directory).st_ino


def remove(root: Path, relative: str) -> None:
    """Take a cgroup out of the tree. It is moved aside rather than deleted so that its inode
    is not reused by the next `make`: a test filesystem reuses inodes, kernfs never does."""
    graveyard = root.parent / f"{root.name}-removed"
    graveyard.mkdir(exist_ok=True)
    (root / relative.lstrip("/")).rename(graveyard / str(len(list(graveyard.iterdir()))))


def ino(root: Path, relative: str) -> int:
    return os.stat(root / relative.lstrip("/")).st_ino


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=100.0)


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every walk the resolver makes, in order."""
    seen: list[Path] = []
    real = cgroups.walk_cgroup_tree

    def counting(root: Path, fs: HostFs | None = None) -> dict[int, str]:
        seen.append(root)
        return real(root, fs)

    monkeypatch.setattr(cgroups, "walk_cgroup_tree", counting)
    return seen


def resolver(root: Path, clock: ManualClock) -> CgroupResolver:
    return CgroupResolver(root, monotonic=clock.monotonic)


def test_resolves_ids_to_paths_and_pods(tmp_path: Path, clock: ManualClock) -> None:
    container = make(tmp_path, CONTAINER)
    service = make(tmp_path, "/system.slice/containerd.service")
    r = resolver(tmp_path, clock)

    assert r.resolve(os.stat(tmp_path).st_ino) == "/"
    assert r.resolve(container) == CONTAINER
    assert r.resolve(ino(tmp_path, BURSTABLE_SLICE)) == BURSTABLE_SLICE
    assert r.resolve(service) == "/system.slice/containerd.service"
    assert r.resolve_pod(container) == pod(C1, "burstable", "containerd")
    assert r.resolve_pod(ino(tmp_path, BURSTABLE_SLICE)) == pod(None, "burstable", None)
    assert r.resolve_pod(service) is None
    assert r.exists(container)


def test_hybrid_unified_root(tmp_path: Path, clock: ManualClock) -> None:
    unified = tmp_path / "unified"
    make(unified, "/")
    (unified / "cgroup.controllers").touch()
    make(tmp_path, "/memory/kubepods/burstable")  # a v1 controller beside it: not walked
    container = make(unified, CONTAINER)
    root = detect_cgroup_v2_root(tmp_path)
    assert root == unified
    r = resolver(root, clock)
    assert r.resolve(container) == CONTAINER
    assert r.resolve(ino(tmp_path, "/memory")) is None


def test_hits_do_not_walk(tmp_path: Path, clock: ManualClock, walks: list[Path]) -> None:
    container = make(tmp_path, CONTAINER)
    r = resolver(tmp_path, clock)
    for _ in range(100):
        assert r.resolve(container) == CONTAINER
        assert r.resolve_pod(container) is not None
        clock.advance(5)
    assert len(walks) == 1


def test_a_miss_rewalks_and_finds_a_new_cgroup(
    tmp_path: Path, clock: ManualClock, walks: list[Path]
) -> None:
    r = resolver(tmp_path, clock)
    assert r.resolve(make(tmp_path, "/system.slice")) == "/system.slice"
    clock.advance(30)
    new = make(tmp_path, CONTAINER)
    assert r.resolve(new) == CONTAINER
    assert r.resolve_pod(new) == pod(C1, "burstable", "containerd")
    assert len(walks) == 2


def test_rewalks_are_rate_limited(tmp_path: Path, clock: ManualClock, walks: list[Path]) -> None:
    r = resolver(tmp_path, clock)
    assert r.resolve(UNKNOWN) is None  # the first lookup walks, whatever the id
    assert len(walks) == 1
    new = make(tmp_path, CONTAINER)
    for _ in range(50):  # a burst of unknown ids within the interval: no walk
        assert r.resolve(new) is None
        assert r.resolve_pod(new) is None
        clock.advance(0.019)
    assert len(walks) == 1
    clock.set(101.0)  # 1.0 s after the first walk
    assert r.resolve(new) == CONTAINER
    assert len(walks) == 2
    assert r.resolve(OTHER_UNKNOWN) is None  # the next miss waits again
    assert len(walks) == 2


def test_custom_rewalk_interval(tmp_path: Path, clock: ManualClock, walks: list[Path]) -> None:
    r = CgroupResolver(tmp_path, min_rewalk_interval=10.0, monotonic=clock.monotonic)
    r.resolve(UNKNOWN)
    new = make(tmp_path, CONTAINER)
    clock.advance(9.9)
    assert r.resolve(new) is None
    clock.advance(0.1)
    assert r.resolve(new) == CONTAINER
    assert len(walks) == 2


def test_exists_prunes_only_provably_gone_cgroups(
    tmp_path: Path, clock: ManualClock, walks: list[Path]
) -> None:
    root = tmp_path / "cgroup"
    first = make(root, CONTAINER)
    second = make(root, f"{BURSTABLE_SLICE}/cri-containerd-{C2}.scope")
    r = resolver(root, clock)
    assert r.exists(first) and r.exists(second)

    clock.advance(0.1)
    born = make(root, f"/kubepods.slice/kubepods-pod{SD2}.slice")
    remove(root, BURSTABLE_SLICE)
    assert r.exists(first)  # the last walk is recent: removals are not seen yet
    assert r.exists(born)  # newer than the last walk: kept
    assert len(walks) == 1

    clock.advance(1.0)  # a pruning pass: its first call walks, even on a hit
    assert not r.exists(first)
    assert not r.exists(second)  # in the previous walk, not in this one
    assert r.exists(born)
    assert len(walks) == 2
    assert r.resolve(first) is None and r.resolve_pod(first) is None

    late = make(root, f"/kubepods.slice/kubepods-pod{SD}.slice")
    assert r.exists(late)  # not in the last walk, which may predate it: not proven gone
    clock.advance(1.0)
    assert r.exists(late)  # the next walk finds it
    assert not r.exists(first) and not r.exists(second)  # gone stays gone
    assert len(walks) == 3


def test_exists_gone_after_a_miss_and_a_later_walk(tmp_path: Path, clock: ManualClock) -> None:
    root = tmp_path / "cgroup"
    r = resolver(root, clock)
    assert r.exists(make(root, "/"))
    short_lived = make(root, CONTAINER)
    assert r.resolve(short_lived) is None  # seen by BPF, not yet walked, rate-limited
    remove(root, "/kubepods.slice")
    clock.advance(1.0)
    assert r.resolve(UNKNOWN) is None  # another miss walks
    assert not r.exists(short_lived)  # that walk came after it was held, and lacks it


def test_exists_walks_at_most_once_per_interval(
    tmp_path: Path, clock: ManualClock, walks: list[Path]
) -> None:
    container = make(tmp_path, CONTAINER)
    r = resolver(tmp_path, clock)
    for _ in range(80):  # ten seconds of calls
        assert r.exists(container)
        clock.advance(0.125)
    assert len(walks) == 10


def test_resolve_pod_is_cached_until_the_cgroup_goes(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cgroup"
    parsed: list[str] = []
    real = cgroups.parse_cgroup_path

    def counting(path: str) -> PodCgroup | None:
        parsed.append(path)
        return real(path)

    monkeypatch.setattr(cgroups, "parse_cgroup_path", counting)
    container = make(root, CONTAINER)
    service = make(root, "/system.slice/kubelet.service")
    r = resolver(root, clock)
    for _ in range(3):
        assert r.resolve_pod(container) == pod(C1, "burstable", "containerd")
        assert r.resolve_pod(service) is None  # "no pod" is cached too
    assert parsed == [CONTAINER, "/system.slice/kubelet.service"]

    remove(root, BURSTABLE_SLICE)
    clock.advance(2)
    r.resolve(UNKNOWN)  # a miss: re-walk
    assert r.resolve_pod(container) is None


def test_forget_walks_again_at_once(tmp_path: Path, clock: ManualClock, walks: list[Path]) -> None:
    r = resolver(tmp_path, clock)
    r.resolve(UNKNOWN)
    new = make(tmp_path, CONTAINER)
    assert r.resolve(new) is None
    r.forget()
    assert r.resolve(new) == CONTAINER
    assert len(walks) == 2


def test_symlinks_are_not_followed(tmp_path: Path, clock: ManualClock) -> None:
    root = tmp_path / "cgroup"
    make(root, "/system.slice")
    outside = make(tmp_path, "/elsewhere/kubepods/pod-inside")
    (root / "link-out").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (root / "system.slice" / "loop").symlink_to(root, target_is_directory=True)
    r = resolver(root, clock)
    assert r.resolve(outside) is None
    assert r.resolve(ino(tmp_path, "/elsewhere")) is None
    assert sorted(cgroups.walk_cgroup_tree(root).values()) == ["/", "/system.slice"]


def test_deep_nesting(tmp_path: Path, clock: ManualClock) -> None:
    deep = CONTAINER + "".join(f"/level{i}" for i in range(60))
    leaf = make(tmp_path, deep)
    r = resolver(tmp_path, clock)
    assert r.resolve(leaf) == deep
    assert r.resolve_pod(leaf) == pod(C1, "burstable", "containerd")


def vanish_while_listing(m: pytest.MonkeyPatch, parent: Path, victim: Path) -> None:
    """`victim` is removed right after `parent` was read: listed, but gone before its stat."""
    real = os.scandir

    @contextmanager
    def listed_then_removed(path: str) -> Iterator[list[os.DirEntry[str]]]:
        with real(path) as entries:
            listing = list(entries)
        shutil.rmtree(victim)
        yield listing

    m.setattr(
        os, "scandir", lambda p: listed_then_removed(p) if p == os.fspath(parent) else real(p)
    )


def vanish_before_opening(m: pytest.MonkeyPatch, victim: Path) -> None:
    """`victim` is listed and stat'ed by its parent's walk, then removed before it is opened."""
    real = os.scandir

    def removed_then_opened(path: str) -> object:
        if path == os.fspath(victim):  # shutil.rmtree calls scandir too, with fds
            shutil.rmtree(victim)
        return real(path)

    m.setattr(os, "scandir", removed_then_opened)


def test_a_cgroup_removed_after_being_listed_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = tmp_path / BURSTABLE_SLICE.lstrip("/")
    gone = make(tmp_path, CONTAINER)
    kept = make(tmp_path, "/system.slice/containerd.service")
    with monkeypatch.context() as m:
        vanish_while_listing(m, parent, parent / f"cri-containerd-{C1}.scope")
        found = cgroups.walk_cgroup_tree(tmp_path)
    assert gone not in found
    assert found[kept] == "/system.slice/containerd.service"
    assert found[ino(tmp_path, BURSTABLE_SLICE)] == BURSTABLE_SLICE


def test_a_cgroup_removed_before_being_opened_is_skipped(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    container = make(tmp_path, CONTAINER)
    nested = make(tmp_path, f"{CONTAINER}/init.scope")
    kept = make(tmp_path, "/system.slice/containerd.service")
    r = resolver(tmp_path, clock)
    with monkeypatch.context() as m:
        vanish_before_opening(m, tmp_path / CONTAINER.lstrip("/"))
        assert r.resolve(kept) == "/system.slice/containerd.service"
    assert r.resolve(container) == CONTAINER  # listed before it went; the next walk drops it
    assert r.resolve(nested) is None
    clock.advance(1)
    assert r.resolve(UNKNOWN) is None
    assert r.resolve(container) is None
    assert not r.exists(container)


def test_a_missing_root_resolves_nothing(tmp_path: Path, clock: ManualClock) -> None:
    r = resolver(tmp_path / "absent", clock)
    assert r.resolve(1) is None
    assert r.resolve_pod(1) is None
    assert r.exists(1) is False
    file_root = tmp_path / "file"
    file_root.touch()
    assert cgroups.walk_cgroup_tree(file_root) == {}


def test_detect_cgroup_v2_root(tmp_path: Path) -> None:
    unified_host = tmp_path / "unified-host"
    make(unified_host, "/")
    (unified_host / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert detect_cgroup_v2_root(unified_host) == unified_host

    hybrid = tmp_path / "hybrid"
    make(hybrid, "/memory")
    make(hybrid, "/unified")
    (hybrid / "unified" / "cgroup.controllers").touch()
    assert detect_cgroup_v2_root(hybrid) == hybrid / "unified"

    legacy = tmp_path / "legacy"
    make(legacy, "/memory")
    make(legacy, "/unified")  # an empty directory is no mount
    assert detect_cgroup_v2_root(legacy) is None
    assert detect_cgroup_v2_root(tmp_path / "absent") is None


def test_real_cgroupfs_inode_is_the_id() -> None:
    """On the machine running the tests, kernfs walks like any tree and the directory inode is
    the id. The resolver is rooted at our own cgroup so that the walk stays small."""
    root = detect_cgroup_v2_root(Path("/sys/fs/cgroup"))
    if root is None:
        pytest.skip("no cgroup v2 hierarchy here")
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    own = next((line[3:] for line in lines if line.startswith("0::")), "/")
    mine = root / own.lstrip("/")
    if not mine.is_dir():
        pytest.skip("our cgroup is not under this mount (cgroup namespace)")
    r = CgroupResolver(mine)
    assert r.resolve(os.stat(mine).st_ino) == "/"
    assert r.exists(os.stat(mine).st_ino)


# --- hostile names and unlistable directories ----------------------------------------------


def test_a_cgroup_named_with_bytes_that_are_not_utf8_resolves_to_its_pod(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Any pod can create child cgroups with any name. The walk names the child the way a
    process's /proc/<pid>/cgroup reads (`\\xff`), so both lead to the same pod."""
    container = tmp_path / CONTAINER.lstrip("/")
    container.mkdir(parents=True)
    child = os.fsencode(container) + b"/worker\xff"
    os.mkdir(child)
    r = resolver(tmp_path, clock)
    cgroup_id = os.stat(child).st_ino
    path = r.resolve(cgroup_id)
    assert path == f"{CONTAINER}/worker\\xff"
    assert path is not None and path.encode("utf-8")
    assert r.resolve_pod(cgroup_id) == pod(C1, "burstable", "containerd")
    assert parse_proc_cgroup(f"0::{path}\n") == r.resolve_pod(cgroup_id)


def test_a_directory_that_cannot_be_listed_is_skipped_counted_and_logged_once(
    tmp_path: Path,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    denied = make(tmp_path, "/system.slice/secret.service")
    below = make(tmp_path, "/system.slice/secret.service/inner")
    kept = make(tmp_path, CONTAINER)
    real = os.scandir
    refused = os.fspath(tmp_path / "system.slice" / "secret.service")

    def scandir(path: str) -> object:
        if path == refused:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    caplog.set_level(logging.INFO, logger="gpuscope.hostfs")
    r = resolver(tmp_path, clock)
    for _ in range(3):
        clock.advance(1)
        r.forget()
        assert r.resolve(kept) == CONTAINER
        assert r.resolve(denied) == "/system.slice/secret.service"  # listed by its parent
        assert r.resolve(below) is None  # its subtree is out of reach
    assert r.fs.counts()["unreadable"] == 3
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "gpuscope.hostfs"]
    assert lines == [f"cgroups: cannot list {refused}: Permission denied"]  # once, not 3 times
    monkeypatch.setattr(os, "scandir", real)
    r.forget()
    assert r.resolve(below) == "/system.slice/secret.service/inner"
    assert caplog.records[-1].getMessage() == f"cgroups: {refused} reads again"

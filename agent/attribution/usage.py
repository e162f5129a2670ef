"""Stage `usage`: what each container's processes use of each GPU, found through the
processes' cgroups (/proc/<pid>/cgroup, agent/attribution/processes.py), and which pods
have GPU activity now (for stage `startups`).

One process's cgroup that cannot be read or parsed costs that process only: it is dropped
and counted (`Attribution.dropped`), never named a host process, and the others are still
attributed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gpuscope.agent.attribution.devices import ACCELERATORS, devices
from gpuscope.agent.attribution.processes import Dropped, process_pod
from gpuscope.agent.attribution.records import GpuHolding, PodGpuUsage, PodRef
from gpuscope.agent.attribution.spec import StageContext, StageSpec
from gpuscope.agent.attribution.state import NO_WORKLOAD, Joined, pod_ref
from gpuscope.agent.runtime.sources import Collection, Keyed, describe

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyAccelerators, AnyReading, DeviceProcess
    from gpuscope.agent.hostfs import HostFs
    from gpuscope.agent.k8s.cgroups import PodCgroup
    from gpuscope.agent.k8s.records import PodMeta

UsageKey = tuple[int, str, str, str]  # GPU index, GPU UUID, pod UID, container id


class Usage:
    def __init__(
        self, procfs: Path, fs: HostFs, accelerators: Sequence[Keyed[AnyAccelerators]] | None
    ) -> None:
        self._procfs = procfs
        self._fs = fs
        self._accelerators = accelerators

    def __call__(self, collection: Collection, state: Joined) -> None:
        gpu = devices(collection, self._accelerators)
        readings = tuple(r for r in gpu.readings if r.up) if gpu is not None else ()
        active: set[str] = set()
        state.usage = self._usage(readings, state.by_uid, state.holders, active)
        state.readings, state.active = readings, active

    def _usage(
        self,
        readings: Sequence[AnyReading],
        by_uid: Mapping[str, PodMeta],
        holders: Mapping[str, list[GpuHolding]],
        active: set[str],
    ) -> tuple[PodGpuUsage, ...]:
        """Per (GPU, container) memory and utilization; adds to `active` the pod UIDs with
        GPU activity now (agent/attribution/startup.py)."""
        memory: dict[UsageKey, int | None] = {}
        util: dict[UsageKey, float | None] = {}
        # The partitions' activity groups each container's processes run in, and who runs in
        # each group (NVIDIA: the GPU instances of MIG devices).
        in_mig: dict[UsageKey, set[str]] = defaultdict(set)
        mig_users: dict[str, set[UsageKey]] = defaultdict(set)
        for reading in readings:
            uuid, gpu = reading.identity.uuid, reading.identity.index
            gi_of = {p.uuid: p.activity_group or p.uuid for p in reading.partitions}
            for proc in reading.processes:
                owner = self._owner(proc.pid)
                if owner is None:
                    continue  # exited since NVML listed it, or dropped (and counted)
                if owner.pod_uid and _active(reading, proc):
                    active.add(owner.pod_uid)
                key = (gpu, uuid, owner.pod_uid, owner.container_id or "")
                memory[key] = _add(memory.get(key, 0), proc.used_memory_bytes)
                util[key] = _add(util.get(key, 0.0), proc.utilization_ratio)
                if proc.partition_uuid in gi_of:
                    in_mig[key].add(gi_of[proc.partition_uuid])
                    mig_users[gi_of[proc.partition_uuid]].add(key)
        util.update(_mig_utilization(readings, in_mig, mig_users))
        usage = []
        for key in sorted(memory):
            gpu, uuid, pod_uid, container_id = key
            meta = by_uid.get(pod_uid) if pod_uid else None
            ref = pod_ref(meta) if meta is not None else PodRef(pod_uid, "", "", NO_WORKLOAD)
            ratio = util[key]
            usage.append(
                PodGpuUsage(
                    gpu=gpu,
                    uuid=uuid,
                    pod=ref,
                    container=_container_name(meta, container_id, holders.get(uuid, [])),
                    memory_bytes=memory[key],
                    utilization_ratio=min(1.0, ratio) if ratio is not None else None,
                )
            )
        return tuple(usage)

    def _owner(self, pid: int) -> PodCgroup | None:
        """One process's pod, isolated: a process whose cgroup cannot be read or parsed is
        dropped and counted (`Attribution.dropped`), and the others are still attributed."""
        try:
            owner = process_pod(self._procfs, pid, self._fs)
        except Exception as exc:  # noqa: BLE001 - a parser bug costs this process only
            self._fs.note(f"pid {pid}", "invalid", f"process {pid}: {describe(exc)}")
            return None
        return None if isinstance(owner, Dropped) else owner


def _mig_utilization(
    readings: Sequence[AnyReading],
    in_mig: Mapping[UsageKey, set[str]],
    mig_users: Mapping[str, set[UsageKey]],
) -> dict[UsageKey, float | None]:
    """In a partition the library may have no per-process utilization (NVIDIA's MIG): a
    container whose processes all run in one activity group, and are its only ones, gets
    that group's activity (NVIDIA: the GPU instance's GPM graphics-engine activity; GPM
    samples GPU instances, so two containers in one cannot be told apart)."""
    activity = {
        p.activity_group or p.uuid: p.active_ratio
        for r in readings
        for p in r.partitions
        if p.active_ratio is not None
    }
    out: dict[UsageKey, float | None] = {}
    for key, instances in in_mig.items():
        if len(instances) != 1:
            continue
        (gi,) = instances
        if mig_users.get(gi) == {key} and activity.get(gi) is not None:
            out[key] = activity[gi]
    return out


def _active(reading: AnyReading, proc: DeviceProcess) -> bool:
    """The process ran a kernel since the previous read: its utilization, or where the
    library has none per process (a MIG device), its partition's activity, else the GPU's
    utilization."""
    if proc.utilization_ratio is not None:
        return proc.utilization_ratio > 0
    if proc.partition_uuid:
        for p in reading.partitions:
            if p.uuid == proc.partition_uuid:
                return p.active_ratio is not None and p.active_ratio > 0
        return False
    return reading.utilization_ratio is not None and reading.utilization_ratio > 0


N = TypeVar("N", int, float)


def _add(total: N | None, value: N | None) -> N | None:
    """Sum where a None (unknown) makes the total unknown."""
    if total is None or value is None:
        return None
    return total + value


def _container_name(meta: PodMeta | None, container_id: str, holders: list[GpuHolding]) -> str:
    """The container's name from the API; else, when the kubelet says exactly one container
    of that pod holds the GPU, that one; else empty (never a guess)."""
    if meta is None:
        return ""
    name = meta.containers.get(container_id) if container_id else None
    if name:
        return name
    mine = {h.container for h in holders if (h.namespace, h.pod) == (meta.namespace, meta.name)}
    return mine.pop() if len(mine) == 1 else ""


def _build(ctx: StageContext) -> Usage:
    return Usage(ctx.procfs, ctx.fs, ctx.accelerators)


USAGE = StageSpec(
    name="usage",
    summary="Each container's memory and utilization of each GPU, its processes found "
    "through their cgroups; the pods with GPU activity now.",
    sources=(ACCELERATORS,),
    reads=("by_uid", "holders"),
    adds=("readings", "usage", "active"),
    build=_build,
)

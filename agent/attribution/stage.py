"""The attribution stage: one collection in, the same collection with its owners out.

Runs after the sources on every scrape (serialized: the idle counters are state). Each join
degrades on its own: without the kubelet there are no allocations (and no idle or
unallocated figures) but GPU processes are still attributed through their cgroups; without
the Kubernetes API, series carry `pod_uid` and the last names the API gave.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from gpuscope.agent.attribution import mig
from gpuscope.agent.attribution.activity import ActivityInput, LowActivityAccountant
from gpuscope.agent.attribution.cause import Rates, SignalRates, idle_cause
from gpuscope.agent.attribution.energy import EnergyAccountant
from gpuscope.agent.attribution.idle import GpuIdleInput, IdleAccountant, Judge
from gpuscope.agent.attribution.options import AttributionOptions
from gpuscope.agent.attribution.processes import Dropped, process_pod
from gpuscope.agent.attribution.records import (
    WORKLOAD_LIMIT,
    Attribution,
    GpuHolding,
    GpuStatus,
    MigStatus,
    PodEnergy,
    PodGpuUsage,
    PodName,
    PodRef,
    PodSignals,
    PodStartup,
)
from gpuscope.agent.attribution.startup import StartupTracker
from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.gpu.collector import GPU
from gpuscope.agent.gpu.records import GpuProcess, GpuReading, GpuSnapshot
from gpuscope.agent.hostfs import HostFs, Reason
from gpuscope.agent.k8s.cgroups import PodCgroup
from gpuscope.agent.k8s.collector import KUBELET, PODS
from gpuscope.agent.k8s.dra_collector import DRA
from gpuscope.agent.k8s.dra_records import DraSnapshot
from gpuscope.agent.k8s.pod_cgroup_usage import PodCgroupReader, PodCgroupUsage
from gpuscope.agent.k8s.podresources.gpus import DEFAULT_GPU_RESOURCES, match_gpus
from gpuscope.agent.k8s.podresources.records import KubeletSnapshot
from gpuscope.agent.k8s.records import PodMeta
from gpuscope.agent.k8s.workloads import Workload
from gpuscope.agent.net.collector import NET
from gpuscope.agent.net.records import NetSnapshot
from gpuscope.agent.runtime.sources import Collection, describe

log = logging.getLogger("gpuscope.attribution")

NO_WORKLOAD = Workload("", "")


class Attributor:
    def __init__(
        self,
        procfs: Path = Path("/proc"),
        *,
        gpu_resource_names: Sequence[str] = DEFAULT_GPU_RESOURCES,
        clock: Clock | None = None,
        idle: IdleAccountant | None = None,
        options: AttributionOptions | None = None,
        pod_signals: PodCgroupReader | None = None,
    ) -> None:
        self._procfs = procfs
        self._resources = tuple(gpu_resource_names)
        self._clock = clock or SystemClock()
        opts = options or AttributionOptions()
        self._idle = idle or IdleAccountant(opts.workload_prune_grace, opts.max_workloads)
        self._low = LowActivityAccountant(
            opts.low_activity_busy_threshold,
            opts.low_activity_sm_threshold,
            opts.workload_prune_grace,
            opts.max_workloads,
        )
        self._workloads_over = False  # past --max-workloads, until back under 90% of it
        self._workloads_dropped = 0
        self._energy = EnergyAccountant()
        self._signals = pod_signals  # None: no per-pod cgroup signals
        self._signals_all = opts.pod_signals_all_pods
        self._rates = SignalRates()  # the GPU holders' signals as rates, for the idle causes
        self._cause_thresholds = (
            opts.idle_cause_pressure_threshold,
            opts.idle_cause_retransmit_threshold,
        )
        self._startup = StartupTracker()
        self._mig_active = mig.LastActive()
        self._lock = threading.Lock()
        self._pods: Mapping[str, PodMeta] = {}  # last answer of the pods source, by UID
        # Derived from `_pods`, rebuilt only when the pod list changes (not every scrape).
        self._by_name: Mapping[tuple[str, str], PodMeta] = {}
        self._net_names: Mapping[str, PodName] = {}
        self._unmatched_logged: set[str] = set()
        self._dra_unresolved: frozenset[str] = frozenset()
        self._fs = HostFs("attribution", logger=log)

    def attribute(self, collection: Collection) -> Attribution:
        """What the join adds to `collection`; the sources' records are left as they are."""
        with self._lock:
            return self._attribute(collection)

    def _attribute(self, collection: Collection) -> Attribution:
        gpu = collection.records(GPU)
        kubelet = collection.records(KUBELET)
        pods_now = collection.last_records(PODS)  # names survive an API outage
        if pods_now is not None and pods_now.pods is not self._pods:
            self._pods = pods_now.pods
            self._by_name = {(m.namespace, m.name): m for m in self._pods.values()}
            self._net_names = {uid: _net_name(m) for uid, m in self._pods.items()}
        by_uid, by_name = self._pods, self._by_name

        readings = [r for r in gpu.gpus if r.up] if gpu is not None else []
        dra = collection.last_records(DRA)  # allocations survive an API outage, as names do
        holdings = self._holdings(kubelet, gpu, by_name, dra) if kubelet is not None else None
        holders: dict[str, list[GpuHolding]] = defaultdict(list)
        for h in holdings or ():
            holders[h.uuid].append(h)

        active: set[str] = set()
        usage = self._usage(readings, by_uid, holders, active)
        startups = self._startups(active, by_uid) if gpu is not None else self._blind()
        # The holders' cgroup signals are read before the idle accounts, which charge each
        # interval to a cause from them (agent/attribution/cause.py).
        net = collection.records(NET)
        signals, judge = self._pod_signals(holdings or (), usage, by_uid, by_name, net)
        statuses: tuple[GpuStatus, ...] = ()
        migs: tuple[MigStatus, ...] = ()
        energy: tuple[PodEnergy, ...] = ()
        if holdings is not None:
            refused = gpu.processes_refused if gpu is not None else frozenset()
            statuses, migs = self._statuses(readings, holders, usage, refused, judge)
            self._say_workloads()
            energy = self._energy.evaluate(readings, holders, usage, _refs(holdings, by_name))
        else:
            self._idle.forget_baselines()
            self._low.forget_baselines()
            self._energy.forget_baselines()

        pod_uids = {u.pod.uid for u in usage}
        if net is not None:
            pod_uids.update(p.pod_uid for p in net.pods)
        for h in holdings or ():
            meta = by_name.get((h.namespace, h.pod))
            if meta is not None:
                pod_uids.add(meta.uid)
        pods = tuple(_ref(by_uid[uid]) for uid in sorted(pod_uids) if uid and uid in by_uid)
        held = holdings is not None
        return Attribution(
            holdings=holdings or (),
            gpus=statuses,
            usage=usage,
            pods=pods,
            idle_seconds_total=self._idle.totals() if holdings is not None else {},
            migs=migs,
            low_activity_seconds_total=self._low.totals() if holdings is not None else {},
            energy=energy,
            pod_names=self._net_names,
            dropped=self._dropped(),
            pod_signals=signals,
            idle_cause_seconds_total=self._idle.cause_totals() if held else {},
            low_activity_cause_seconds_total=self._low.cause_totals() if held else {},
            startups=startups,
            series_dropped={WORKLOAD_LIMIT: self._workloads_dropped},
        )

    def _say_workloads(self) -> None:
        """One line when the workloads pass --max-workloads, one when they are well under it
        again (90%), never one per evaluation; the count is in gpuscope_series_dropped_total."""
        dropped = self._idle.dropped_series + self._low.dropped_series
        limit = self._idle.limit
        if dropped > self._workloads_dropped and not self._workloads_over:
            log.warning(
                "more than --max-workloads %d workloads held a GPU within --workload-prune-grace: "
                "the counters of those that held none for longest are dropped early, and "
                "holders without a place are not counted (gpuscope_series_dropped_total"
                '{reason="workload_limit"})',
                limit,
            )
            self._workloads_over = True
        elif self._workloads_over and self._idle.workloads < 0.9 * limit:
            log.info(
                "%d workloads kept, within --max-workloads %d again", self._idle.workloads, limit
            )
            self._workloads_over = False
        self._workloads_dropped = dropped

    def _startups(self, active: set[str], by_uid: Mapping[str, PodMeta]) -> tuple[PodStartup, ...]:
        known = self._startup.evaluate(active, by_uid, self._clock.time())
        return tuple(PodStartup(_ref(by_uid[u]), s) for u, s in sorted(known.items()))

    def _blind(self) -> tuple[PodStartup, ...]:
        self._startup.blind()  # no GPU records: activity meanwhile is unseen
        return ()

    def _dropped(self) -> dict[Reason, int]:
        """The stage's dropped inputs: GPU processes' cgroup files and pods' cgroup files."""
        counts = dict(self._fs.counts())
        if self._signals is not None:
            for reason, n in self._signals.fs.counts().items():
                counts[reason] = counts.get(reason, 0) + n
        return counts

    def _pod_signals(
        self,
        holdings: Sequence[GpuHolding],
        usage: Sequence[PodGpuUsage],
        by_uid: Mapping[str, PodMeta],
        by_name: Mapping[tuple[str, str], PodMeta],
        net: NetSnapshot | None = None,
    ) -> tuple[tuple[PodSignals, ...], Judge]:
        """The cgroup signals of the pods that hold a GPU (by the kubelet, or running GPU
        processes), or of every pod the API lists with --pod-signals-all-pods, and the judge
        of idle causes from the holders' signals. The reader reads each pod at most once per
        interval, so scrapes in between cost a lookup (and leave the holders' rates as they
        were)."""
        holder_uids = {m.uid for h in holdings if (m := by_name.get((h.namespace, h.pod)))}
        read: Mapping[str, PodCgroupUsage] = {}
        if self._signals is not None:
            if self._signals_all:
                uids = set(by_uid)
            else:
                uids = {u.pod.uid for u in usage if u.pod.uid} | holder_uids
            try:
                read = self._signals.read(uids)
            except Exception as exc:  # noqa: BLE001 - a reader bug costs these signals only
                self._fs.note("pod cgroups", "invalid", f"pod cgroup signals: {describe(exc)}")
        self._rates.update(holder_uids, read, net, self._clock.monotonic())
        rates, thresholds = self._rates, self._cause_thresholds

        def judge(holders: Sequence[GpuHolding]) -> str:
            names = sorted({(h.namespace, h.pod) for h in holders})
            found = [by_name.get(n) for n in names]
            return idle_cause(
                (rates.of(m.uid) if m is not None else Rates() for m in found), *thresholds
            )

        return tuple(
            PodSignals(
                _ref(by_uid[uid]) if uid in by_uid else PodRef(uid, "", "", NO_WORKLOAD),
                read[uid],
            )
            for uid in sorted(read)
        ), judge

    def _holdings(
        self,
        kubelet: KubeletSnapshot,
        gpu: GpuSnapshot | None,
        by_name: Mapping[tuple[str, str], PodMeta],
        dra: DraSnapshot | None = None,
    ) -> tuple[GpuHolding, ...]:
        if gpu is None:
            return ()
        index = {r.identity.uuid: r.identity.index for r in gpu.gpus if r.identity.uuid}
        migs = {m.mig_uuid: r.identity.uuid for r in gpu.gpus for m in r.mig_instances}
        match = match_gpus(kubelet.pods, self._resources, gpu_uuids=index, mig_uuids=migs)
        allocations = [(a.uuid, a.namespace, a.pod, a.container) for a in match.allocations]
        mig_names = mig.mig_ids(gpu.gpus)
        held_migs = {  # the MIG devices of each allocation above (DRA's: none yet)
            (a.uuid, a.namespace, a.pod, a.container, mig_names.get(a.mig_uuid, a.mig_uuid))
            for a in match.allocations
            if a.mig_uuid
        }
        by_mig = {h[:4] for h in held_migs}
        if dra is not None:
            allocations.extend(self._dra_allocations(dra, kubelet, index, migs))
        for miss in match.unmatched:
            if miss.device.device_id not in self._unmatched_logged:
                self._unmatched_logged.add(miss.device.device_id)
                log.warning(
                    "pod %s/%s container %s holds %s %r, which names no GPU of this node",
                    miss.namespace,
                    miss.pod,
                    miss.container,
                    miss.device.resource_name,
                    miss.device.device_id,
                )
        out: dict[GpuHolding, None] = {}
        for uuid, namespace, pod, container in allocations:
            meta = by_name.get((namespace, pod))
            workload = meta.workload if meta is not None else NO_WORKLOAD
            holding = GpuHolding(index[uuid], uuid, namespace, pod, container, workload)
            if (uuid, namespace, pod, container) not in by_mig:
                out[holding] = None
        for uuid, namespace, pod, container, mig_uuid in sorted(held_migs):
            meta = by_name.get((namespace, pod))
            workload = meta.workload if meta is not None else NO_WORKLOAD
            out[GpuHolding(index[uuid], uuid, namespace, pod, container, workload, mig_uuid)] = None
        return tuple(out)

    def _dra_allocations(
        self,
        dra: DraSnapshot,
        kubelet: KubeletSnapshot,
        index: Mapping[str, int],
        migs: Mapping[str, str],
    ) -> list[tuple[str, str, str, str]]:
        """(GPU UUID, namespace, pod, container) of each DRA allocation the API names.

        The kubelet's answer says which pods are alive on this node (a finished pod's claim
        may stay reserved a while); the claims and slices say which GPU each container got,
        which the kubelet's CDI names for NVIDIA's driver do not. A device that cannot be
        named, or names no GPU of this node, is said once, while it stays so.
        """
        alive = {(p.namespace, p.name) for p in kubelet.pods}
        problems = set(dra.unresolved)
        out = []
        for a in dra.allocations:
            if (a.namespace, a.pod) not in alive:
                continue
            # The device's own UUID (a GPU, or a MIG device of one); else, for a device
            # published without one or a MIG device NVML does not list yet, its GPU.
            uuid = a.device_uuid if a.device_uuid in index else migs.get(a.device_uuid)
            if uuid is None and a.parent_uuid in index:
                uuid = a.parent_uuid
            if uuid is None:
                named = a.device_uuid or f"on GPU {a.parent_uuid}"
                problems.add(
                    f"claim {a.namespace}/{a.claim} (pod {a.pod}) device "
                    f"{a.driver}/{a.pool}/{a.device} is {named}, no GPU of this node"
                )
                continue
            out.append((uuid, a.namespace, a.pod, a.container))
        for line in sorted(problems - self._dra_unresolved):
            log.warning("DRA: %s; left unattributed", line)
        self._dra_unresolved = frozenset(problems)
        return out

    def _usage(
        self,
        readings: Sequence[GpuReading],
        by_uid: Mapping[str, PodMeta],
        holders: Mapping[str, list[GpuHolding]],
        active: set[str] | None = None,
    ) -> tuple[PodGpuUsage, ...]:
        """Per (GPU, container) memory and utilization; adds to `active` the pod UIDs with
        GPU activity now (agent/attribution/startup.py)."""
        memory: dict[tuple[int, str, str, str], int | None] = {}
        util: dict[tuple[int, str, str, str], float | None] = {}
        in_mig: dict[tuple[int, str, str, str], set[tuple[str, int]]] = defaultdict(set)
        mig_users: dict[tuple[str, int], set[tuple[int, str, str, str]]] = defaultdict(set)
        for reading in readings:
            uuid, gpu = reading.identity.uuid, reading.identity.index
            gi_of = {m.mig_uuid: m.gpu_instance for m in reading.mig_instances}
            for proc in reading.processes:
                owner = self._owner(proc.pid)
                if owner is None:
                    continue  # exited since NVML listed it, or dropped (and counted)
                if active is not None and owner.pod_uid and _active(reading, proc):
                    active.add(owner.pod_uid)
                key = (gpu, uuid, owner.pod_uid, owner.container_id or "")
                memory[key] = _add(memory.get(key, 0), proc.used_memory_bytes)
                util[key] = _add(util.get(key, 0.0), proc.sm_utilization_ratio)
                if proc.mig_uuid in gi_of:
                    in_mig[key].add((uuid, gi_of[proc.mig_uuid]))
                    mig_users[(uuid, gi_of[proc.mig_uuid])].add(key)
        util.update(_mig_utilization(readings, in_mig, mig_users))
        usage = []
        for key in sorted(memory):
            gpu, uuid, pod_uid, container_id = key
            meta = by_uid.get(pod_uid) if pod_uid else None
            ref = _ref(meta) if meta is not None else PodRef(pod_uid, "", "", NO_WORKLOAD)
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

    def _statuses(
        self,
        readings: Sequence[GpuReading],
        holders: Mapping[str, list[GpuHolding]],
        usage: Sequence[PodGpuUsage],
        refused: frozenset[str] = frozenset(),
        judge: Judge | None = None,
    ) -> tuple[tuple[GpuStatus, ...], tuple[MigStatus, ...]]:
        unallocated: dict[str, int] = defaultdict(int)
        for u in usage:
            if u.memory_bytes is None:
                continue
            held_by = {(h.namespace, h.pod) for h in holders.get(u.uuid, [])}
            if not u.pod.uid:
                unallocated[u.uuid] += u.memory_bytes  # a host process
            elif u.pod.name and (u.pod.namespace, u.pod.name) not in held_by:
                unallocated[u.uuid] += u.memory_bytes  # a pod using a GPU it was not given
            # A pod whose name the API never gave cannot be compared: not counted.
        now, monotonic = self._clock.time(), self._clock.monotonic()
        # MIG devices are accounted as devices of their own, keyed by MIG UUID, with GPM's
        # idle time of their GPU instance and their share of the GPU (agent/attribution/mig.py).
        devices = {m.mig_uuid: (r, m) for r in readings for m in r.mig_instances}
        by_device: dict[str, list[GpuHolding]] = dict(holders)
        for h in (h for hs in holders.values() for h in hs if h.mig_uuid):
            by_device.setdefault(h.mig_uuid, []).append(h)
        weight = {u: w for r in readings if r.mig_instances for u, w in mig.shares(r).items()}
        last_active = self._mig_active.update({u: m for u, (_, m) in devices.items()}, now)
        mig_inputs = [
            GpuIdleInput(
                u,
                m.integrals.idle_seconds if m.integrals is not None else None,
                last_active.get(u),
                weight.get(u, 0.0),
            )
            for u, (_, m) in devices.items()
        ]
        gpu_inputs = [
            GpuIdleInput(r.identity.uuid, r.idle_seconds, r.last_active_timestamp) for r in readings
        ]
        gauges = self._idle.evaluate(
            [*gpu_inputs, *mig_inputs], by_device, now=now, monotonic=monotonic, judge=judge
        )
        self._low.evaluate(
            [
                *(
                    ActivityInput(r.identity.uuid, r.busy_seconds, r.sm_active_seconds)
                    for r in readings
                    if not r.mig_instances
                ),
                *(
                    ActivityInput(
                        u, m.integrals.busy_seconds, m.integrals.sm_active_seconds, weight[u]
                    )
                    for u, (_, m) in devices.items()
                    if m.integrals is not None
                ),
            ],
            by_device,
            monotonic=monotonic,
            judge=judge,
        )
        statuses = tuple(
            GpuStatus(
                gpu=r.identity.index,
                uuid=r.identity.uuid,
                allocated=bool(holders.get(r.identity.uuid)),
                unallocated_memory_bytes=(
                    None if r.identity.uuid in refused else unallocated.get(r.identity.uuid, 0)
                ),
                idle_seconds=gauges.get(r.identity.uuid),
            )
            for r in readings
        )
        migs = tuple(
            MigStatus(
                gpu=r.identity.index,
                uuid=r.identity.uuid,
                mig_uuid=u,
                allocated=any(h.mig_uuid == u for h in holders.get(r.identity.uuid, [])),
                idle_seconds=gauges.get(u),
            )
            for u, (r, m) in devices.items()
        )
        return statuses, migs


def _mig_utilization(
    readings: Sequence[GpuReading],
    in_mig: Mapping[tuple[int, str, str, str], set[tuple[str, int]]],
    mig_users: Mapping[tuple[str, int], set[tuple[int, str, str, str]]],
) -> dict[tuple[int, str, str, str], float | None]:
    """On MIG, NVML has no per-process utilization: a container whose processes all run in
    one GPU instance, and are its only ones, gets that instance's GPM graphics-engine
    activity (GPM samples GPU instances, so two containers in one cannot be told apart)."""
    activity = {
        (r.identity.uuid, m.gpu_instance): m.gpm.graphics_engine_active
        for r in readings
        for m in r.mig_instances
        if m.gpm is not None
    }
    out: dict[tuple[int, str, str, str], float | None] = {}
    for key, instances in in_mig.items():
        if len(instances) != 1:
            continue
        (gi,) = instances
        if mig_users.get(gi) == {key} and activity.get(gi) is not None:
            out[key] = activity[gi]
    return out


def _active(reading: GpuReading, proc: GpuProcess) -> bool:
    """The process ran a kernel since the previous read: its SM utilization, or where NVML
    has none per process (MIG), its GPU instance's GPM graphics-engine activity, else the
    GPU's utilization."""
    if proc.sm_utilization_ratio is not None:
        return proc.sm_utilization_ratio > 0
    if proc.mig_uuid:
        for m in reading.mig_instances:
            if m.mig_uuid == proc.mig_uuid:
                active = m.gpm.graphics_engine_active if m.gpm is not None else None
                return active is not None and active > 0
        return False
    return reading.utilization_ratio is not None and reading.utilization_ratio > 0


N = TypeVar("N", int, float)


def _add(total: N | None, value: N | None) -> N | None:
    """Sum where a None (unknown) makes the total unknown."""
    if total is None or value is None:
        return None
    return total + value


def _ref(meta: PodMeta) -> PodRef:
    return PodRef(meta.uid, meta.namespace, meta.name, meta.workload)


def _refs(
    holdings: Sequence[GpuHolding], by_name: Mapping[tuple[str, str], PodMeta]
) -> dict[tuple[str, str], PodRef]:
    """Each holder pod as users name it: the API's pod, else the kubelet's names alone."""
    out: dict[tuple[str, str], PodRef] = {}
    for h in holdings:
        meta = by_name.get((h.namespace, h.pod))
        out[(h.namespace, h.pod)] = (
            _ref(meta) if meta is not None else PodRef("", h.namespace, h.pod, h.workload)
        )
    return out


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


def _net_name(meta: PodMeta) -> PodName:
    return PodName(
        namespace=meta.namespace,
        pod=meta.name,
        workload_kind=meta.workload.kind,
        workload=meta.workload.name,
        containers=meta.containers,
    )

"""Stage `holdings`: which container holds which GPU (or MIG device of one), from the
kubelet's PodResources answer and the Kubernetes API's DRA claims, named by the GPU
records' UUIDs.

Without the kubelet there are no holdings (`None`): no idle or unallocated figures are
claimed, while GPU processes are still attributed through their cgroups (stage `usage`).
DRA allocations survive an API outage, as names do; the kubelet says which of their pods
are still alive. An id that names no GPU of this node is said once, while it stays so.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gpuscope.agent.attribution.devices import ACCELERATORS, Devices, devices
from gpuscope.agent.attribution.records import GpuHolding
from gpuscope.agent.attribution.spec import StageContext, StageSpec
from gpuscope.agent.attribution.state import NO_WORKLOAD, Joined
from gpuscope.agent.k8s.collector import KUBELET
from gpuscope.agent.k8s.dra_collector import DRA
from gpuscope.agent.k8s.podresources.gpus import match_gpus

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyAccelerators
    from gpuscope.agent.k8s.dra_records import DraSnapshot
    from gpuscope.agent.k8s.podresources.records import KubeletSnapshot
    from gpuscope.agent.k8s.records import PodMeta
    from gpuscope.agent.runtime.sources import Collection, Keyed

log = logging.getLogger("gpuscope.attribution")


class Holdings:
    def __init__(
        self,
        gpu_resource_names: Sequence[str],
        accelerators: Sequence[Keyed[AnyAccelerators]] | None,
    ) -> None:
        self._resources = tuple(gpu_resource_names)
        self._accelerators = accelerators
        self._unmatched_logged: set[str] = set()
        self._dra_unresolved: frozenset[str] = frozenset()

    def __call__(self, collection: Collection, state: Joined) -> None:
        kubelet = collection.records(KUBELET)
        gpu = devices(collection, self._accelerators)
        dra = collection.last_records(DRA)  # allocations survive an API outage
        holdings = self._holdings(kubelet, gpu, state.by_name, dra) if kubelet is not None else None
        holders: dict[str, list[GpuHolding]] = defaultdict(list)
        for h in holdings or ():
            holders[h.uuid].append(h)
        state.holdings, state.holders = holdings, holders

    def _holdings(
        self,
        kubelet: KubeletSnapshot,
        gpu: Devices | None,
        by_name: Mapping[tuple[str, str], PodMeta],
        dra: DraSnapshot | None,
    ) -> tuple[GpuHolding, ...]:
        if gpu is None:
            return ()
        index = {r.identity.uuid: r.identity.index for r in gpu.readings if r.identity.uuid}
        # Every id of a partition (its UUID, and the names device plugins give it) -> its GPU.
        migs = {
            i: r.identity.uuid for r in gpu.readings for p in r.partitions for i in (p.uuid, *p.ids)
        }
        # A whole GPU by its PCI address (AMD's device plugin names GPUs so).
        aliases = {
            r.identity.pci_bus_id: r.identity.uuid
            for r in gpu.readings
            if r.identity.pci_bus_id and r.identity.uuid
        }
        match = match_gpus(
            kubelet.pods, self._resources, gpu_uuids=index, mig_uuids=migs, aliases=aliases
        )
        allocations = [(a.uuid, a.namespace, a.pod, a.container) for a in match.allocations]
        # Every id a device plugin may give a partition -> its UUID.
        mig_names = {i: p.uuid for r in gpu.readings for p in r.partitions for i in p.ids}
        held_migs = {  # the partitions of each allocation above (DRA's: none yet)
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


def _build(ctx: StageContext) -> Holdings:
    return Holdings(ctx.gpu_resource_names, ctx.accelerators)


HOLDINGS = StageSpec(
    name="holdings",
    summary="Which container holds which GPU or MIG device: the kubelet's and DRA's "
    "allocations, by the GPU records' UUIDs.",
    sources=(ACCELERATORS, KUBELET, DRA),
    reads=("by_name",),
    adds=("holdings", "holders"),
    build=_build,
)

"""The `dra` source: which GPU each container got through Dynamic Resource Allocation.

Three list + watch caches (agent/k8s/listwatch.py), each on its own thread:

- this node's pods that use claims (`fieldSelector=spec.nodeName=<node>`);
- every ResourceClaim (the API has no field selector for a claim's node, so all namespaces
  are watched), keeping only claims allocated GPUs on this node
  (their allocation's node selector), and of those only the GPU results and the UIDs of the
  pods each is reserved for;
- this node's ResourceSlices (`fieldSelector=spec.nodeName=<node>`), of the GPU drivers only.

Claims and slices are read in the newest version of `resource.k8s.io` the API server serves,
`v1` (Kubernetes 1.34+), else `v1beta2` (1.33), else `v1beta1` (1.32, the oldest NVIDIA's
driver supports): the group's discovery document says which (agent/k8s/listwatch.py), and
`dra.parse_*` read every version's shape.

A collection joins them (`dra.resolve`), recomputed only when one of the caches changed.
As for the `pods` source, a watch that fails keeps its last objects and the collection
fails as stale (`collector_success{collector="dra"} 0`, the last allocations still used),
and so does one that has heard nothing for `stale_after` seconds.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.k8s import dra
from gpuscope.agent.k8s.dra_records import DEFAULT_DRA_DRIVERS, DraSnapshot
from gpuscope.agent.k8s.listwatch import ListWatch
from gpuscope.agent.runtime.sources import SourceStale, SourceUnavailable


class DraSource:
    name = "dra"

    def __init__(
        self,
        client_factory: Callable[[], Any],
        node_name: str,
        *,
        drivers: Collection[str] = DEFAULT_DRA_DRIVERS,
        sync_timeout: float = 5.0,
        stale_after: float = 90.0,
        read_timeout: float = 75.0,
        clock: Clock | None = None,
        **watch_options: Any,
    ) -> None:
        """`watch_options` go to each `ListWatch` (backoffs, the server-side watch timeout)."""
        from lightkube.resources import resource_v1, resource_v1beta1, resource_v1beta2
        from lightkube.resources.core_v1 import Pod

        versions = (resource_v1, resource_v1beta2, resource_v1beta1)  # newest first
        self._clock = clock or SystemClock()
        wanted = frozenset(drivers)
        on_node = {"spec.nodeName": node_name}
        common: dict[str, Any] = {
            "read_timeout": read_timeout,
            "monotonic": self._clock.monotonic,
            **watch_options,
        }
        self.pods: ListWatch[str, dra.PodClaims] = ListWatch(
            client_factory, Pod, dra.parse_pod, what=f"pods of node {node_name}",
            namespace="*", fields=on_node, **common,
        )  # fmt: skip
        parse_claim = functools.partial(dra.parse_claim, drivers=wanted, node_name=node_name)
        self.claims: ListWatch[dra.ClaimKey, dra.Claim] = ListWatch(
            client_factory, [v.ResourceClaim for v in versions], parse_claim,
            what="resourceclaims.resource.k8s.io", namespace="*", **common,
        )  # fmt: skip
        self.slices: ListWatch[str, tuple[dra.SliceDevice, ...]] = ListWatch(
            client_factory, [v.ResourceSlice for v in versions],
            functools.partial(dra.parse_slice, drivers=wanted),
            what=f"resourceslices.resource.k8s.io of node {node_name}", fields=on_node,
            **common,
        )  # fmt: skip
        self._watches: tuple[ListWatch[Any, Any], ...] = (self.pods, self.claims, self.slices)
        self._sync_timeout = sync_timeout
        self._stale_after = stale_after
        self._started = False
        self._inputs: tuple[Mapping[Any, Any], ...] = ()
        self._snapshot = DraSnapshot()

    def start(self) -> None:
        if not self._started:
            for watch in self._watches:
                watch.start()
            self._started = True
        for watch in self._watches:  # the first lists, in parallel: one sync timeout in all
            watch.attempted.wait(self._sync_timeout)

    def read(self) -> DraSnapshot:
        for watch in self._watches:
            if not watch.synced.is_set():
                raise SourceUnavailable(
                    f"Kubernetes API: no list of {watch.what} yet: {watch.error or 'waiting'}"
                )
        snapshot = self._join()
        for watch in self._watches:
            trouble = watch.trouble(self._stale_after)
            if trouble is not None:  # the last allocations are kept meanwhile
                raise SourceStale(f"Kubernetes API: {trouble}", snapshot)
        return snapshot

    def _join(self) -> DraSnapshot:
        inputs = (self.pods.items(), self.claims.items(), self.slices.items())
        if len(inputs) != len(self._inputs) or any(
            a is not b for a, b in zip(inputs, self._inputs, strict=True)
        ):
            pods, claims, slices = inputs
            self._snapshot = dra.resolve(pods.values(), claims, slices.values())
            self._inputs = inputs
        return self._snapshot

    def stop(self) -> None:
        if self._started:
            # All three asked at once, then one second for all: a watch blocked on a quiet
            # API server ends only at its read timeout (its thread is a daemon).
            for watch in self._watches:
                watch.signal_stop()
            deadline = time.monotonic() + 1.0
            for watch in self._watches:
                watch.stop(timeout=max(0.0, deadline - time.monotonic()))
            self._started = False

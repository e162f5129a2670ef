"""Stage `names`: the pods the Kubernetes API lists on this node, by UID and by name, and
the names network series are labelled with.

Taken from the pods source's last answer, even a failed collection's (`SourceStale`), so
series keep their names through an API outage. The mappings are rebuilt only when the pod
list changes, not on every scrape, and each is shared by the scrapes in between.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuscope.agent.attribution.records import PodName
from gpuscope.agent.attribution.spec import StageContext, StageSpec
from gpuscope.agent.k8s.collector import PODS

if TYPE_CHECKING:
    from gpuscope.agent.attribution.state import Joined
    from gpuscope.agent.k8s.records import PodMeta
    from gpuscope.agent.runtime.sources import Collection


class PodNames:
    def __init__(self) -> None:
        self._pods: Mapping[str, PodMeta] = {}  # the last answer of the pods source, by UID
        self._by_name: Mapping[tuple[str, str], PodMeta] = {}
        self._net_names: Mapping[str, PodName] = {}

    def __call__(self, collection: Collection, state: Joined) -> None:
        now = collection.last_records(PODS)
        if now is not None and now.pods is not self._pods:
            self._pods = now.pods
            self._by_name = {(m.namespace, m.name): m for m in self._pods.values()}
            self._net_names = {uid: _net_name(m) for uid, m in self._pods.items()}
        state.by_uid, state.by_name, state.pod_names = self._pods, self._by_name, self._net_names


def _net_name(meta: PodMeta) -> PodName:
    return PodName(
        namespace=meta.namespace,
        pod=meta.name,
        workload_kind=meta.workload.kind,
        workload=meta.workload.name,
        containers=meta.containers,
    )


def _build(_: StageContext) -> PodNames:
    return PodNames()


NAMES = StageSpec(
    name="names",
    summary="This node's pods by UID and by name, from the pods source's last answer.",
    sources=(PODS,),
    reads=(),
    adds=("by_uid", "by_name", "pod_names"),
    build=_build,
)

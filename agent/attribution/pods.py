"""Stage `pods`: the pods a scrape names, those that hold a GPU, run GPU processes or have
network traffic, as the Kubernetes API names them (`Attribution.pods`). A pod the API has
not named is left out: its series carry only its UID.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscope.agent.attribution.spec import Stage, StageContext, StageSpec
from gpuscope.agent.attribution.state import Joined, pod_ref
from gpuscope.agent.net.collector import NET

if TYPE_CHECKING:
    from gpuscope.agent.runtime.sources import Collection


def named_pods(collection: Collection, state: Joined) -> None:
    by_uid, by_name = state.by_uid, state.by_name
    pod_uids = {u.pod.uid for u in state.usage}
    net = collection.records(NET)
    if net is not None:
        pod_uids.update(p.pod_uid for p in net.pods)
    for h in state.holdings or ():
        meta = by_name.get((h.namespace, h.pod))
        if meta is not None:
            pod_uids.add(meta.uid)
    state.pods = tuple(pod_ref(by_uid[uid]) for uid in sorted(pod_uids) if uid and uid in by_uid)


def _build(_: StageContext) -> Stage:
    return named_pods  # nothing kept between collections


PODS_NAMED = StageSpec(
    name="pods",
    summary="The pods that hold a GPU, run GPU processes or have traffic, as the API names them.",
    sources=(NET,),
    reads=("by_uid", "by_name", "usage", "holdings"),
    adds=("pods",),
    build=_build,
)

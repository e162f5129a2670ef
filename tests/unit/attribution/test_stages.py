"""The attribution stages as declared (agent/attribution/stages.py): in the declared order each
reads only what the collectors and the stages before it give; run on collections, each
reads and adds what its declaration says, no more; and the record is assembled from them
whole. docs/architecture.md's table of the stages is read off the declarations."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gpuscope.agent.amd.records import AmdGpuReading, AmdGpus, AmdReading
from gpuscope.agent.app.registry import COLLECTORS, accelerators
from gpuscope.agent.attribution.devices import ACCELERATORS
from gpuscope.agent.attribution.records import Attribution
from gpuscope.agent.attribution.spec import StageSpec
from gpuscope.agent.attribution.stage import Attributor
from gpuscope.agent.attribution.stages import STAGES
from gpuscope.agent.attribution.state import Joined
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.gpu.records import GpuProcess
from gpuscope.agent.k8s.pod_cgroup_usage import CgroupRoots, PodCgroupReader
from gpuscope.agent.runtime.sources import Collection, Keyed
from tests.support import REPO
from tests.support.why_idle import gpu_collection, meta

JOINED = tuple(f.name for f in fields(Joined))
UID = "eadf4777-07b8-449a-873e-2a219705c38d"
OTHER = "0b6a3f1e-5a4d-4c1b-9f8e-7d6c5b4a3928"
GIB = 1 << 30


def test_each_stage_reads_only_what_a_stage_before_it_adds() -> None:
    added: set[str] = set()
    for spec in STAGES:
        early = sorted(set(spec.reads) - added)
        assert not early, f"stage {spec.name} reads {early} before any stage adds it"
        again = sorted(set(spec.adds) & added)
        assert not again, f"stage {spec.name} adds {again}, which an earlier stage added"
        added.update(spec.adds)


def test_every_field_is_added_by_one_stage_and_the_record_has_them_but_dropped() -> None:
    adds = [a for spec in STAGES for a in spec.adds]
    assert sorted(adds) == sorted(JOINED)  # each field of Joined by exactly one stage
    names = [spec.name for spec in STAGES]
    assert len(set(names)) == len(names)
    # `dropped` is counted where the inputs are read, not joined (agent/attribution/stage.py).
    assert {f.name for f in fields(Attribution)} - set(JOINED) == {"dropped"}


def test_the_sources_a_stage_names_are_declared_collectors_or_a_role_some_have() -> None:
    declared = {c.name: c for c in COLLECTORS}
    assert accelerators(declared), "no collector has the role ACCELERATORS stands for"
    for spec in STAGES:
        for source in spec.sources:
            if source is ACCELERATORS:
                continue
            assert declared.get(source.name) is source, (spec.name, source.name)


def declared_names(spec: StageSpec) -> set[str]:
    """The collectors a stage may ask for records: ACCELERATORS stands for every collector
    of that role."""
    names = {s.name for s in spec.sources if s is not ACCELERATORS}
    if ACCELERATORS in spec.sources:
        names |= {c.name for c in accelerators(c.name for c in COLLECTORS)}
    return names


# --- run: what each stage reads and adds --------------------------------------------------------


@dataclass
class Seen:
    """What one stage touched while it ran."""

    reads: set[str] = field(default_factory=set)
    adds: set[str] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)


class TracedJoined(Joined):
    """A `Joined` that notes each field read and set, for the stage running now."""

    seen = Seen()

    def __getattribute__(self, name: str) -> Any:
        if name in JOINED:
            type(self).seen.reads.add(name)
        return super().__getattribute__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        type(self).seen.adds.add(name)
        super().__setattr__(name, value)


class TracedCollection(Collection):
    """A `Collection` that notes which collectors' records are asked for."""

    def records(self, key: Keyed[Any]) -> Any:
        TracedJoined.seen.sources.add(key.name)
        return super().records(key)

    def last_records(self, key: Keyed[Any]) -> Any:
        TracedJoined.seen.sources.add(key.name)
        return super().last_records(key)

    def result(self, key: Keyed[Any]) -> Any:
        TracedJoined.seen.sources.add(key.name)
        return super().result(key)


def pod_process(proc: Path, pid: int, uid: str) -> GpuProcess:
    (proc / str(pid)).mkdir(parents=True)
    path = f"/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{'a' * 64}"
    (proc / str(pid) / "cgroup").write_text(f"0::{path}.scope\n")
    return GpuProcess(pid, GIB, 0.4)


def collections(tmp_path: Path, clock: ManualClock) -> Iterator[Collection]:
    """Every source on (twice: a second evaluation has baselines), then the kubelet, the GPU
    and every source gone in turn."""
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup" / "kubepods.slice"
    (cgroup / f"kubepods-pod{UID.replace('-', '_')}.slice").mkdir(parents=True)
    train, web = meta(UID, "train", scheduled_at=clock.time()), meta(OTHER, "web")
    procs = [pod_process(proc, 7, UID), pod_process(proc, 8, OTHER)]
    for i in range(2):
        yield gpu_collection(
            idle=10.0 * i, busy=5.0 * i, sm_active=0.0, pods=[train, web], processes=procs,
            retransmits={UID: 3 * i}, at=clock.time(),
        )  # fmt: skip
        clock.advance(10)
    full = gpu_collection(idle=20.0, pods=[train, web], processes=procs, at=clock.time())
    yield Collection({k: v for k, v in full.results.items() if k != "kubelet"}, clock.time())
    yield Collection({k: v for k, v in full.results.items() if k != "gpu"}, clock.time())
    yield amd_instead(full)  # the same node with an AMD GPU: the stages read it alike
    yield Collection({}, clock.time())


def amd_instead(collection: Collection) -> Collection:
    """`collection` with its NVIDIA GPU read by the `amd` collector instead."""
    results = dict(collection.results)
    gpu = results.pop("gpu")
    snapshot = gpu.records
    readings = tuple(
        AmdGpuReading(replace(r.identity, vendor="amd"), r.up, AmdReading(socket=0),
               busy_seconds=r.busy_seconds, idle_seconds=r.idle_seconds, processes=r.processes)
        for r in snapshot.gpus
    )  # fmt: skip
    amd = AmdGpus(vendor="amd", driver_version="6.10.5", library_version="26.1.0", gpus=readings)
    results["amd"] = replace(gpu, name="amd", records=amd)
    return Collection(results, collection.collected_at)


def test_each_stage_reads_and_adds_what_it_declares_no_more(tmp_path: Path) -> None:
    clock = ManualClock(1000.0)
    reader = PodCgroupReader(CgroupRoots(tmp_path / "cgroup"), clock=clock, interval=1.0)
    att = Attributor(tmp_path / "proc", clock=clock, pod_signals=reader)
    seen = {spec.name: Seen() for spec in STAGES}
    for collection in collections(tmp_path, clock):
        traced = TracedCollection(collection.results, collection.collected_at)
        state = TracedJoined()
        for spec in STAGES:
            TracedJoined.seen = Seen()
            att.stages[spec.name](traced, state)
            now = TracedJoined.seen
            assert now.adds == set(spec.adds), spec.name
            assert now.reads <= set(spec.reads) | set(spec.adds), spec.name
            assert now.sources <= declared_names(spec), spec.name
            for total, part in zip(astuple(seen[spec.name]), astuple(now), strict=True):
                total.update(part)
    for spec in STAGES:  # and every read declared happened in some collection: none idle
        assert seen[spec.name].reads - set(spec.adds) == set(spec.reads), spec.name
        assert seen[spec.name].sources == declared_names(spec), spec.name


def astuple(seen: Seen) -> tuple[set[str], set[str], set[str]]:
    return seen.reads, seen.adds, seen.sources


def test_a_stage_that_reads_a_field_before_it_is_added_fails_at_once() -> None:
    """What makes an order that the declarations do not hold fail loudly, never read a
    default: an unset field of `Joined` raises."""
    state = Joined()
    try:
        _ = state.holdings
    except AttributeError:
        return
    raise AssertionError("an unset field of Joined read without an error")


# --- docs -------------------------------------------------------------------------------------


def table(stages: tuple[StageSpec, ...]) -> str:
    """The stages table of docs/architecture.md ("Attribution"), from the declarations."""
    rows = ["| Stage | Reads | Adds |", "|---|---|---|"]
    for spec in stages:
        reads = [f"`{s.name}`" for s in spec.sources] + list(spec.reads)
        rows.append(f"| `{spec.name}` | {', '.join(reads) or '—'} | {', '.join(spec.adds)} |")
    return "\n".join(rows) + "\n"


def test_the_architecture_doc_shows_the_declared_stages() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text()
    assert table(STAGES) in doc, "update the stages table in docs/architecture.md:\n" + table(
        STAGES
    )

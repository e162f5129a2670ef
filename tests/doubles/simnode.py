"""A simulated Kubernetes GPU node for the attribution tests, the demo and the benchmarks.

Every part the agent reads is real or speaks the real protocol:

* each container is a real process (tests/doubles/simworker.py) placed, before it runs any
  code, in a kubelet-style cgroup directory (systemd driver, containerd naming) under a test
  prefix of the real cgroup v2 mount and, on hybrid hosts, at the same path in the v1 cpu
  and blkio hierarchies, as the kubelet's cgroup driver makes them
  (tests/doubles/podcgroups.py), so `/proc/<pid>/cgroup` and BPF cgroup ids name its pod and
  the agent reads the pod's throttling and block I/O where it would on a real node;
* a container can be given work the pod signals measure: a CPU limit (the pod's CFS quota),
  a process that keeps a CPU busy, a process reading a file with O_DIRECT over and over, and
  a read bandwidth limit on that file's disk (slow storage);
* the kubelet is tests/doubles/kubelet_server.py, the real PodResources v1 gRPC service on a
  unix socket, answering with the GPUs (UUIDs, or `<uuid>::<n>` time-slicing replicas) each
  container was allocated;
* the Kubernetes API is tests/doubles/kube_apiserver.py (REST + watch), holding a Node and a
  Pod object per pod, as a kubelet reports them (Running, container ids, start times);
* NVML is the fake library (tests/doubles/fakenvml): every GPU a container uses lists its pid as a
  compute process with the given memory and SM utilization. With `manage_devices` (default)
  a GPU's memory used and utilization are kept equal to the sums over its processes.
* or the node's GPUs are AMD's, on the fake AMD SMI library (tests/doubles/fakeamdsmi): give
  SimNode a `FakeAmdSmi` and the kubelet advertises `amd.com/gpu` with the ids AMD's device
  plugin uses (PCI addresses; `amdgpu_xcp_<N>` for the partitions beyond the first of a CPX
  GPU, whose sysfs devices are written under `node.sysfs`), and each container's pid is in its
  processor's process list (tests/doubles/simgpus.py, the one seam between node and fake).
* containers may send real TCP bytes to another pod (over 127.0.0.1; pod IPs in the API
  objects are synthetic 10.244.0.x addresses): an exact one-shot count, or a steady rate.

    with SimNode(fake, tmp_path) as node:
        pods = training_scenario(node)
        node.wait_traffic(10)
        ... run the agent with --kubelet-socket node.kubelet_socket --kubeconfig
            node.kubeconfig --node-name node.node_name ...

`add_pod`/`remove_pod` (a kubelet's deletion: processes killed, NVML and PodResources
forget them, cgroups go, then the API object: MODIFIED terminating, DELETED), `set_usage`
(change a pod's GPU memory/utilization), `start_traffic`/`wait_traffic`/`received` (bytes
the receiver counted itself: the ground truth), `host_process`/`remove_host_process` (a GPU
process in no pod), `batch` (node and fake changes in one state-file write), `close`.

Thread-safe, with one lock order: the node's lock before the fake's. A node method called
from inside `fake.batch()` (FakeNvml's, or the AMD backend's `node.gpus.batch()`) would take
them the other way round and is refused (RuntimeError); use `node.batch()`, which takes both
in order.

Needs root and cgroup v2. Everything (processes, cgroups, servers) goes on `close`, also
when a test fails; workers and their helper processes exit by themselves when their parent
dies (stdin closes).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from tests.doubles.fakeamdsmi.control import FakeAmdSmi
from tests.doubles.fakenvml.control import FakeNvml
from tests.doubles.kube_apiserver import KubeApiServer, owner_reference
from tests.doubles.kube_apiserver import node as node_object
from tests.doubles.kube_apiserver import pod as pod_object
from tests.doubles.kubelet_server import KubeletServer, container, devices
from tests.doubles.kubelet_server import pod as pod_resources
from tests.doubles.netlab import PREFIX, Pods, _rmtree_cgroup
from tests.doubles.podcgroups import (
    CPU_BURNER,
    Cgroup,
    Hierarchies,
    direct_reader,
    set_cpu_limit,
    set_read_limit,
    spawn_in,
    whole_disk,
)
from tests.doubles.simgpus import GpuBackend, Usage, backend_for

WORKER = Path(__file__).with_name("simworker.py")
GPU_RESOURCE = "nvidia.com/gpu"  # NVIDIA's; a node's own is `node.gpus.resource`
DEFAULT_IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
HOST_IP = "10.0.0.11"
CONDITIONS = (
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
)
GIB = 2**30
# Run first by a container's helper processes: exit when the node's end of stdin closes (the
# node closed, or its process died), as the workers do, so no CPU burner outlives a crash.
_HELPER_PRELUDE = (
    "import os, sys, threading\n"
    "threading.Thread(target=lambda: (sys.stdin.buffer.read(), os._exit(0)), daemon=True)"
    ".start()\n"
)

Qos = Literal["guaranteed", "burstable", "besteffort"]


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    gpus: Sequence[int] = ()  # GPU indexes allocated by the kubelet (device ids = GPU UUIDs;
    # on AMD processor indexes, ids = PCI addresses or amdgpu_xcp_<N>)
    shared_replica: int | None = None  # if set, device ids are "<uuid>::<n>" (time-slicing)
    use_gpus: Sequence[int] | None = None  # GPUs its process really uses (default: gpus)
    gpu_memory_bytes: int = 0  # per used GPU, registered with the fake NVML
    sm_util: float = 0  # percent, per used GPU
    mem_util: float | None = None  # percent, per used GPU (default: sm_util / 2)
    traffic_to: str | None = None  # "namespace/pod" of a serving peer pod: send it real TCP bytes
    traffic_bytes: int = 0  # exact bytes to send (once), or with traffic_rate, paced
    traffic_rate: float = 0  # bytes/s; 0 = one-shot exact transfer; with traffic_bytes 0: forever
    image: str = DEFAULT_IMAGE
    # Work for the pod signals (agent/k8s/pod_cgroup_usage.py), each by a helper process in
    # the container beside its GPU process (as a data loader's workers are):
    cpu_limit: float | None = None  # CPUs (resources.limits.cpu); enforced as the pod's
    # CFS quota, their sum, when every container of the pod has one (as the kubelet does)
    burn_cpu: bool = False  # a process keeps a CPU busy (CPU-bound preprocessing)
    read_file: Path | None = None  # a process reads it with O_DIRECT, over and over
    read_bps: int | None = None  # bytes/s the container may read from read_file's disk


@dataclass
class SimContainer:
    name: str
    container_id: str  # 64 hex, as containerd names it
    pid: int
    cgroup: Path  # the container's cgroup directory
    gpus: tuple[int, ...]  # allocated
    device_ids: tuple[str, ...]  # what the kubelet reports
    used_gpus: tuple[int, ...]  # where its process is registered with NVML
    gpu_memory_bytes: int
    sm_util: float
    mem_util: float
    image: str
    worker: _Worker = field(repr=False)
    cgroups: Cgroup = field(repr=False)  # its directory in every hierarchy (cgroup: v2's)
    helpers: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)


@dataclass
class SimPod:
    namespace: str
    name: str
    uid: str
    qos: Qos
    containers: dict[str, SimContainer]
    ip: str  # the API object's podIP (synthetic: traffic really flows over 127.0.0.1)
    port: int | None  # where its first container listens on 127.0.0.1 (serve=True)
    cgroup: Path  # the pod's cgroup directory (v2)
    cgroups: Cgroup  # its directory in every hierarchy
    # What this host could not enforce of the pod's specs (a limit without its controller).
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def address(self) -> tuple[str, int] | None:
        return ("127.0.0.1", self.port) if self.port is not None else None

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.containers.values()]


@dataclass(frozen=True)
class Transfer:
    src: str  # "namespace/pod"
    container: str
    dst: str
    nbytes: int  # 0 with rate > 0: continuous
    rate: float


class _Worker:
    """One simworker process and the thread that reads what it reports."""

    def __init__(self, cgroup: Cgroup, *, serve: bool, log: Path) -> None:
        argv = [sys.executable, "-I", "-S", str(WORKER), *(["--serve"] if serve else [])]
        # In its cgroups before it runs (spawn_in): no byte is sent from elsewhere.
        with log.open("ab") as err:
            self.proc = spawn_in(
                cgroup,
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
            )
        self.log = log
        self.port: int | None = None
        self.done: dict[str, int] = {}
        self.received = 0  # payload bytes read on connections that have ended
        self.errors: dict[str, str] = {}
        self.exited = False
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split(maxsplit=2)
            with self._cond:
                if words[:1] == ["ready"] and len(words) == 2:
                    self.port = int(words[1])
                elif words[:1] == ["recv"] and len(words) == 2:
                    self.received += int(words[1])
                elif words[:1] == ["done"] and len(words) == 3:
                    self.done[words[1]] = int(words[2])
                elif words[:1] == ["error"]:
                    self.errors[words[1] if len(words) > 1 else "-"] = " ".join(words[2:])
                self._cond.notify_all()
        with self._cond:
            self.exited = True
            self._cond.notify_all()

    def wait_ready(self, timeout: float) -> int:
        with self._cond:
            if not self._cond.wait_for(lambda: self.port is not None or self.exited, timeout):
                raise TimeoutError(f"worker {self.pid} not ready after {timeout}s")
            if self.port is None:
                raise RuntimeError(f"worker {self.pid} exited: {self._stderr()}")
            return self.port

    def command(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait_done(self, ident: str, deadline: float) -> None:
        with self._cond:
            while ident not in self.done:
                if ident in self.errors:
                    raise RuntimeError(f"transfer {ident} failed: {self.errors[ident]}")
                if self.exited:
                    raise RuntimeError(f"worker {self.pid} exited mid-transfer: {self._stderr()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"transfer {ident} of worker {self.pid} not done")
                self._cond.wait(left)

    def wait_received(self, minimum: int, deadline: float) -> None:
        with self._cond:
            while self.received < minimum:
                left = deadline - time.monotonic()
                if left <= 0 or self.exited:
                    raise TimeoutError(f"worker {self.pid} read {self.received}, not {minimum}")
                self._cond.wait(left)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.close()

    def _stderr(self) -> str:
        try:
            return self.log.read_text().strip()[-2000:]
        except OSError:
            return ""


def _sweep_stale(hierarchies: Hierarchies, min_age: float = 60.0) -> None:
    """Remove what crashed runs left: SimNode trees with no process left in them (a tree
    that is still in use is recreated by the next mkdir anyway), in the v2 hierarchy, then
    in the v1 ones those whose v2 tree is gone."""
    for top in hierarchies.v2.glob(f"{PREFIX}-sim-*"):
        try:
            events = (top / "cgroup.events").read_text()
            old = time.time() - top.stat().st_mtime > min_age
        except OSError:
            continue
        if old and "populated 0" in events:
            _rmtree_cgroup(top)
    for root in dict.fromkeys(hierarchies.v1.values()):
        for top in root.glob(f"{PREFIX}-sim-*"):
            if not (hierarchies.v2 / top.name).exists() and _v1_unpopulated(top):
                _rmtree_cgroup(top)


def _v1_unpopulated(top: Path) -> bool:
    """No process in the v1 tree `top` (v1 has no cgroup.events to say so)."""
    try:
        return all(
            not Path(d, "cgroup.procs").read_text().strip() for d, _dirs, _files in os.walk(top)
        )
    except OSError:
        return False


def _kill_helpers(c: SimContainer) -> None:
    for proc in c.helpers:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        proc.wait()
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _image_id(image: str) -> str:
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return f"{repo}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


class SimNode:
    """A Kubernetes GPU node on this machine; see the module docstring."""

    def __init__(
        self,
        fake: FakeNvml | FakeAmdSmi,
        workdir: Path,
        node_name: str = "sim-node-1",
        *,
        manage_devices: bool = True,
        ready_timeout: float = 10.0,
        dra_versions: tuple[str, ...] = ("v1",),
        sysfs: Path | None = None,
        real_time: bool = True,
    ) -> None:
        """`dra_versions`: the resource.k8s.io versions its API server serves (the double's).
        On AMD (`fake` a FakeAmdSmi): `sysfs` is where the partitions' devices are written
        (default `workdir/sys`; give the agent `--sysfs node.sysfs`, as `sim_node_args`
        does), and with `real_time` the fake's clock follows real time."""
        if os.geteuid() != 0:
            raise PermissionError("SimNode creates cgroups: it needs root")
        self.fake: Any = fake
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Where the AMD backend writes the partitions' sysfs devices; None on NVIDIA (the
        # agent reads the host's /sys).
        self.sysfs: Path | None = (
            (sysfs or self.workdir / "sys") if isinstance(fake, FakeAmdSmi) else None
        )
        self.gpus: GpuBackend = backend_for(fake, self.sysfs or self.workdir, real_time=real_time)
        self.node_name = node_name
        self.manage_devices = manage_devices
        self.ready_timeout = ready_timeout
        self.pods: dict[str, SimPod] = {}  # "namespace/name" -> pod
        self.transfers: list[Transfer] = []
        # Lock order of the test tooling: this node's lock, then the fake's (FakeNvml._lock,
        # held by fake.batch() and every FakeNvml method; FakeAmdSmi's, held by
        # self.gpus.batch() and its methods), never the other way round; see _locked().
        self._lock = threading.RLock()
        self._owner: int | None = None  # the thread holding self._lock
        self._lab = Pods()
        # Where a kubelet would make the pods' cgroups: v2, and the v1 cpu and blkio
        # hierarchies where they are mounted (hybrid hosts).
        self.hierarchies = Hierarchies.of_host(self._lab.root)
        _sweep_stale(self.hierarchies)
        self._base = self._lab.root / f"{PREFIX}-sim-{self._lab.tag}"
        self._lab.created.append(self._base)
        self._ip_numbers = itertools.count(10)
        self._transfer_ids = itertools.count(1)
        self._pending: list[tuple[_Worker, str, _Worker, int]] = []  # finite, not yet waited
        self._expect: dict[_Worker, int] = {}  # bytes of waited transfers, per receiver
        self._nvml: dict[int, dict[int, Usage]] = {}  # gpu -> pid -> usage (NVML or AMD SMI)
        self._hosts: dict[int, tuple[_Worker, tuple[int, ...], Path]] = {}  # pid -> ...
        self._closed = False
        self.api = KubeApiServer(dra_versions=dra_versions)
        self.kubelet = KubeletServer()
        try:
            self.api.start()
            self.kubelet.start()
            self.kubeconfig = self.api.kubeconfig(self.workdir / "kubeconfig")
            self.api.create(self._node_object())
            self._publish_kubelet()
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """This node's lock, taken in the one lock order of the test tooling: the node's lock
        before the fake's.  Every node method changes the fake while holding the node's lock
        (so that NVML, the kubelet and the API change together), so a thread that calls one
        from inside ``fake.batch()`` takes the two locks the other way round and deadlocks with
        any node call on another thread (a script that held the fake's batch while calling
        ``set_usage`` did, against ``remove_pod``).  That is refused with RuntimeError; group
        node and fake changes with :meth:`batch` instead."""
        me = threading.get_ident()
        if self._owner != me and self.gpus.in_batch():
            raise RuntimeError(
                "SimNode called inside FakeNvml.batch(): the node's lock must be taken before "
                "the fake's; use SimNode.batch() to group node and fake changes"
            )
        with self._lock:
            outer, self._owner = self._owner, me
            try:
                yield
            finally:
                self._owner = outer

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group node calls and direct fake changes into one state-file write, taking the
        locks in their order (the node's, then the fake's ``batch()``)."""
        with self._locked(), self.gpus.batch():
            yield

    @property
    def kubelet_socket(self) -> Path:
        return self.kubelet.socket_path

    def __enter__(self) -> SimNode:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # ---- pods ---------------------------------------------------------------------------

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        containers: Sequence[ContainerSpec],
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        owners: Iterable[Mapping[str, Any]] = (),
        uid: str | None = None,
        serve: bool = True,
        qos: Qos = "burstable",
    ) -> SimPod:
        """Start the pod's containers, then publish it to the kubelet, the API and NVML, then
        start its traffic (every `traffic_to` peer must already exist and serve)."""
        key = f"{namespace}/{name}"
        if not containers:
            raise ValueError("a pod needs at least one container")
        if len({c.name for c in containers}) != len(containers):
            raise ValueError("container names must be unique within a pod")
        with self._locked():
            self._check_new_pod(key, containers)
            uid = uid or str(uuid.uuid4())
            pod_cgroups, _made = self.hierarchies.make(self._pod_levels(uid, qos))
            sim = SimPod(
                namespace, name, uid, qos, {}, self._next_ip(), None, pod_cgroups.v2,
                pod_cgroups,
            )  # fmt: skip
            self.pods[key] = sim
            try:
                self._limit_cpu(sim, containers)
                for i, spec in enumerate(containers):
                    sim.containers[spec.name] = self._start_container(
                        sim, spec, serve=serve and i == 0
                    )
                for i, c in enumerate(sim.containers.values()):
                    port = c.worker.wait_ready(self.ready_timeout)
                    if serve and i == 0:
                        sim.port = port
                for spec in containers:
                    self._start_helpers(sim, sim.containers[spec.name], spec)
                self._register_nvml(sim.containers.values())
                self._publish_kubelet()
                self.api.create(self._pod_object(sim, containers, labels, annotations, owners))
                self._start_pod_traffic(key, containers)
            except BaseException:
                self._teardown(sim)
                raise
            return sim

    def _check_new_pod(self, key: str, containers: Sequence[ContainerSpec]) -> None:
        """Refuse, before anything starts, a pod that exists, a traffic peer that does not
        serve yet, or a GPU the node lacks. Called with the lock held."""
        self._check_open()
        if key in self.pods:
            raise ValueError(f"pod {key} exists")
        for spec in containers:
            if spec.traffic_to is not None:
                peer = self.pods.get(spec.traffic_to)
                if peer is None or peer.port is None:
                    raise ValueError(f"{key}: traffic peer {spec.traffic_to} is not serving")
            for gpu in [*spec.gpus, *(spec.use_gpus or ())]:
                self.gpus.check(gpu)  # IndexError for a GPU the node lacks

    def _limit_cpu(self, sim: SimPod, containers: Sequence[ContainerSpec]) -> None:
        """The pod's CPU limit, before anything runs in it: the sum of its containers' limits
        when every one has a limit (a container without one makes the pod unlimited)."""
        limits = [c.cpu_limit for c in containers]
        if any(limit is None for limit in limits):
            return
        if not set_cpu_limit(sim.cgroups, sum(limit or 0.0 for limit in limits)):
            sim.notes.append("CPU limit not enforced: no cpu controller for the pod's cgroup")

    def _start_container(self, sim: SimPod, spec: ContainerSpec, *, serve: bool) -> SimContainer:
        """One container: a containerd-style scope under the pod's cgroup (in every
        hierarchy) with its worker process in it (listening if `serve`), and what NVML and
        the kubelet will show of it."""
        cid = uuid.uuid4().hex + uuid.uuid4().hex
        levels = [*sim.cgroups.v2.relative_to(self.hierarchies.v2).parts]
        cgroups, _made = self.hierarchies.make([*levels, f"cri-containerd-{cid}.scope"])
        cdir = cgroups.v2
        if spec.read_bps is not None and spec.read_file is not None:
            self._limit_reads(sim, cgroups, spec.read_file, spec.read_bps)
        log = self.workdir / f"{sim.namespace}_{sim.name}_{spec.name}.log"
        worker = _Worker(cgroups, serve=serve, log=log)
        used = tuple(spec.gpus if spec.use_gpus is None else spec.use_gpus)
        return SimContainer(
            name=spec.name,
            container_id=cid,
            pid=worker.pid,
            cgroup=cdir,
            gpus=tuple(spec.gpus),
            device_ids=tuple(self._device_id(g, spec.shared_replica) for g in spec.gpus),
            used_gpus=used,
            gpu_memory_bytes=spec.gpu_memory_bytes,
            sm_util=spec.sm_util,
            mem_util=spec.sm_util / 2 if spec.mem_util is None else spec.mem_util,
            image=spec.image,
            worker=worker,
            cgroups=cgroups,
        )

    def _limit_reads(self, sim: SimPod, cgroups: Cgroup, path: Path, bps: int) -> None:
        disk = whole_disk(path.stat().st_dev)
        if disk is None or not set_read_limit(cgroups, disk, bps):
            sim.notes.append(
                f"read limit not enforced: {path} is on no disk, or the container's cgroup has "
                "no blkio or io controller"
            )

    def _start_helpers(self, sim: SimPod, c: SimContainer, spec: ContainerSpec) -> None:
        """The container's CPU burner and O_DIRECT reader, once its worker is ready."""
        codes = [CPU_BURNER] if spec.burn_cpu else []
        if spec.read_file is not None:
            codes.append(direct_reader(spec.read_file, loop=True))
        for i, code in enumerate(codes):
            log = self.workdir / f"{sim.namespace}_{sim.name}_{spec.name}.helper{i}.log"
            with log.open("ab") as err:
                proc = spawn_in(
                    c.cgroups,
                    [sys.executable, "-I", "-S", "-c", _HELPER_PRELUDE + code],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                )  # fmt: skip
            c.helpers.append(proc)

    def _start_pod_traffic(self, key: str, containers: Sequence[ContainerSpec]) -> None:
        """The containers' traffic, once the pod is published (so its peers can name it)."""
        for spec in containers:
            if spec.traffic_to is not None and (spec.traffic_bytes or spec.traffic_rate):
                self.start_traffic(
                    key, spec.traffic_to, spec.traffic_bytes, spec.traffic_rate,
                    container=spec.name,
                )  # fmt: skip

    def remove_pod(self, namespace: str, name: str) -> None:
        """Delete a pod as a kubelet does: its processes are killed (and leave NVML), the
        kubelet stops listing it, its cgroups go, then the API object (MODIFIED with a
        deletionTimestamp, then DELETED)."""
        with self._locked():
            self._check_open()
            sim = self.pods.get(f"{namespace}/{name}")
            if sim is None:
                raise KeyError(f"no pod {namespace}/{name}")
            self._teardown(sim)

    def _teardown(self, sim: SimPod) -> None:
        for c in sim.containers.values():
            _kill_helpers(c)
            c.worker.kill()
        self._pending = [p for p in self._pending if p[0].proc.returncode is None]
        self._unregister_nvml(c.pid for c in sim.containers.values())
        self.pods.pop(sim.key, None)
        self._publish_kubelet()
        self.hierarchies.remove(sim.cgroup.relative_to(self.hierarchies.v2))
        self.api.delete_pod(sim.namespace, sim.name, graceful=True)

    def set_usage(
        self,
        namespace: str,
        name: str,
        container: str | None = None,
        *,
        sm_util: float | None = None,
        mem_util: float | None = None,
        gpu_memory_bytes: int | None = None,
    ) -> None:
        """Change what a pod's containers (or one of them) do on their GPUs, from now on."""
        with self._locked():
            self._check_open()
            sim = self.pods[f"{namespace}/{name}"]
            chosen = [sim.containers[container]] if container else list(sim.containers.values())
            for c in chosen:
                if sm_util is not None:
                    c.sm_util = sm_util
                    c.mem_util = sm_util / 2 if mem_util is None else mem_util
                elif mem_util is not None:
                    c.mem_util = mem_util
                if gpu_memory_bytes is not None:
                    c.gpu_memory_bytes = gpu_memory_bytes
            self._register_nvml(chosen)

    # ---- traffic ------------------------------------------------------------------------

    def start_traffic(
        self,
        src: str,
        dst: str,
        nbytes: int = 0,
        rate: float = 0,
        *,
        container: str | None = None,
    ) -> Transfer:
        """Send from pod `src` ("namespace/pod"; its first container unless named) to pod
        `dst`'s port: exactly `nbytes` (at once, or paced at `rate` bytes/s), or, with
        nbytes 0 and a rate, steadily until the pod goes. Finite ones are `wait_traffic`ed."""
        if nbytes <= 0 and rate <= 0:
            raise ValueError("give a byte count, a rate, or both")
        with self._locked():
            self._check_open()
            sender = self.pods[src]
            peer = self.pods[dst]
            if peer.port is None:
                raise ValueError(f"{dst} does not serve")
            c = (
                sender.containers[container]
                if container
                else next(iter(sender.containers.values()))
            )
            ident = f"t{next(self._transfer_ids)}"
            c.worker.command(f"send {ident} 127.0.0.1 {peer.port} {max(nbytes, 0)} {rate}")
            if nbytes > 0:
                receiver = next(iter(peer.containers.values())).worker
                self._pending.append((c.worker, ident, receiver, nbytes))
            transfer = Transfer(src, c.name, dst, max(nbytes, 0), rate)
            self.transfers.append(transfer)
            return transfer

    def wait_traffic(self, timeout: float = 30.0) -> None:
        """Block until every finite transfer was sent and read by its peer."""
        deadline = time.monotonic() + timeout
        with self._locked():
            pending = list(self._pending)
        for sender, ident, receiver, nbytes in pending:
            sender.wait_done(ident, deadline)
            with self._locked():
                self._expect[receiver] = self._expect.get(receiver, 0) + nbytes
                with contextlib.suppress(ValueError):
                    self._pending.remove((sender, ident, receiver, nbytes))
        for receiver, expected in list(self._expect.items()):
            if receiver.proc.returncode is None:
                receiver.wait_received(expected, deadline)

    def received(self, pod: str) -> int:
        """Payload bytes pod ("namespace/name") has read on connections that have ended."""
        with self._locked():
            return next(iter(self.pods[pod].containers.values())).worker.received

    # ---- processes outside pods ---------------------------------------------------------

    def host_process(
        self, gpu: int | Sequence[int], gpu_memory_bytes: int, sm_util: float = 0
    ) -> int:
        """A real process in no pod (a systemd service's cgroup), registered as a compute
        process on `gpu` (one index or several). Returns its pid."""
        gpus = (gpu,) if isinstance(gpu, int) else tuple(gpu)
        with self._locked():
            self._check_open()
            n = len(self._hosts) + 1
            cdir = self._base / "system.slice" / f"sim-host-{n}-{uuid.uuid4().hex[:6]}.service"
            cdir.mkdir(parents=True)
            worker = _Worker(Cgroup(cdir, {}), serve=False, log=self.workdir / f"host-{n}.log")
            try:
                worker.wait_ready(self.ready_timeout)
                usage = (gpu_memory_bytes, sm_util, sm_util / 2)
                self._set_nvml({(g, worker.pid): usage for g in gpus})
            except BaseException:
                worker.kill()
                _rmtree_cgroup(cdir)
                raise
            self._hosts[worker.pid] = (worker, gpus, cdir)
            return worker.pid

    def remove_host_process(self, pid: int) -> None:
        with self._locked():
            worker, _gpus, cdir = self._hosts.pop(pid)
            worker.kill()
            self._unregister_nvml([pid])
            _rmtree_cgroup(cdir)

    # ---- the end ------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process, leave NVML as found, remove the cgroups, stop the servers."""
        with self._locked():
            if self._closed:
                return
            self._closed = True
            atexit.unregister(self.close)
            containers = [c for p in self.pods.values() for c in p.containers.values()]
            for c in containers:
                with contextlib.suppress(Exception):
                    _kill_helpers(c)
            workers = [c.worker for c in containers]
            workers += [w for w, _g, _d in self._hosts.values()]
            for w in workers:
                with contextlib.suppress(OSError):
                    if w.proc.poll() is None:
                        w.proc.send_signal(signal.SIGKILL)
            for w in workers:
                with contextlib.suppress(Exception):
                    w.kill()
            with contextlib.suppress(Exception):
                self._unregister_nvml(list(self._all_pids()))
            self.pods.clear()
            self._hosts.clear()
            self._pending.clear()
            with contextlib.suppress(Exception):
                self._lab.close()  # removes self._base, children first
            with contextlib.suppress(Exception):
                self.hierarchies.remove(self._base.name)  # and its v1 twins
            with contextlib.suppress(Exception):
                self.api.stop()
            with contextlib.suppress(Exception):
                self.kubelet.__exit__(None, None, None)
            with contextlib.suppress(Exception):
                self.gpus.close()

    # ---- internals ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("SimNode is closed")

    def _all_pids(self) -> Iterable[int]:
        for procs in self._nvml.values():
            yield from procs

    def _pod_levels(self, uid: str, qos: Qos) -> list[str]:
        """The pod's cgroup, as levels below the hierarchies' roots."""
        qos_part = "" if qos == "guaranteed" else f"-{qos}"
        return [
            self._base.name,
            "kubepods.slice",
            *([f"kubepods{qos_part}.slice"] if qos_part else []),
            f"kubepods{qos_part}-pod{uid.replace('-', '_')}.slice",
        ]

    def _next_ip(self) -> str:
        n = next(self._ip_numbers)
        return f"10.244.{n // 250}.{n % 250 + 2}"

    def _device_id(self, gpu: int, replica: int | None) -> str:
        return self.gpus.device_id(gpu, replica)

    def _numa(self, gpu: int) -> int:
        return self.gpus.numa(gpu)

    def _register_nvml(self, containers: Iterable[SimContainer]) -> None:
        changes: dict[tuple[int, int], tuple[int, float, float] | None] = {}
        for c in containers:
            for gpu in c.used_gpus:
                changes[(gpu, c.pid)] = (c.gpu_memory_bytes, c.sm_util, c.mem_util)
        self._set_nvml(changes)

    def _unregister_nvml(self, pids: Iterable[int]) -> None:
        gone = set(pids)
        self._set_nvml(
            {(g, p): None for g, procs in self._nvml.items() for p in procs if p in gone}
        )

    def _set_nvml(self, changes: Mapping[tuple[int, int], Usage | None]) -> None:
        """Apply process changes to the fake, then (manage_devices) each touched GPU's sums."""
        if not changes:
            return
        self.gpus.apply(changes, self._nvml, self.manage_devices)

    def _publish_kubelet(self) -> None:
        """The kubelet's answers: one device entry per resource and NUMA node, as it groups."""
        entries = []
        for sim in self.pods.values():
            if len(sim.containers) == 0:
                continue
            conts = []
            for c in sim.containers.values():
                by_numa: dict[int, list[str]] = {}
                for gpu, dev in zip(c.gpus, c.device_ids, strict=True):
                    by_numa.setdefault(self._numa(gpu), []).append(dev)
                groups = [devices(self.gpus.resource, *ids, numa=[n]) for n, ids in by_numa.items()]
                conts.append(container(c.name, *groups))
            entries.append(pod_resources(sim.namespace, sim.name, *conts))
        self.kubelet.set_pods(*entries)
        # Allocatable: every GPU's id (UUID, or AMD's plugin id), and the replicas pods were
        # given of shared GPUs.
        allocatable: dict[int, list[str]] = {}
        shared = sorted(
            {d for s in self.pods.values() for c in s.containers.values() for d in c.device_ids}
        )
        resource = self.gpus.resource
        for gpu in range(self.gpus.count()):
            base = self.gpus.device_id(gpu, None)
            ids = [d for d in shared if d.startswith(f"{base}::")] or [base]
            allocatable.setdefault(self._numa(gpu), []).extend(ids)
        self.kubelet.set_allocatable(
            *(devices(resource, *ids, numa=[n]) for n, ids in sorted(allocatable.items()))
        )

    def _node_object(self) -> dict[str, Any]:
        count = str(self.gpus.count())
        obj = node_object(
            self.node_name,
            labels={
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "gpu-8x",
                **self.gpus.node_labels(),
            },
        )
        obj["spec"]["podCIDR"] = "10.244.0.0/16"
        capacity = {
            "cpu": "224", "memory": "2113407536Ki", "pods": "110", self.gpus.resource: count,
        }  # fmt: skip
        obj["status"].update(
            capacity=capacity,
            allocatable=dict(capacity),
            addresses=[
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": self.node_name},
            ],
            nodeInfo={
                "architecture": "amd64",
                "bootID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.node_name}.boot")),
                "containerRuntimeVersion": "containerd://1.7.27",
                "kernelVersion": os.uname().release,
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.33.0",
                "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, self.node_name).hex,
                "operatingSystem": "linux",
                "osImage": "Ubuntu 22.04.5 LTS",
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.node_name}.system")),
            },
        )
        return obj

    def _pod_object(
        self,
        sim: SimPod,
        specs: Sequence[ContainerSpec],
        labels: Mapping[str, str] | None,
        annotations: Mapping[str, str] | None,
        owners: Iterable[Mapping[str, Any]],
    ) -> dict[str, Any]:
        spec_containers = []
        for s in specs:
            entry: dict[str, Any] = {"name": s.name, "image": s.image}
            limits: dict[str, str] = {}
            requests: dict[str, str] = {}
            if s.gpus:
                resource = self.gpus.resource
                limits[resource] = requests[resource] = str(len(s.gpus))
            if s.cpu_limit is not None:
                limits["cpu"] = f"{round(s.cpu_limit * 1000)}m"
            if limits:
                entry["resources"] = {"limits": limits, "requests": requests}
            if sim.port is not None and s is specs[0]:
                entry["ports"] = [{"containerPort": sim.port, "protocol": "TCP"}]
            spec_containers.append(entry)
        obj = pod_object(
            sim.namespace, sim.name, self.node_name,
            labels=labels, annotations=annotations, owner_references=[dict(o) for o in owners],
            uid=sim.uid, containers=spec_containers,
        )  # fmt: skip
        now = _iso(time.time())
        obj["status"] = {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now} for t in CONDITIONS
            ],
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": sim.ip,
            "podIPs": [{"ip": sim.ip}],
            "startTime": now,
            "qosClass": sim.qos.capitalize().replace("effort", "Effort"),
            "containerStatuses": [
                {
                    "name": c.name,
                    "state": {"running": {"startedAt": now}},
                    "lastState": {},
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": c.image,
                    "imageID": _image_id(c.image),
                    "containerID": f"containerd://{c.container_id}",
                }
                for c in sim.containers.values()
            ],
        }
        return obj


# ---- the canonical scenario of issue #4 ---------------------------------------------------

WORKER_POD = "ml-team/llama-ft-worker-0"
EVAL_POD = "eval/eval-nightly-7xk2p"
NB_ALICE_POD = "research/nb-alice-6c9f8d7b5c-x2m4q"
NB_BOB_POD = "research/nb-bob-59d4b8f6d-q8wzt"
# Exact one-shot payloads (odd sizes, so an off-by-a-chunk attribution shows).
TRAINING_TRAFFIC: dict[tuple[str, str], int] = {
    (EVAL_POD, NB_ALICE_POD): 524_288 + 7,  # evaluation report to a notebook
    (NB_BOB_POD, EVAL_POD): 65_536 + 1,  # a query
    (WORKER_POD, EVAL_POD): 6 * 2**20 + 123,  # a checkpoint shard to evaluate
}


def _deployment_pod(deployment: str, rs_hash: str) -> dict[str, Any]:
    return {
        "labels": {"app": deployment, "pod-template-hash": rs_hash},
        "owners": [owner_reference("ReplicaSet", f"{deployment}-{rs_hash}", api_version="apps/v1")],
    }


def pytorchjob_pod(job: str, index: int, replica_type: str = "worker") -> dict[str, Any]:
    """`labels` and `owners` of a PyTorchJob's pod as the Kubeflow training operator writes
    them (add_pod's keyword arguments): its replica is `<replica_type>-<index>`."""
    return {
        "labels": {
            "training.kubeflow.org/job-name": job,
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": replica_type,
            "training.kubeflow.org/replica-index": str(index),
        },
        "owners": [owner_reference("PyTorchJob", job, api_version="kubeflow.org/v1")],
    }


def _add_nb_alice(node: SimNode) -> SimPod:
    """GPU 6, time-sliced replica 0: a notebook computing a little."""
    ns, name = NB_ALICE_POD.split("/")
    return node.add_pod(
        ns, name,
        containers=[ContainerSpec(
            "notebook", gpus=[6], shared_replica=0, gpu_memory_bytes=9 * GIB, sm_util=12,
            image="quay.io/jupyter/pytorch-notebook:cuda12-python-3.11",
        )],
        **_deployment_pod("nb-alice", "6c9f8d7b5c"),
    )  # fmt: skip


def _add_eval(node: SimNode) -> SimPod:
    """GPUs 4-5: Job eval-nightly's pod, with the labels and owner a Job controller sets;
    sends to nb-alice."""
    job_uid = str(uuid.uuid4())
    ns, name = EVAL_POD.split("/")
    return node.add_pod(
        ns, name,
        containers=[ContainerSpec(
            "evaluator", gpus=[4, 5], gpu_memory_bytes=38 * GIB, sm_util=61,
            traffic_to=NB_ALICE_POD, traffic_bytes=TRAINING_TRAFFIC[(EVAL_POD, NB_ALICE_POD)],
        )],
        labels={
            "batch.kubernetes.io/job-name": "eval-nightly", "job-name": "eval-nightly",
            "batch.kubernetes.io/controller-uid": job_uid, "controller-uid": job_uid,
        },
        owners=[owner_reference("Job", "eval-nightly", uid=job_uid, api_version="batch/v1")],
    )  # fmt: skip


def _add_nb_bob(node: SimNode) -> SimPod:
    """GPU 6, time-sliced replica 1: a notebook holding memory idle; sends to eval."""
    ns, name = NB_BOB_POD.split("/")
    return node.add_pod(
        ns, name,
        containers=[ContainerSpec(
            "notebook", gpus=[6], shared_replica=1, gpu_memory_bytes=6 * GIB, sm_util=0,
            traffic_to=EVAL_POD, traffic_bytes=TRAINING_TRAFFIC[(NB_BOB_POD, EVAL_POD)],
            image="quay.io/jupyter/pytorch-notebook:cuda12-python-3.11",
        )],
        **_deployment_pod("nb-bob", "59d4b8f6d"),
    )  # fmt: skip


def _add_llama_worker(node: SimNode) -> SimPod:
    """GPUs 0-3: PyTorchJob llama-ft's worker 0, busy, with the Kubeflow labels; sends to
    eval."""
    ns, name = WORKER_POD.split("/")
    return node.add_pod(
        ns, name,
        containers=[ContainerSpec(
            "pytorch", gpus=[0, 1, 2, 3], gpu_memory_bytes=71 * GIB, sm_util=93,
            traffic_to=EVAL_POD, traffic_bytes=TRAINING_TRAFFIC[(WORKER_POD, EVAL_POD)],
        )],
        **pytorchjob_pod("llama-ft", 0),
    )  # fmt: skip


def training_scenario(node: SimNode) -> dict[str, SimPod]:
    """Issue #4's node (needs 8 GPUs, e.g. dgx-h100), keyed "worker", "eval", "nb-alice",
    "nb-bob":

    - GPUs 0-3: ml-team/llama-ft-worker-0, PyTorchJob llama-ft's worker 0, busy;
    - GPUs 4-5: eval/eval-nightly-7xk2p, Job eval-nightly;
    - GPU 6: two notebooks of Deployments nb-alice and nb-bob (research), time-sliced
      (device ids <uuid>::0 and <uuid>::1); alice computes a little, bob holds memory idle;
    - GPU 7: free.
    Traffic: the TRAINING_TRAFFIC one-shot payloads (wait with `node.wait_traffic`).
    """
    if node.gpus.count() < 8:
        raise ValueError("the training scenario needs an 8-GPU node (profile dgx-h100)")
    pods: dict[str, SimPod] = {}
    # in this order: each pod's traffic peer must already serve
    pods["nb-alice"] = _add_nb_alice(node)
    pods["eval"] = _add_eval(node)
    pods["nb-bob"] = _add_nb_bob(node)
    pods["worker"] = _add_llama_worker(node)
    return pods


# ---- a synchronous data-parallel job with one starved rank (issue #25) --------------------

# What each rank's GPUs read: in NCCL's collectives, which spin on the GPU while they wait,
# the healthy ranks read busy most of the time; the starved rank idles while its loader
# waits, then computes and joins the all-reduce the others already wait in. On NVIDIA each
# 2-second step is a pattern: idle, then busy (the average is the percentage).
RANK_BUSY = 92.0  # percent: compute, then spinning in the all-reduce
STARVED_BUSY = 55.0  # percent: compute and a short all-reduce; idle while its loader waits
STEP_S = 2.0
RANK_SM_ACTIVE = 0.40  # the SMs' share of time each rank spends on the same compute
STARVED_CPUS = 0.1  # the starved rank's CPU limit (starve="cpu"), its loader wanting a CPU
STARVED_READ_BPS = 1_000_000  # its storage's rate (starve="input_io")
RING_RATE = 1e6  # bytes/s each rank sends the next in the ring all-reduce
Starve = Literal["input_io", "cpu"]


def straggler_job(
    node: SimNode,
    *,
    namespace: str = "ml-team",
    job: str = "llama-ft",
    gpus: Sequence[int] = (0, 1, 2, 3),
    straggler: int = 3,
    starve: Starve = "input_io",
    read_file: Path | None = None,
) -> dict[str, SimPod]:
    """A synchronous data-parallel PyTorchJob `job` with one rank (worker-<i>, replica index i,
    one GPU each, in `gpus` order) per GPU, whose rank `straggler` is starved by its data
    loader, keyed "worker-<i>":

    - starve="input_io": its loader reads `read_file` (on a disk: see
      podcgroups.block_device_file) with O_DIRECT at the STARVED_READ_BPS its disk's read
      limit allows: its tasks stall on I/O;
    - starve="cpu": its loader burns CPU under a STARVED_CPUS limit: its pod is throttled.

    Its GPU reads STARVED_BUSY % busy, the others RANK_BUSY % (spinning in the all-reduce
    while they wait for it); on NVIDIA each STEP_S step is idle, then busy (so the agent
    charges the starved rank's idle GPU-seconds to its cause), and GPM's SM activity is
    RANK_SM_ACTIVE on every rank (the same compute each step). Each rank sends the next one
    RING_RATE bytes/s (the ring all-reduce)."""
    if not 0 <= straggler < len(gpus):
        raise ValueError(f"rank {straggler} is not one of the job's {len(gpus)} ranks")
    if starve == "input_io" and read_file is None:
        raise ValueError("starve='input_io' needs a read_file on a disk")
    pods: dict[str, SimPod] = {}
    for rank, gpu in enumerate(gpus):
        starved = rank == straggler
        spec = ContainerSpec(
            "pytorch", gpus=[gpu], gpu_memory_bytes=40 * GIB,
            sm_util=STARVED_BUSY if starved else RANK_BUSY,
        )  # fmt: skip
        if starved and starve == "input_io":
            spec = replace(spec, read_file=read_file, read_bps=STARVED_READ_BPS)
        elif starved:
            spec = replace(spec, cpu_limit=STARVED_CPUS, burn_cpu=True)
        pods[f"worker-{rank}"] = node.add_pod(
            namespace, f"{job}-worker-{rank}", containers=[spec], **pytorchjob_pod(job, rank)
        )
    if node.gpus.vendor == "nvidia":
        with node.batch():  # after add_pod, which sets each GPU's utilization to the average
            for rank, gpu in enumerate(gpus):
                busy = STARVED_BUSY if rank == straggler else RANK_BUSY
                idle_s = STEP_S * (1 - busy / 100)
                node.fake.set_utilization_pattern(gpu, [(idle_s, 0, 0), (STEP_S - idle_s, 100, 50)])
                node.fake.set_gpm_activity(gpu, sm_active=RANK_SM_ACTIVE * 100 / busy)
    ranks = [f"{namespace}/{job}-worker-{rank}" for rank in range(len(gpus))]
    for src, dst in zip(ranks, [*ranks[1:], ranks[0]], strict=True):
        node.start_traffic(src, dst, rate=RING_RATE)
    return pods

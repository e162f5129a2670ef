"""A stand-in kubelet: the real PodResources v1 gRPC service on a unix socket, scripted.

Tests drive the real client against it over a real socket, so the wire format, the unix
transport, deadlines and reconnection are exercised as they are against a kubelet. The
scripted parts mirror what kubelets really answer: a missing pod is a plain error (code
UNKNOWN, "pod <name> in namespace <ns> not found"), `Get` behind a disabled feature gate is
"PodResources API Get method disabled", and a kubelet that predates `Get` does not know the
method at all (UNIMPLEMENTED).

    with KubeletServer() as kubelet:
        kubelet.set_pods(pod("ns", "p", container("main", devices("nvidia.com/gpu", "GPU-1"))))
        PodResourcesClient(kubelet.socket_path).list()
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from collections.abc import Iterable, Sequence
from concurrent import futures
from pathlib import Path
from types import TracebackType
from typing import Literal

import grpc

from gpuscope.agent.k8s.podresources.v1 import api_pb2, api_pb2_grpc

GetMode = Literal["served", "unimplemented", "disabled"]


def devices(
    resource_name: str, *device_ids: str, numa: Sequence[int] = ()
) -> api_pb2.ContainerDevices:
    """One device-plugin resource entry, as the kubelet groups ids under their resource."""
    entry = api_pb2.ContainerDevices(resource_name=resource_name, device_ids=device_ids)
    if numa:
        entry.topology.nodes.extend(api_pb2.NUMANode(ID=node) for node in numa)
    return entry


def claim(
    claim_name: str,
    *cdi_names: str,
    driver: str = "",
    pool: str = "",
    device: str = "",
    namespace: str = "default",
) -> api_pb2.DynamicResource:
    """A DRA claim with one claimed device (1.31+ shape: driver/pool/device named)."""
    return api_pb2.DynamicResource(
        claim_name=claim_name,
        claim_namespace=namespace,
        claim_resources=[
            api_pb2.ClaimResource(
                cdi_devices=[api_pb2.CDIDevice(name=name) for name in cdi_names],
                driver_name=driver,
                pool_name=pool,
                device_name=device,
            )
        ],
    )


NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
NVIDIA_CDI_VENDOR = "k8s.gpu.nvidia.com"  # the CDI vendor of NVIDIA's DRA driver (cdi.go)


def nvidia_claim(
    claim_name: str,
    *devices: str,
    pool: str,
    namespace: str = "default",
    claim_uid: str = "",
) -> api_pb2.DynamicResource:
    """A claim prepared by NVIDIA's DRA driver, as the kubelet reports it (DynamicResources):
    one ClaimResource per device (`gpu-0`, `gpu-6-mig-19-0-1`), named by driver, pool and
    device, with the driver's CDI names: the standard `k8s.gpu.nvidia.com/device=<device>`
    and, when `claim_uid` is given, the claim's own `k8s.gpu.nvidia.com/claim=<uid>-<device>`
    (a claim with config edits). Neither carries a GPU UUID."""
    resources = []
    for device in devices:
        cdi = [f"{NVIDIA_CDI_VENDOR}/device={device}"]
        if claim_uid:
            cdi.append(f"{NVIDIA_CDI_VENDOR}/claim={claim_uid}-{device}")
        resources.append(
            api_pb2.ClaimResource(
                cdi_devices=[api_pb2.CDIDevice(name=name) for name in cdi],
                driver_name=NVIDIA_DRA_DRIVER,
                pool_name=pool,
                device_name=device,
            )
        )
    return api_pb2.DynamicResource(
        claim_name=claim_name, claim_namespace=namespace, claim_resources=resources
    )


def container(
    name: str,
    *device_entries: api_pb2.ContainerDevices,
    claims: Iterable[api_pb2.DynamicResource] = (),
    cpu_ids: Iterable[int] = (),
) -> api_pb2.ContainerResources:
    return api_pb2.ContainerResources(
        name=name, devices=device_entries, dynamic_resources=claims, cpu_ids=cpu_ids
    )


def pod(namespace: str, name: str, *containers: api_pb2.ContainerResources) -> api_pb2.PodResources:
    return api_pb2.PodResources(namespace=namespace, name=name, containers=containers)


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    """The service itself; every answer is read from the owning server's current script."""

    def __init__(self, owner: KubeletServer) -> None:
        self._owner = owner

    def List(  # noqa: N802 - gRPC method names are the proto's
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self._owner._enter("List", context)
        with self._owner._lock:
            pods = list(self._owner._pods)
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)

    def GetAllocatableResources(  # noqa: N802
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        self._owner._enter("GetAllocatableResources", context)
        with self._owner._lock:
            allocatable = list(self._owner._allocatable)
        return api_pb2.AllocatableResourcesResponse(devices=allocatable)

    def Get(  # noqa: N802
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        self._owner._enter("Get", context)
        with self._owner._lock:
            mode = self._owner.get_mode
            found = [
                p
                for p in self._owner._pods
                if p.namespace == request.pod_namespace and p.name == request.pod_name
            ]
        if mode == "unimplemented":  # what grpc-go answers for a method it was not built with
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "unknown method Get for service v1.PodResourcesLister",
            )
        if mode == "disabled":
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        if not found:
            context.abort(
                grpc.StatusCode.UNKNOWN,
                f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
            )
        return api_pb2.GetPodResourcesResponse(pod_resources=found[0])


class KubeletServer:
    """A PodResources server on `<directory>/kubelet.sock`, started on `__enter__`.

    The script can change at any time: `set_pods`, `set_allocatable`, `get_mode`, `delay`
    (seconds every call waits before answering, to trip client deadlines) and `fail`
    (a status every call aborts with). `stop` and `start` simulate a kubelet restart;
    `stop(stale_socket=True)` leaves a socket file nobody listens on, as a crashed kubelet
    does. The default directory is a fresh short one under the system temp dir, because a
    unix socket path must fit in 108 bytes and pytest's tmp_path often does not.
    """

    def __init__(self, directory: Path | None = None, *, get_mode: GetMode = "served") -> None:
        self._own_directory = directory is None
        self.directory = (
            Path(tempfile.mkdtemp(prefix="kubelet-")) if directory is None else directory
        )
        self.socket_path = self.directory / "kubelet.sock"
        self.get_mode: GetMode = get_mode
        self.delay = 0.0
        self.fail: tuple[grpc.StatusCode, str] | None = None
        self.calls: list[str] = []
        self._lock = threading.Lock()
        self._pods: list[api_pb2.PodResources] = []
        self._allocatable: list[api_pb2.ContainerDevices] = []
        self._server: grpc.Server | None = None
        self._stopping = threading.Event()

    def set_pods(self, *pods: api_pb2.PodResources) -> None:
        with self._lock:
            self._pods = list(pods)

    def set_allocatable(self, *entries: api_pb2.ContainerDevices) -> None:
        with self._lock:
            self._allocatable = list(entries)

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        if self._server is not None:
            return
        self.socket_path.unlink(missing_ok=True)
        self._stopping.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), server)
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise RuntimeError(f"cannot bind {self.socket_path}")
        server.start()
        self._server = server

    def stop(self, *, stale_socket: bool = False) -> None:
        server, self._server = self._server, None
        self._stopping.set()  # cut short calls sleeping in `delay`
        if server is not None:
            server.stop(grace=None).wait()
        self.socket_path.unlink(missing_ok=True)
        if stale_socket:
            with socket.socket(socket.AF_UNIX) as dead:
                dead.bind(str(self.socket_path))  # bound, never listening: connection refused

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> KubeletServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _enter(self, method: str, context: grpc.ServicerContext) -> None:
        """Record the call, then apply the scripted delay and failure."""
        with self._lock:
            self.calls.append(method)
            delay, fail = self.delay, self.fail
        if delay > 0:
            self._stopping.wait(delay)
        if fail is not None:
            context.abort(*fail)

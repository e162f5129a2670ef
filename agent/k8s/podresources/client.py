"""A client for the kubelet's PodResources API: which devices each container was given.

The kubelet serves this gRPC API on a unix socket (by default
/var/lib/kubelet/pod-resources/kubelet.sock), and it is the only place that knows which GPU
the device plugin, or a DRA driver, handed to which container. Three things shape the client:

- The kubelet restarts (upgrades, config changes) and replaces the socket when it does. gRPC
  would reconnect on its own, but only after a backoff that grows to two minutes, failing
  every call meanwhile; so the channel is created lazily and dropped after a transport
  failure, and the next call dials afresh.
- Failures end up in operators' logs. Every failure becomes one `PodResourcesUnavailable`
  whose message is a single line naming the socket, never a gRPC traceback.
- `Get` is newer than `List` (feature gate KubeletPodResourcesGet, alpha in 1.27) and older
  kubelets either lack it (UNIMPLEMENTED) or refuse it ("Get method disabled"); both raise
  `PodResourcesGetUnsupported`, so a caller can fall back to `list` once and remember.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

# gRPC's core logs to stderr from INFO up, in its own format (a line on every kubelet restart,
# for one). The agent reports failures itself, once per change, so it keeps gRPC's errors only;
# someone debugging gRPC can still set GRPC_VERBOSITY. gRPC reads the variable when it is first
# imported, so this must come before the import.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc

from gpuscope.agent.k8s.podresources.records import ContainerDevices, Device, PodDevices
from gpuscope.agent.k8s.podresources.v1 import api_pb2, api_pb2_grpc
from gpuscope.agent.runtime.sources import SourceUnavailable

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")

# The largest answer this client accepts unless told otherwise: 16 MiB, as the kubelet's own
# clients. The agent asks for less (agent/k8s/kubelet_source.py MAX_ANSWER_BYTES, 4 MiB): a
# real List is tens of KB, and parsing costs about ten times an answer's size in memory.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # gRPC shares subchannels between channels to the same target, so a fresh channel would
    # inherit the old one's reconnect backoff; a channel of its own starts without one.
    ("grpc.use_local_subchannel_pool", 1),
)
# Codes after which the connection is suspect: dial again on the next call.
_REDIAL = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# gRPC reports a failed connect(2) as UNAVAILABLE, or, depending on the channel's state at the
# time, as FAILED_PRECONDITION; its details always carry this.
_CONNECT_FAILED = "connect failed"
# "...connect failed: addr: unix:<path> error: <strerror>": the last "error: " is connect(2)'s.
_OS_ERROR = re.compile(r".*\berror: (.+?)\s*$")
# gRPC's own refusal of a big answer; the kubelet's rate limit is "rejected by rate limit".
_TOO_LARGE = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")


class PodResourcesUnavailable(SourceUnavailable):
    """The kubelet's PodResources API could not answer; the message is one line."""


class PodResourcesGetUnsupported(PodResourcesUnavailable):
    """This kubelet has no `Get` (too old, or KubeletPodResourcesGet is off): use `list`."""


class PodResourcesClient:
    """Reads the PodResources v1 API over a unix socket.

    Calls are blocking, each bounded by `timeout` seconds. One client may be shared between
    threads. `close` releases the connection; a later call opens a new one.
    """

    def __init__(
        self,
        socket_path: Path = DEFAULT_SOCKET,
        timeout: float = 5.0,
        *,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self._socket_path = socket_path
        self._timeout = timeout
        self._options = tuple(
            (key, max_message_bytes if key == "grpc.max_receive_message_length" else value)
            for key, value in _OPTIONS
        )
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    @property
    def socket_path(self) -> Path:
        return self._socket_path

    def list(self) -> tuple[PodDevices, ...]:
        """Every active pod the kubelet knows, with the devices of each of its containers."""
        stub = self._connect()
        try:
            response: api_pb2.ListPodResourcesResponse = stub.List(
                api_pb2.ListPodResourcesRequest(), timeout=self._timeout
            )
        except grpc.RpcError as exc:
            raise self._failure(exc, "List", stub) from None
        return tuple(_pod(pod) for pod in response.pod_resources)

    def allocatable(self) -> tuple[Device, ...]:
        """Every device-plugin device the kubelet can hand out, allocated or not.

        The answer says nothing about DRA devices: the kubelet does not track those here.
        """
        stub = self._connect()
        try:
            response: api_pb2.AllocatableResourcesResponse = stub.GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self._timeout
            )
        except grpc.RpcError as exc:
            raise self._failure(exc, "GetAllocatableResources", stub) from None
        return _devices(response.devices)

    def get(self, namespace: str, name: str) -> PodDevices | None:
        """One pod's devices, or None when the kubelet has no such pod.

        Raises `PodResourcesGetUnsupported` when the kubelet cannot answer `Get` at all.
        """
        stub = self._connect()
        request = api_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        try:
            response: api_pb2.GetPodResourcesResponse = stub.Get(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            details = exc.details() or ""
            if exc.code() == grpc.StatusCode.NOT_FOUND or (
                # Kubelets answer a missing pod with a plain error: code UNKNOWN and
                # "pod <name> in namespace <namespace> not found".
                exc.code() == grpc.StatusCode.UNKNOWN
                and details == f"pod {name} in namespace {namespace} not found"
            ):
                return None
            raise self._failure(exc, "Get", stub) from None
        if not response.HasField("pod_resources"):
            return None
        return _pod(response.pod_resources)

    def close(self) -> None:
        with self._lock:
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _connect(self) -> api_pb2_grpc.PodResourcesListerStub:
        """The stub of the current channel, dialling one if there is none.

        Creating a channel does not connect: the first call does, so a missing socket shows
        up there, as an RpcError, like every other failure.
        """
        with self._lock:
            if self._stub is None:
                # `unix:<path>` takes relative and absolute paths alike.
                self._channel = grpc.insecure_channel(
                    f"unix:{self._socket_path}", options=self._options
                )
                self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
            return self._stub

    def _forget(self, stub: api_pb2_grpc.PodResourcesListerStub) -> None:
        """Make the next call dial afresh, unless another thread already did.

        The channel is dropped, not closed: another thread may be in a call on it, which
        closing would cancel. It is released when its last call ends.
        """
        with self._lock:
            if self._stub is stub:
                self._channel, self._stub = None, None

    def _failure(
        self, exc: grpc.RpcError, method: str, stub: api_pb2_grpc.PodResourcesListerStub
    ) -> PodResourcesUnavailable:
        code = exc.code()
        details = _one_line(exc.details() or "")
        unreachable = code == grpc.StatusCode.UNAVAILABLE or _CONNECT_FAILED in details
        if unreachable or code in _REDIAL:
            self._forget(stub)
        where = f"kubelet PodResources socket {self._socket_path}"
        if method == "Get" and (
            code == grpc.StatusCode.UNIMPLEMENTED
            or (code == grpc.StatusCode.UNKNOWN and details.endswith("Get method disabled"))
        ):
            return PodResourcesGetUnsupported(
                f"{where}: this kubelet does not serve Get "
                "(it predates 1.27 or the KubeletPodResourcesGet feature gate is off)"
            )
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return PodResourcesUnavailable(f"{where}: this kubelet does not serve {method}")
        if unreachable:
            return PodResourcesUnavailable(f"{where}: {_unreachable(self._socket_path, details)}")
        return PodResourcesUnavailable(f"{where}: {self._reason(code, details)}")

    def _reason(self, code: grpc.StatusCode, details: str) -> str:
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"no answer within {self._timeout:g}s"
        too_large = _TOO_LARGE.search(details)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and too_large is not None:
            size, limit = too_large.groups()
            return f"answer of {size} bytes is over the client's limit of {limit} bytes"
        name = code.name.lower()
        return f"{name}: {details}" if details else name


def _unreachable(path: Path, details: str) -> str:
    """Why nothing answered on the socket, in the words of `connect(2)` where possible."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "no such socket (is the kubelet running and its pod-resources directory mounted?)"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    if not stat.S_ISSOCK(mode):
        return "not a socket"
    found = _OS_ERROR.search(details)
    if found is not None:
        return found.group(1).lower()
    return f"unavailable: {details}" if details else "unavailable"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _pod(pod: api_pb2.PodResources) -> PodDevices:
    return PodDevices(
        namespace=pod.namespace,
        name=pod.name,
        containers=tuple(_container(container) for container in pod.containers),
    )


def _container(container: api_pb2.ContainerResources) -> ContainerDevices:
    claimed = tuple(
        Device(
            resource_name=claim.driver_name or dynamic.claim_name,
            device_id=device_id,
            source="dra",
        )
        for dynamic in container.dynamic_resources
        for claim in dynamic.claim_resources
        for device_id in _claim_device_ids(claim)
    )
    return ContainerDevices(name=container.name, devices=_devices(container.devices) + claimed)


def _claim_device_ids(claim: api_pb2.ClaimResource) -> tuple[str, ...]:
    """The CDI names of a claimed device; its DRA device name if the driver uses no CDI."""
    if claim.cdi_devices:
        return tuple(cdi.name for cdi in claim.cdi_devices)
    return (claim.device_name,) if claim.device_name else ()


def _devices(entries: Iterable[api_pb2.ContainerDevices]) -> tuple[Device, ...]:
    devices: list[Device] = []
    for entry in entries:
        numa = tuple(node.ID for node in entry.topology.nodes)
        devices.extend(
            Device(resource_name=entry.resource_name, device_id=device_id, numa_nodes=numa)
            for device_id in entry.device_ids
        )
    return tuple(devices)

"""A client for the kubelet's PodResources API: which devices each container was given.

The kubelet serves this gRPC API on a unix socket (by default
/var/lib/kubelet/pod-resources/kubelet.sock), and it is the only place that knows which GPU
the device plugin, or a DRA driver, handed to which container. Three things shape the client:

- The calls go over `wire.Channel` (gRPC's protocol spoken with h2), not grpcio: its 12 MB of
  code and eight threads were a fifth of a full agent's memory for four unary calls.
- The kubelet restarts (upgrades, config changes) and replaces the socket when it does. The
  channel dials lazily and drops its connection after any failure, so the next call dials
  afresh, with no backoff.
- Failures end up in operators' logs. Every failure becomes one `PodResourcesUnavailable`
  whose message is a single line naming the socket.
- `Get` is newer than `List` (feature gate KubeletPodResourcesGet, alpha in 1.27) and older
  kubelets either lack it (UNIMPLEMENTED) or refuse it ("Get method disabled"); both raise
  `PodResourcesGetUnsupported`, so a caller can fall back to `list` once and remember.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from gpuscope.agent.k8s.podresources.records import ContainerDevices, Device, PodDevices
from gpuscope.agent.k8s.podresources.v1 import api_pb2
from gpuscope.agent.k8s.podresources.wire import Channel, Code, RpcFailure, Unreachable
from gpuscope.agent.runtime.sources import SourceUnavailable

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
SERVICE = "/v1.PodResourcesLister/"

# The largest answer this client accepts unless told otherwise: 16 MiB, as the kubelet's own
# clients. The agent asks for less (agent/k8s/kubelet_source.py MAX_ANSWER_BYTES, 4 MiB): a
# real List is tens of KB, and parsing costs about ten times an answer's size in memory.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

# The channel's refusal of a big answer (gRPC's words); the kubelet's rate limit is
# "rejected by rate limit".
_TOO_LARGE = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")


class PodResourcesUnavailable(SourceUnavailable):
    """The kubelet's PodResources API could not answer; the message is one line."""


class PodResourcesGetUnsupported(PodResourcesUnavailable):
    """This kubelet has no `Get` (too old, or KubeletPodResourcesGet is off): use `list`."""


class PodResourcesClient:
    """Reads the PodResources v1 API over a unix socket.

    Calls are blocking, each bounded by `timeout` seconds (waiting for another thread's call
    included). One client may be shared between threads. `close` releases the connection; a
    later call opens a new one.
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
        self._channel = Channel(socket_path, max_message_bytes=max_message_bytes)

    @property
    def socket_path(self) -> Path:
        return self._socket_path

    def list(self) -> tuple[PodDevices, ...]:
        """Every active pod the kubelet knows, with the devices of each of its containers."""
        raw = self._call("List", api_pb2.ListPodResourcesRequest())
        response = api_pb2.ListPodResourcesResponse.FromString(raw)
        return tuple(_pod(pod) for pod in response.pod_resources)

    def allocatable(self) -> tuple[Device, ...]:
        """Every device-plugin device the kubelet can hand out, allocated or not.

        The answer says nothing about DRA devices: the kubelet does not track those here.
        """
        raw = self._call("GetAllocatableResources", api_pb2.AllocatableResourcesRequest())
        return _devices(api_pb2.AllocatableResourcesResponse.FromString(raw).devices)

    def get(self, namespace: str, name: str) -> PodDevices | None:
        """One pod's devices, or None when the kubelet has no such pod.

        Raises `PodResourcesGetUnsupported` when the kubelet cannot answer `Get` at all.
        """
        request = api_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        try:
            raw = self._call("Get", request, not_found=(namespace, name))
        except _NotFound:
            return None
        response = api_pb2.GetPodResourcesResponse.FromString(raw)
        if not response.HasField("pod_resources"):
            return None
        return _pod(response.pod_resources)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _call(
        self, method: str, request: object, not_found: tuple[str, str] | None = None
    ) -> bytes:
        payload = request.SerializeToString()  # type: ignore[attr-defined]
        where = f"kubelet PodResources socket {self._socket_path}"
        try:
            return self._channel.unary(SERVICE + method, payload, self._timeout)
        except Unreachable as exc:
            raise PodResourcesUnavailable(
                f"{where}: {_unreachable(self._socket_path, exc.strerror)}"
            ) from None
        except RpcFailure as failure:
            code, raw_details = failure.code, failure.details
        details = _one_line(raw_details)
        if not_found is not None and (
            code == Code.NOT_FOUND
            # Kubelets answer a missing pod with a plain error: code UNKNOWN and
            # "pod <name> in namespace <namespace> not found".
            or (
                code == Code.UNKNOWN
                and raw_details == f"pod {not_found[1]} in namespace {not_found[0]} not found"
            )
        ):
            raise _NotFound from None
        if method == "Get" and (
            code == Code.UNIMPLEMENTED
            or (code == Code.UNKNOWN and details.endswith("Get method disabled"))
        ):
            raise PodResourcesGetUnsupported(
                f"{where}: this kubelet does not serve Get "
                "(it predates 1.27 or the KubeletPodResourcesGet feature gate is off)"
            ) from None
        if code == Code.UNIMPLEMENTED:
            raise PodResourcesUnavailable(f"{where}: this kubelet does not serve {method}")
        raise PodResourcesUnavailable(f"{where}: {self._reason(code, details)}") from None

    def _reason(self, code: Code, details: str) -> str:
        if code == Code.DEADLINE_EXCEEDED:
            return f"no answer within {self._timeout:g}s"
        too_large = _TOO_LARGE.search(details)
        if code == Code.RESOURCE_EXHAUSTED and too_large is not None:
            size, limit = too_large.groups()
            return f"answer of {size} bytes is over the client's limit of {limit} bytes"
        if code == Code.UNAVAILABLE:
            return f"unavailable: {details}" if details else "unavailable"
        name = code.name.lower()
        return f"{name}: {details}" if details else name


class _NotFound(Exception):
    """Get's answer for a pod the kubelet does not have."""


def _unreachable(path: Path, strerror: str) -> str:
    """Why nothing answered on the socket, in the words of `connect(2)`."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "no such socket (is the kubelet running and its pod-resources directory mounted?)"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    if not stat.S_ISSOCK(mode):
        return "not a socket"
    return strerror.lower()


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

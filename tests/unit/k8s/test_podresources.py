"""The PodResources client against a real gRPC server on a unix socket, and GPU matching."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from gpuscope.agent.k8s.podresources import (
    ContainerDevices,
    Device,
    GpuAllocation,
    PodDevices,
    PodResourcesClient,
    PodResourcesGetUnsupported,
    PodResourcesUnavailable,
    UnmatchedDevice,
    gpu_allocations,
    match_gpus,
    wire,
)
from gpuscope.agent.k8s.podresources.v1 import api_pb2
from gpuscope.agent.runtime.sources import SourceUnavailable, describe
from tests.doubles.kubelet_server import KubeletServer, claim, container, devices, pod

GPU0 = "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763"
GPU1 = "GPU-1b6a7c33-90aa-4c4e-8d1f-0e2b5c7d9a10"
MIG0 = "MIG-0b5c9a2e-7d41-5f3a-9e8b-3c2d1a0f4e5d"
MIG1 = "MIG-6f0e1d2c-3b4a-5968-8776-a5b4c3d2e1f0"
NODE_GPUS = (GPU0, GPU1)
NODE_MIGS = {MIG0: GPU1, MIG1: GPU1}


@pytest.fixture
def kubelet() -> Iterator[KubeletServer]:
    with KubeletServer() as server:
        yield server


@pytest.fixture
def client(kubelet: KubeletServer) -> Iterator[PodResourcesClient]:
    with PodResourcesClient(kubelet.socket_path, timeout=2.0) as c:
        yield c


# --- reading the API -------------------------------------------------------------------------


def test_list_flattens_one_device_per_id(
    kubelet: KubeletServer, client: PodResourcesClient
) -> None:
    kubelet.set_pods(
        pod(
            "train",
            "llama-0",
            container(
                "main",
                devices("nvidia.com/gpu", GPU0, GPU1, numa=(0, 1)),
                devices("rdma/hca", "mlx5_0"),
                cpu_ids=(0, 1, 2),
            ),
            container("sidecar"),
        ),
        pod("kube-system", "coredns"),
    )

    assert client.list() == (
        PodDevices(
            namespace="train",
            name="llama-0",
            containers=(
                ContainerDevices(
                    name="main",
                    devices=(
                        Device("nvidia.com/gpu", GPU0, (0, 1)),
                        Device("nvidia.com/gpu", GPU1, (0, 1)),
                        Device("rdma/hca", "mlx5_0", ()),
                    ),
                ),
                ContainerDevices(name="sidecar", devices=()),
            ),
        ),
        PodDevices(namespace="kube-system", name="coredns", containers=()),
    )
    assert kubelet.calls == ["List"]


def test_list_of_an_empty_node(client: PodResourcesClient) -> None:
    assert client.list() == ()


def test_allocatable_flattens_every_known_device(
    kubelet: KubeletServer, client: PodResourcesClient
) -> None:
    kubelet.set_allocatable(
        devices("nvidia.com/gpu", GPU0, numa=(0,)),
        devices("nvidia.com/gpu", GPU1, numa=(1,)),
        devices("nvidia.com/mig-1g.10gb", MIG0, MIG1),
    )

    assert client.allocatable() == (
        Device("nvidia.com/gpu", GPU0, (0,)),
        Device("nvidia.com/gpu", GPU1, (1,)),
        Device("nvidia.com/mig-1g.10gb", MIG0),
        Device("nvidia.com/mig-1g.10gb", MIG1),
    )


def test_dra_claims_become_dra_devices(kubelet: KubeletServer, client: PodResourcesClient) -> None:
    kubelet.set_pods(
        pod(
            "infer",
            "vllm",
            container(
                "server",
                devices("nvidia.com/gpu", GPU0),
                claims=(
                    claim(
                        "gpu-claim",
                        f"k8s.gpu.nvidia.com/device={GPU1}",
                        "k8s.gpu.nvidia.com/claim=extra",
                        driver="gpu.nvidia.com",
                        pool="node-a",
                        device="gpu-1",
                    ),
                    claim("old-claim", "vendor.com/gpu=dev7"),  # pre-1.31: no driver name
                    claim("no-cdi", driver="net.example.com", device="nic-3"),
                ),
            ),
        )
    )

    (result,) = client.list()
    assert result.containers[0].devices == (
        Device("nvidia.com/gpu", GPU0),
        Device("gpu.nvidia.com", f"k8s.gpu.nvidia.com/device={GPU1}", source="dra"),
        Device("gpu.nvidia.com", "k8s.gpu.nvidia.com/claim=extra", source="dra"),
        Device("old-claim", "vendor.com/gpu=dev7", source="dra"),
        Device("net.example.com", "nic-3", source="dra"),
    )


def test_get_one_pod(kubelet: KubeletServer, client: PodResourcesClient) -> None:
    kubelet.set_pods(
        pod("a", "p", container("c", devices("nvidia.com/gpu", GPU0))),
        pod("b", "p", container("c", devices("nvidia.com/gpu", GPU1))),
    )

    assert client.get("b", "p") == PodDevices(
        "b", "p", (ContainerDevices("c", (Device("nvidia.com/gpu", GPU1),)),)
    )
    assert client.get("c", "p") is None
    assert kubelet.calls == ["Get", "Get"]


@pytest.mark.parametrize("mode", ["unimplemented", "disabled"])
def test_get_on_a_kubelet_without_get(
    kubelet: KubeletServer, client: PodResourcesClient, mode: str
) -> None:
    kubelet.get_mode = "unimplemented" if mode == "unimplemented" else "disabled"
    kubelet.set_pods(pod("a", "p"))

    with pytest.raises(PodResourcesGetUnsupported) as caught:
        client.get("a", "p")

    assert str(caught.value) == (
        f"kubelet PodResources socket {kubelet.socket_path}: this kubelet does not serve Get "
        "(it predates 1.27 or the KubeletPodResourcesGet feature gate is off)"
    )
    assert isinstance(caught.value, PodResourcesUnavailable)
    assert client.list() == (PodDevices("a", "p", ()),)  # the fallback still works


HOSTILE = (
    'ns-"quoted"',
    "pod\nwith\nnewlines and 'quotes' \\ back\\slash",
    'контейнер-🚀-容器\t{label="x"}',
)


def test_hostile_strings_pass_through_unchanged(
    kubelet: KubeletServer, client: PodResourcesClient
) -> None:
    namespace, name, cname = HOSTILE
    weird_id = 'GPU-"x"\n::7'
    kubelet.set_pods(pod(namespace, name, container(cname, devices("näme/ü", weird_id))))

    expected = PodDevices(
        namespace, name, (ContainerDevices(cname, (Device("näme/ü", weird_id),)),)
    )
    assert client.list() == (expected,)
    assert client.get(namespace, name) == expected
    assert client.get(namespace, name + "\n") is None  # not found, even with a newline in it


def test_answers_larger_than_grpc_default_limit(kubelet: KubeletServer) -> None:
    """gRPC refuses answers over 4 MiB by default; a dense node's List can be larger."""
    ids = [f"GPU-{i:08d}-{'x' * 80}" for i in range(60_000)]
    big = pod("big", "pod", container("c", devices("nvidia.com/gpu", *ids)))
    size = api_pb2.ListPodResourcesResponse(pod_resources=[big]).ByteSize()
    assert size > 5 << 20
    kubelet.set_pods(big)

    with PodResourcesClient(kubelet.socket_path) as roomy:
        (result,) = roomy.list()
    assert len(result.containers[0].devices) == len(ids)

    with (
        PodResourcesClient(kubelet.socket_path, max_message_bytes=4 << 20) as tight,
        pytest.raises(PodResourcesUnavailable) as caught,
    ):
        tight.list()
    _assert_one_line(
        caught.value,
        kubelet.socket_path,
        f"answer of {size} bytes is over the client's limit of {4 << 20} bytes",
    )


# --- failures --------------------------------------------------------------------------------


def _assert_one_line(exc: BaseException, socket_path: Path, reason: str) -> None:
    assert str(exc) == f"kubelet PodResources socket {socket_path}: {reason}"
    assert "\n" not in str(exc)
    assert exc.__cause__ is None and exc.__suppress_context__  # no gRPC traceback attached


def test_socket_absent(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    with (
        PodResourcesClient(path, timeout=1.0) as client,
        pytest.raises(PodResourcesUnavailable) as caught,
    ):
        client.list()
    _assert_one_line(
        caught.value,
        path,
        "no such socket (is the kubelet running and its pod-resources directory mounted?)",
    )
    # The agent's source runner logs SourceUnavailable messages verbatim.
    assert isinstance(caught.value, SourceUnavailable)
    assert describe(caught.value) == str(caught.value)


def test_kubelet_down_leaves_a_dead_socket(kubelet: KubeletServer) -> None:
    kubelet.stop(stale_socket=True)
    with (
        PodResourcesClient(kubelet.socket_path, timeout=1.0) as client,
        pytest.raises(PodResourcesUnavailable) as caught,
    ):
        client.allocatable()
    _assert_one_line(caught.value, kubelet.socket_path, "connection refused")


def test_path_that_is_not_a_socket(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    path.write_text("")
    with (
        PodResourcesClient(path, timeout=1.0) as client,
        pytest.raises(PodResourcesUnavailable) as caught,
    ):
        client.list()
    _assert_one_line(caught.value, path, "not a socket")


def test_deadline(kubelet: KubeletServer) -> None:
    kubelet.delay = 5.0
    with PodResourcesClient(kubelet.socket_path, timeout=0.2) as client:
        began = time.monotonic()
        with pytest.raises(PodResourcesUnavailable) as caught:
            client.list()
        assert time.monotonic() - began < 2.0
        _assert_one_line(caught.value, kubelet.socket_path, "no answer within 0.2s")

        kubelet.delay = 0.0
        assert client.list() == ()


def test_errors_from_the_kubelet_are_one_line(
    kubelet: KubeletServer, client: PodResourcesClient
) -> None:
    kubelet.fail = (grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")  # kubelet's
    with pytest.raises(PodResourcesUnavailable) as caught:
        client.list()
    _assert_one_line(
        caught.value, kubelet.socket_path, "resource_exhausted: rejected by rate limit"
    )

    kubelet.fail = (grpc.StatusCode.UNKNOWN, "PodResources API GetAllocatableResources disabled")
    with pytest.raises(PodResourcesUnavailable) as caught:
        client.allocatable()
    _assert_one_line(
        caught.value,
        kubelet.socket_path,
        "unknown: PodResources API GetAllocatableResources disabled",
    )

    kubelet.fail = (grpc.StatusCode.INTERNAL, "boom\n  at frame 1\n  at frame 2")
    with pytest.raises(PodResourcesUnavailable) as caught:
        client.get("a", "b")
    _assert_one_line(caught.value, kubelet.socket_path, "internal: boom at frame 1 at frame 2")


def test_recovers_after_a_failed_call_when_the_kubelet_returns(
    kubelet: KubeletServer, client: PodResourcesClient
) -> None:
    kubelet.set_pods(pod("a", "p"))
    assert client.list() == (PodDevices("a", "p", ()),)

    kubelet.stop()
    with pytest.raises(PodResourcesUnavailable):
        client.list()
    with pytest.raises(PodResourcesUnavailable):
        client.list()  # still down: fails again, quickly

    kubelet.start()
    began = time.monotonic()
    assert client.list() == (PodDevices("a", "p", ()),)  # at once, not after gRPC's backoff
    assert time.monotonic() - began < 1.0


def test_recovers_when_the_kubelet_restarted_between_calls(
    kubelet: KubeletServer, client: PodResourcesClient
) -> None:
    kubelet.set_pods(pod("a", "p"))
    assert client.list() == (PodDevices("a", "p", ()),)

    kubelet.restart()  # a new socket file: the old connection is gone
    kubelet.set_pods(pod("a", "q"))
    assert client.list() == (PodDevices("a", "q", ()),)


def test_an_answer_with_an_error_status_keeps_the_connection(
    kubelet: KubeletServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A "not found" or a refusal is the kubelet's answer on a healthy connection: the
    next call uses the same connection rather than dialling again."""
    dials: list[object] = []

    class Counted(socket.socket):
        def connect(self, address: object) -> None:
            dials.append(address)
            super().connect(address)  # type: ignore[arg-type]

    monkeypatch.setattr(wire.socket, "socket", Counted)
    kubelet.set_pods(pod("a", "p"))
    with PodResourcesClient(kubelet.socket_path) as client:
        assert client.get("a", "missing") is None
        kubelet.fail = (grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        with pytest.raises(PodResourcesUnavailable):
            client.list()
        kubelet.fail = None
        assert client.list() == (PodDevices("a", "p", ()),)
    assert len(dials) == 1


def test_threads_share_one_client(kubelet: KubeletServer, client: PodResourcesClient) -> None:
    """Calls from several threads at once are serialized on one connection, each answered."""
    kubelet.set_pods(pod("a", "p"), pod("b", "q"))
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: client.list(), range(40)))
    assert all(a == answers[0] for a in answers) and len(answers[0]) == 2


def test_a_call_waiting_on_a_slow_one_keeps_its_own_deadline(kubelet: KubeletServer) -> None:
    kubelet.delay = 1.0
    with (
        PodResourcesClient(kubelet.socket_path, timeout=0.3) as client,
        ThreadPoolExecutor(2) as pool,
    ):
        began = time.monotonic()
        calls = [pool.submit(client.list) for _ in range(2)]
        for call in calls:
            with pytest.raises(PodResourcesUnavailable, match=r"no answer within 0\.3s"):
                call.result()
        assert time.monotonic() - began < 1.5


def test_close_then_use_again(kubelet: KubeletServer) -> None:
    client = PodResourcesClient(kubelet.socket_path)
    client.close()  # before any call: nothing to release
    assert client.list() == ()
    client.close()
    assert client.list() == ()
    client.close()


# --- matching devices to GPUs ----------------------------------------------------------------


def _pods(*containers: tuple[str, str, str, tuple[Device, ...]]) -> tuple[PodDevices, ...]:
    return tuple(
        PodDevices(ns, name, (ContainerDevices(cname, devs),))
        for ns, name, cname, devs in containers
    )


def test_whole_gpus() -> None:
    pods = _pods(
        ("ns", "p", "c", (Device("nvidia.com/gpu", GPU0), Device("nvidia.com/gpu", GPU1))),
        ("ns", "q", "c", (Device("example.com/fpga", GPU0),)),  # not a GPU resource
    )
    assert gpu_allocations(pods, gpu_uuids=NODE_GPUS, mig_uuids=NODE_MIGS) == (
        GpuAllocation(GPU0, None, "ns", "p", "c", None),
        GpuAllocation(GPU1, None, "ns", "p", "c", None),
    )


def test_mig_instances_map_to_their_gpu() -> None:
    legacy = f"MIG-{GPU0}/1/0"  # drivers before R470 put the parent in the MIG UUID
    pods = _pods(
        ("ns", "p", "c", (Device("nvidia.com/mig-1g.10gb", MIG0),)),
        ("ns", "q", "c", (Device("nvidia.com/gpu", MIG1),)),  # the "single" MIG strategy
        ("ns", "r", "c", (Device("nvidia.com/mig-3g.40gb", legacy),)),
    )
    assert gpu_allocations(pods, gpu_uuids=NODE_GPUS, mig_uuids=NODE_MIGS) == (
        GpuAllocation(GPU1, MIG0, "ns", "p", "c", None),
        GpuAllocation(GPU1, MIG1, "ns", "q", "c", None),
        GpuAllocation(GPU0, legacy, "ns", "r", "c", None),
    )


def test_time_sliced_gpu_shared_by_three_pods() -> None:
    pods = _pods(
        ("t", "a", "c", (Device("nvidia.com/gpu", f"{GPU0}::0"),)),
        ("t", "b", "c", (Device("nvidia.com/gpu", f"{GPU0}::1"),)),
        ("t", "c", "c", (Device("nvidia.com/gpu", f"{GPU0}::3"),)),
        ("t", "d", "c", (Device("nvidia.com/mig-1g.10gb", f"{MIG0}::2"),)),
    )
    assert gpu_allocations(pods, gpu_uuids=NODE_GPUS, mig_uuids=NODE_MIGS) == (
        GpuAllocation(GPU0, None, "t", "a", "c", 0),
        GpuAllocation(GPU0, None, "t", "b", "c", 1),
        GpuAllocation(GPU0, None, "t", "c", "c", 3),
        GpuAllocation(GPU1, MIG0, "t", "d", "c", 2),
    )


def test_renamed_shared_resource_needs_its_name() -> None:
    pods = _pods(("t", "a", "c", (Device("nvidia.com/gpu.shared", f"{GPU0}::0"),)))
    assert gpu_allocations(pods, gpu_uuids=NODE_GPUS, mig_uuids=NODE_MIGS) == ()
    assert gpu_allocations(
        pods, ("nvidia.com/gpu", "nvidia.com/gpu.shared"), gpu_uuids=NODE_GPUS, mig_uuids=NODE_MIGS
    ) == (GpuAllocation(GPU0, None, "t", "a", "c", 0),)


def test_dra_devices_naming_a_gpu() -> None:
    pods = _pods(
        (
            "d",
            "p",
            "c",
            (
                Device("gpu.nvidia.com", f"k8s.gpu.nvidia.com/device={GPU1}", source="dra"),
                Device("gpu.nvidia.com", f"k8s.gpu.nvidia.com/device={MIG0}", source="dra"),
                Device("gpu.nvidia.com", "k8s.gpu.nvidia.com/claim=uid-gpu-0", source="dra"),
                Device("net.example.com", "nic-3", source="dra"),
            ),
        ),
    )
    assert gpu_allocations(pods, gpu_uuids=NODE_GPUS, mig_uuids=NODE_MIGS) == (
        GpuAllocation(GPU1, None, "d", "p", "c", None),
        GpuAllocation(GPU1, MIG0, "d", "p", "c", None),
    )


def test_unknown_ids_are_returned_apart() -> None:
    stranger = "GPU-00000000-0000-0000-0000-000000000000"
    pods = _pods(
        (
            "ns",
            "p",
            "c",
            (
                Device("nvidia.com/gpu", GPU0),
                Device("nvidia.com/gpu", GPU0),  # listed twice: one allocation
                Device("nvidia.com/gpu", "0"),  # DEVICE_ID_STRATEGY=index
                Device("nvidia.com/gpu", f"{stranger}::1"),
                Device("nvidia.com/mig-1g.10gb", "MIG-unknown"),
                Device("vendor", f"cdi/gpu={stranger}", source="dra"),
                Device("vendor", "cdi/gpu=no-uuid", source="dra"),  # not GPU-shaped: ignored
            ),
        ),
    )
    match = match_gpus(pods, gpu_uuids=NODE_GPUS, mig_uuids=NODE_MIGS)
    assert match.allocations == (GpuAllocation(GPU0, None, "ns", "p", "c", None),)
    assert [u.device.device_id for u in match.unmatched] == [
        "0",
        f"{stranger}::1",
        "MIG-unknown",
        f"cdi/gpu={stranger}",
    ]
    assert match.unmatched[0] == UnmatchedDevice("ns", "p", "c", Device("nvidia.com/gpu", "0"))


def test_matching_what_the_kubelet_serves(
    kubelet: KubeletServer, client: PodResourcesClient
) -> None:
    """End to end: the kubelet's answer, through the client, onto the node's GPUs."""
    name = 'trainer-"0"\n✓'
    kubelet.set_pods(
        pod("ml", name, container("main", devices("nvidia.com/gpu", GPU0, numa=(0,)))),
        pod("ml", "shared-a", container("c", devices("nvidia.com/gpu", f"{GPU1}::0"))),
        pod("ml", "shared-b", container("c", devices("nvidia.com/gpu", f"{GPU1}::1"))),
        pod("ml", "mig", container("c", devices("nvidia.com/mig-1g.10gb", MIG0))),
        pod("ml", "dra", container("c", claims=(claim("x", f"nvidia.com/gpu={GPU0}"),))),
    )

    assert gpu_allocations(client.list(), gpu_uuids=NODE_GPUS, mig_uuids=NODE_MIGS) == (
        GpuAllocation(GPU0, None, "ml", name, "main", None),
        GpuAllocation(GPU1, None, "ml", "shared-a", "c", 0),
        GpuAllocation(GPU1, None, "ml", "shared-b", "c", 1),
        GpuAllocation(GPU1, MIG0, "ml", "mig", "c", None),
        GpuAllocation(GPU0, None, "ml", "dra", "c", None),
    )

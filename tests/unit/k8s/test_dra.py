"""DRA allocations from literal Kubernetes objects: the pod's claims, the ResourceClaims'
allocation results and the driver's ResourceSlices, shaped as the API and NVIDIA's DRA
driver write them (the builders are the API server double's)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from gpuscope.agent.k8s import dra
from gpuscope.agent.k8s.dra_records import DEFAULT_DRA_DRIVERS, DraAllocation, DraSnapshot
from tests.doubles.kube_apiserver import (
    claim_container,
    dra_dynamic_mig,
    dra_gpu,
    dra_mig,
    pod,
    pod_claim,
    resource_claim,
    resource_slice,
)

NODE = "gpu-node-1"
GPU0 = "GPU-0b1c2d3e-0000-4000-8000-000000000000"
GPU1 = "GPU-0b1c2d3e-0000-4000-8000-000000000001"
GPU6 = "GPU-0b1c2d3e-0000-4000-8000-000000000006"
MIG6 = "MIG-5a6b7c8d-0000-4000-8000-000000000060"
SLICES = [
    resource_slice(
        NODE,
        [
            dra_gpu(0, GPU0),
            dra_gpu(1, GPU1),
            dra_mig(6, GPU6, MIG6, profile="1g.10gb", profile_id=19, start=0, size=1),
        ],
    )
]


def snapshot(
    pods: Iterable[dict[str, Any]],
    claims: Iterable[dict[str, Any]],
    slices: Iterable[dict[str, Any]] = SLICES,
) -> DraSnapshot:
    """What the source would hand on after listing these objects."""
    parsed_pods = [dra.parse_pod(p)[1] for p in pods]
    parsed_claims = dict(dra.parse_claim(c, DEFAULT_DRA_DRIVERS) for c in claims)
    parsed_slices = [dra.parse_slice(s, DEFAULT_DRA_DRIVERS)[1] for s in slices]
    return dra.resolve(
        [p for p in parsed_pods if p is not None],
        {k: v for k, v in parsed_claims.items() if v is not None},
        [s for s in parsed_slices if s is not None],
    )


def held(snap: DraSnapshot) -> set[tuple[str, str, str]]:
    return {(a.pod, a.container, a.device_uuid) for a in snap.allocations}


def gpu_pod(name: str, uid: str, *containers: dict[str, Any], **claims: Any) -> dict[str, Any]:
    return pod(
        "ml", name, NODE, uid=uid, containers=list(containers),
        resource_claims=[pod_claim(k, **v) for k, v in claims.items()],
    )  # fmt: skip


def test_a_container_gets_the_gpu_its_claim_was_allocated() -> None:
    p = gpu_pod("train-0", "u1", claim_container("main", "gpus"), gpus={"claim": "train-0-gpus"})
    c = resource_claim(
        "ml", "train-0-gpus", results=[("gpu", NODE, "gpu-0"), ("gpu", NODE, "gpu-1")],
        reserved_for=[("train-0", "u1")], node_name=NODE,
    )  # fmt: skip
    snap = snapshot([p], [c])
    assert held(snap) == {("train-0", "main", GPU0), ("train-0", "main", GPU1)}
    assert snap.unresolved == ()
    first = snap.allocations[0]
    assert first == DraAllocation(
        namespace="ml", pod="train-0", container="main", claim="train-0-gpus", request="gpu",
        driver="gpu.nvidia.com", pool=NODE, device="gpu-0", device_uuid=GPU0, device_type="gpu",
    )  # fmt: skip


def test_a_shared_claim_counts_for_every_pod_it_is_reserved_for_and_only_those() -> None:
    shared = resource_claim(
        "ml", "shared-gpu", results=[("gpu", NODE, "gpu-0")],
        reserved_for=[("a", "ua"), ("b", "ub")],
    )  # fmt: skip
    pods = [
        gpu_pod(name, uid, claim_container("main", "g"), g={"claim": "shared-gpu"})
        for name, uid in (("a", "ua"), ("b", "ub"), ("c", "uc"))  # c: not reserved (yet)
    ]
    assert held(snapshot(pods, [shared])) == {("a", "main", GPU0), ("b", "main", GPU0)}


def test_a_claim_from_a_template_is_found_under_its_generated_name() -> None:
    spec = pod(
        "ml", "infer-7f9c", NODE, uid="u2", containers=[claim_container("server", "gpu")],
        resource_claims=[pod_claim("gpu", template="one-gpu")],
        resource_claim_statuses=[{"name": "gpu", "resourceClaimName": "infer-7f9c-gpu-x4k2p"}],
    )  # fmt: skip
    generated = resource_claim(
        "ml", "infer-7f9c-gpu-x4k2p", results=[("gpu", NODE, "gpu-1")],
        reserved_for=[("infer-7f9c", "u2")],
    )  # fmt: skip
    assert held(snapshot([spec], [generated])) == {("infer-7f9c", "server", GPU1)}

    # Before the control plane generated the claim, the pod names none: nothing, no error.
    spec["status"].pop("resourceClaimStatuses")
    empty = snapshot([spec], [generated])
    assert empty.allocations == () and empty.unresolved == ()


def test_a_mig_device_is_named_by_its_mig_uuid_with_its_parent_gpu() -> None:
    p = gpu_pod("mig-0", "u3", claim_container("main", "m"), m={"claim": "mig-claim"})
    c = resource_claim(
        "ml", "mig-claim", requests=["mig"], results=[("mig", NODE, "gpu-6-mig-19-0-1")],
        reserved_for=[("mig-0", "u3")],
    )  # fmt: skip
    (allocation,) = snapshot([p], [c]).allocations
    assert allocation.device_uuid == MIG6
    assert (allocation.device_type, allocation.parent_uuid) == ("mig", GPU6)


def test_a_claim_not_yet_allocated_gives_nothing_and_is_no_error() -> None:
    p = gpu_pod("pending", "u4", claim_container("main", "g"), g={"claim": "waiting"})
    c = resource_claim("ml", "waiting")  # no status: the scheduler has not allocated it
    assert dra.parse_claim(c, DEFAULT_DRA_DRIVERS) == (("ml", "waiting"), None)
    snap = snapshot([p], [c])
    assert snap.allocations == () and snap.unresolved == ()


def test_a_device_whose_slice_has_no_uuid_is_left_out_with_one_line() -> None:
    no_uuid = [resource_slice(NODE, [dra_gpu(0, None), dra_gpu(1, GPU1)])]
    p = gpu_pod("train-1", "u5", claim_container("main", "g"), g={"claim": "two"})
    c = resource_claim(
        "ml", "two", results=[("gpu", NODE, "gpu-0"), ("gpu", NODE, "gpu-1")],
        reserved_for=[("train-1", "u5")],
    )  # fmt: skip
    snap = snapshot([p], [c], no_uuid)
    assert held(snap) == {("train-1", "main", GPU1)}  # the other device is still attributed
    (line,) = snap.unresolved
    assert "\n" not in line
    assert "ml/two" in line and "gpu.nvidia.com/gpu-node-1/gpu-0" in line and "uuid" in line


def test_a_device_no_slice_of_this_node_publishes_is_said_once() -> None:
    p = gpu_pod("train-2", "u6", claim_container("main", "g"), g={"claim": "elsewhere"})
    c = resource_claim(
        "ml", "elsewhere", results=[("gpu", "gpu-node-2", "gpu-0")],
        reserved_for=[("train-2", "u6")],
    )  # fmt: skip
    snap = snapshot([p], [c])
    assert snap.allocations == ()
    assert len(snap.unresolved) == 1 and "no ResourceSlice" in snap.unresolved[0]


def test_a_container_naming_one_request_gets_only_that_requests_devices() -> None:
    p = gpu_pod(
        "split", "u7", claim_container("trainer", ("g", "big")),
        claim_container("helper", ("g", "small")), claim_container("sidecar"), g={"claim": "two"},
    )  # fmt: skip
    c = resource_claim(
        "ml", "two", requests=["big", "small"],
        # "big" was a firstAvailable request: its result names the subrequest chosen.
        results=[("big/h100", NODE, "gpu-0"), ("small", NODE, "gpu-1")],
        reserved_for=[("split", "u7")],
    )  # fmt: skip
    assert held(snapshot([p], [c])) == {("split", "trainer", GPU0), ("split", "helper", GPU1)}


def test_other_drivers_and_qualified_attribute_names() -> None:
    qualified = resource_slice(NODE, [dra_gpu(0, None)])
    device = qualified["spec"]["devices"][0]
    device["attributes"]["gpu.nvidia.com/uuid"] = {"string": GPU0}  # the same attribute
    nic = resource_slice(NODE, [{"name": "eth1", "attributes": {}}], driver="dra.net")
    assert dra.parse_slice(nic, DEFAULT_DRA_DRIVERS)[1] is None
    p = gpu_pod("mixed", "u8", claim_container("main", "g"), g={"claim": "gpu-and-nic"})
    c = resource_claim(
        "ml", "gpu-and-nic", requests=["gpu", "nic"],
        results=[("gpu", NODE, "gpu-0"), ("nic", "dra.net", NODE, "eth1")],
        reserved_for=[("mixed", "u8")],
    )  # fmt: skip
    snap = snapshot([p], [c], [qualified, nic])
    assert held(snap) == {("mixed", "main", GPU0)}
    assert snap.unresolved == ()  # the NIC is no GPU: not even a problem


def test_pods_without_claims_and_malformed_objects_keep_nothing() -> None:
    assert dra.parse_pod(pod("ml", "plain", NODE, uid="u9"))[1] is None
    assert dra.parse_claim({"metadata": None, "status": {"allocation": "x"}}, ["a"])[1] is None
    _, devices = dra.parse_slice(
        {"spec": {"driver": "gpu.nvidia.com", "devices": [3]}}, ["gpu.nvidia.com"]
    )
    assert devices == ()
    mangled = pod("ml", "odd", NODE, uid="u10", containers=[{"name": "c", "resources": []}])
    mangled["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": "x"}, "junk"]
    (_, claims) = dra.parse_pod(mangled)
    assert claims is not None and claims.containers == () and dict(claims.claims) == {"g": "x"}


def test_a_claim_allocated_on_another_node_is_not_kept() -> None:
    """The watch sees every claim of the cluster: only this node's are held in memory."""
    here = resource_claim("ml", "here", results=[("gpu", NODE, "gpu-0")], node_name=NODE)
    there = resource_claim("ml", "there", results=[("gpu", "n9", "gpu-0")], node_name="n9")
    anywhere = resource_claim("ml", "anywhere", results=[("gpu", "fabric", "gpu-0")])
    kept = {
        name: dra.parse_claim(c, DEFAULT_DRA_DRIVERS, NODE)[1] is not None
        for name, c in (("here", here), ("there", there), ("anywhere", anywhere))
    }
    assert kept == {"here": True, "there": False, "anywhere": True}
    labelled = resource_claim("ml", "labelled", results=[("gpu", "n9", "gpu-0")], node_name="n9")
    term = labelled["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
    term["matchExpressions"] = [{"key": "pool", "operator": "In", "values": ["a"]}]
    assert dra.parse_claim(labelled, DEFAULT_DRA_DRIVERS, NODE)[1] is not None  # not read: kept


def test_a_claim_for_admin_access_is_no_allocation() -> None:
    """A monitoring pod's admin-access claim on a GPU another pod holds: not a second holder."""
    train = gpu_pod("train", "ut", claim_container("main", "g"), g={"claim": "train-gpu"})
    monitor = gpu_pod("monitor", "um", claim_container("agent", "g"), g={"claim": "watch-gpu"})
    claims = [
        resource_claim("ml", "train-gpu", results=[("gpu", NODE, "gpu-0")],
                       reserved_for=[("train", "ut")]),
        resource_claim("ml", "watch-gpu", results=[("gpu", NODE, "gpu-0")],
                       reserved_for=[("monitor", "um")], admin_access=True),
    ]  # fmt: skip
    snap = snapshot([train, monitor], claims)
    assert held(snap) == {("train", "main", GPU0)}
    assert snap.unresolved == ()
    # A result written without the flag still counts as admin access when its request asks.
    written = claims[1]
    written["status"]["allocation"]["devices"]["results"][0].pop("adminAccess")
    assert held(snapshot([train, monitor], claims)) == {("train", "main", GPU0)}


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2", "v1"])
def test_every_served_version_of_the_objects_reads_the_same(version: str) -> None:
    """Kubernetes 1.32 serves v1beta1 (a slice device's attributes under `basic`, a claim
    request's fields inline), 1.33 v1beta2, 1.34 v1: one allocation from each."""
    slices = [resource_slice(NODE, [dra_gpu(0, GPU0), dra_mig(6, GPU6, MIG6)], version=version)]
    p = gpu_pod("train", "u1", claim_container("main", "g"), g={"claim": "c"})
    both = [("gpu", NODE, "gpu-0"), ("gpu", NODE, "gpu-6-mig-19-0-1")]
    mine = [("train", "u1")]
    claims = [
        resource_claim("ml", "c", results=both, reserved_for=mine, node_name=NODE,
                       version=version),
        resource_claim("ml", "admin", results=both[:1], reserved_for=mine, admin_access=True,
                       version=version),
    ]  # fmt: skip
    if version == "v1beta1":
        assert "basic" in slices[0]["spec"]["devices"][0]
        assert "exactly" not in claims[1]["spec"]["devices"]["requests"][0]
    snap = snapshot([p], claims, slices)
    assert held(snap) == {("train", "main", GPU0), ("train", "main", MIG6)}
    assert snap.unresolved == ()


def _dynamic(device: dict[str, Any]) -> DraSnapshot:
    """A pod given `device` (published beside the whole GPU gpu-6, which has its uuid and
    the counter set gpu-6-counters) through a claim."""
    whole = dra_gpu(6, GPU6)
    whole["consumesCounters"] = [{"counterSet": "gpu-6-counters", "counters": {}}]
    slices = [resource_slice(NODE, [whole, device])]
    p = gpu_pod("mig-0", "u3", claim_container("main", "m"), m={"claim": "dyn"})
    c = resource_claim(
        "ml", "dyn", requests=["mig"], results=[("mig", NODE, device["name"])],
        reserved_for=[("mig-0", "u3")],
    )  # fmt: skip
    return snapshot([p], [c], slices)


@pytest.mark.parametrize(
    "device",
    [
        dra_dynamic_mig(6, GPU6),  # the driver publishes parentUUID
        dra_dynamic_mig(9, None, counter_set="gpu-6-counters"),  # its placement: the counter set
        dra_dynamic_mig(6, None),  # its name: gpu-6-mig-... is a partition of gpu-6
    ],
    ids=["parentUUID", "counter-set", "name"],
)
def test_a_dynamic_mig_device_without_a_uuid_counts_for_its_gpu(device: dict[str, Any]) -> None:
    snap = _dynamic(device)
    (allocation,) = snap.allocations
    assert (allocation.device_uuid, allocation.device_type) == ("", "mig")
    assert allocation.parent_uuid == GPU6
    assert snap.unresolved == ()


def test_a_device_without_a_uuid_on_no_gpu_published_is_said_once() -> None:
    snap = _dynamic(dra_dynamic_mig(7, None, counter_set="gpu-7-counters"))
    assert snap.allocations == ()
    (line,) = snap.unresolved
    assert "gpu-7-mig-19-0-1" in line and "no uuid attribute" in line and "parentUUID" in line

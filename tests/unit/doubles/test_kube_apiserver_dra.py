"""The API server double serves Dynamic Resource Allocation's ResourceClaims and
ResourceSlices (`resource.k8s.io/v1`) as a real 1.34 API server does: discovery, the field
selectors each resource has (a slice's node and driver; nothing selects a claim's node), and
the claim's status subresource."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest

from tests.doubles.kube_apiserver import (
    KubeApiServer,
    dra_gpu,
    resource_claim,
    resource_slice,
)
from tests.unit.doubles.test_kube_apiserver import call

V1 = "/apis/resource.k8s.io/v1"


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server
    assert not server.errors, "\n".join(server.errors)


def test_discovery_lists_claims_namespaced_with_status_and_slices_cluster_wide(
    api: KubeApiServer,
) -> None:
    groups = {g["name"]: g for g in call(api, "GET", "/apis").body["groups"]}
    assert groups["resource.k8s.io"]["preferredVersion"]["groupVersion"] == "resource.k8s.io/v1"
    resources = {r["name"]: r for r in call(api, "GET", V1).body["resources"]}
    assert resources["resourceclaims"]["namespaced"] is True
    assert "resourceclaims/status" in resources
    assert resources["resourceslices"]["namespaced"] is False
    assert "resourceslices/status" not in resources


def test_slices_select_by_node_and_driver_and_claims_refuse_a_node_selector(
    api: KubeApiServer,
) -> None:
    api.create(resource_slice("n1", [dra_gpu(0, "GPU-a")]))
    api.create(resource_slice("n2", [dra_gpu(0, "GPU-b")]))
    api.create(resource_slice("n1", [], driver="dra.net"))
    by_node = call(api, "GET", f"{V1}/resourceslices?fieldSelector={quote('spec.nodeName=n1')}")
    assert sorted(i["spec"]["driver"] for i in by_node.body["items"]) == [
        "dra.net",
        "gpu.nvidia.com",
    ]
    both = quote("spec.nodeName=n1,spec.driver=gpu.nvidia.com")
    (only,) = call(api, "GET", f"{V1}/resourceslices?fieldSelector={both}").body["items"]
    assert only["spec"]["devices"][0]["attributes"]["uuid"] == {"string": "GPU-a"}

    refused = call(api, "GET", f"{V1}/resourceclaims?fieldSelector={quote('spec.nodeName=n1')}")
    assert refused.status == 400
    assert refused.body["message"] == "field label not supported: spec.nodeName"


def test_a_claims_allocation_is_written_through_its_status_subresource(
    api: KubeApiServer,
) -> None:
    created = api.create(resource_claim("ml", "c"))
    assert "status" not in created
    allocated = resource_claim(
        "ml", "c", results=[("gpu", "n1", "gpu-0")], reserved_for=[("p", "u")]
    )
    path = f"{V1}/namespaces/ml/resourceclaims/c"
    # A write to the claim itself keeps the stored status; /status changes only the status.
    assert (
        "status" not in call(api, "PUT", path, {**allocated, "metadata": created["metadata"]}).body
    )
    stored = api.get("resourceclaims", "ml", "c")
    assert stored is not None
    answer = call(api, "PUT", f"{path}/status", {**allocated, "metadata": stored["metadata"]})
    assert answer.status == 200
    assert answer.body["status"]["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}
    ]
    assert answer.body["status"]["reservedFor"] == [{"resource": "pods", "name": "p", "uid": "u"}]

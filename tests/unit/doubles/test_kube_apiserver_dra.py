"""The API server double serves Dynamic Resource Allocation's ResourceClaims and
ResourceSlices as a real API server does: `resource.k8s.io/v1` by default (1.34), or only the
betas it is made with (v1beta1: 1.32, v1beta2: 1.33) with their real shapes, and a 404 and no
discovery entry for any version it does not serve; the field selectors each resource has (a
slice's node and driver; nothing selects a claim's node), and the claim's status
subresource."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest

from tests.doubles.kube_apiserver import (
    KubeApiServer,
    dra_dynamic_mig,
    dra_gpu,
    resource_claim,
    resource_slice,
)
from tests.unit.doubles.test_kube_apiserver import RawWatch, call

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


# --- the versions it serves -------------------------------------------------------------------

GROUP = "/apis/resource.k8s.io"


@pytest.mark.parametrize(
    ("versions", "preferred"),
    [(("v1beta1",), "v1beta1"), (("v1beta1", "v1beta2"), "v1beta2"),
     (("v1", "v1beta2", "v1beta1"), "v1")],
)  # fmt: skip
def test_discovery_lists_only_the_versions_served_newest_preferred(
    versions: tuple[str, ...], preferred: str
) -> None:
    with KubeApiServer(dra_versions=versions) as api:
        group = call(api, "GET", GROUP).body
        (listed,) = [
            g for g in call(api, "GET", "/apis").body["groups"] if g["name"] == "resource.k8s.io"
        ]
        for answer in (group, listed):
            assert sorted(v["version"] for v in answer["versions"]) == sorted(versions)
            assert answer["preferredVersion"]["version"] == preferred
        for version in {"v1", "v1beta1", "v1beta2"} - set(versions):
            assert call(api, "GET", f"{GROUP}/{version}").status == 404
            assert call(api, "GET", f"{GROUP}/{version}/resourceslices").status == 404
            assert call(api, "GET", f"{GROUP}/{version}/namespaces/ml/resourceclaims").status == 404
    assert not api.errors


def test_an_api_server_without_dra_has_no_such_group() -> None:
    with KubeApiServer(dra_versions=()) as api:
        assert "resource.k8s.io" not in {
            g["name"] for g in call(api, "GET", "/apis").body["groups"]
        }
        assert call(api, "GET", GROUP).status == 404
        assert call(api, "GET", f"{GROUP}/v1/resourceslices").status == 404
        with pytest.raises(ValueError, match="not served"):
            api.create(resource_slice("n1", [dra_gpu(0, "GPU-a")]))


def test_a_v1beta1_slice_wraps_each_device_in_basic_and_v1beta2_does_not() -> None:
    with KubeApiServer(dra_versions=("v1beta2", "v1beta1")) as api:
        # Written by a 1.32 driver in v1beta1, read in both versions.
        devices = [dra_gpu(0, "GPU-a"), dra_dynamic_mig(0, None, counter_set="gpu-0")]
        api.create(resource_slice("n1", devices, version="v1beta1"))
        (old,) = call(api, "GET", f"{GROUP}/v1beta1/resourceslices").body["items"]
        gpu, mig = old["spec"]["devices"]
        assert set(gpu) == {"name", "basic"} and gpu["basic"]["attributes"]["uuid"] == {
            "string": "GPU-a"
        }
        assert mig["basic"]["consumesCounters"][0]["counterSet"] == "gpu-0"
        assert "uuid" not in mig["basic"]["attributes"]
        (new,) = call(api, "GET", f"{GROUP}/v1beta2/resourceslices").body["items"]
        gpu, mig = new["spec"]["devices"]
        assert "basic" not in gpu and gpu["attributes"]["uuid"] == {"string": "GPU-a"}
        assert mig["consumesCounters"][0]["counterSet"] == "gpu-0"
        # A v1-shaped device sent to v1beta1 loses its unknown fields, as the real one drops them.
        answer = call(api, "POST", f"{GROUP}/v1beta1/resourceslices",
                      resource_slice("n2", [dra_gpu(0, "GPU-b")], version="v1"))  # fmt: skip
        assert answer.status == 400  # apiVersion v1 posted to v1beta1
        v1_shaped = resource_slice("n2", [dra_gpu(0, "GPU-b")], version="v1beta1")
        v1_shaped["spec"]["devices"] = resource_slice("n2", [dra_gpu(0, "GPU-b")])["spec"][
            "devices"
        ]
        created = call(api, "POST", f"{GROUP}/v1beta1/resourceslices", v1_shaped)
        assert created.status == 201 and created.body["spec"]["devices"] == [
            {"name": "gpu-0", "basic": {}}
        ]
    assert not api.errors


def test_a_v1beta1_claim_request_is_inline_and_admin_access_is_in_every_result() -> None:
    with KubeApiServer(dra_versions=("v1beta2", "v1beta1")) as api:
        api.create(
            resource_claim("ml", "monitor", results=[("gpu", "n1", "gpu-0")], admin_access=True,
                           version="v1beta1")
        )  # fmt: skip
        old = call(api, "GET", f"{GROUP}/v1beta1/namespaces/ml/resourceclaims/monitor").body
        assert old["apiVersion"] == "resource.k8s.io/v1beta1"
        assert old["spec"]["devices"]["requests"] == [
            {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "adminAccess": True}
        ]
        new = call(api, "GET", f"{GROUP}/v1beta2/namespaces/ml/resourceclaims/monitor").body
        assert new["spec"]["devices"]["requests"] == [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}}
        ]
        for claim in (old, new):
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert result == {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1",
                              "device": "gpu-0", "adminAccess": True}  # fmt: skip
    assert not api.errors


def test_a_watch_in_v1beta1_sees_changes_made_in_v1beta2_in_v1beta1() -> None:
    with KubeApiServer(dra_versions=("v1beta2", "v1beta1")) as api:
        rv = api.resource_version
        stream = RawWatch(api, f"{GROUP}/v1beta1/resourceslices?watch=1&resourceVersion={rv}")
        try:
            api.wait_for_watches(1, opened=True)
            new = resource_slice("n1", [dra_gpu(0, "GPU-a")], version="v1beta2")
            assert call(api, "POST", f"{GROUP}/v1beta2/resourceslices", new).status == 201
            event = stream.event()
        finally:
            stream.close()
        assert event["type"] == "ADDED"
        assert event["object"]["apiVersion"] == "resource.k8s.io/v1beta1"
        (device,) = event["object"]["spec"]["devices"]
        assert device["basic"]["attributes"]["uuid"] == {"string": "GPU-a"}
    assert not api.errors

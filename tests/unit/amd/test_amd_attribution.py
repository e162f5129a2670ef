"""Pods on AMD nodes: the ids AMD's device plugin gives the kubelet (a GPU's PCI address,
`amdgpu_xcp_<N>` for a partition beyond the first, `amd.com/<mode>_nps<N>` resources under
its mixed strategy) name the GPU or partition the agent reads."""

from __future__ import annotations

from gpuscope.agent.k8s.podresources.gpus import GpuAllocation, match_gpus
from gpuscope.agent.k8s.podresources.records import ContainerDevices, Device, PodDevices

GPU0, GPU1 = "3aff74a1-0000-1000-80a4-8f2c61d0e5b7", "5eff74a1-0000-1000-80c1-3b9d07a24f16"
XCP0, XCP3 = "3aff74a1-0000-1000-80a4-8f2c61d0e5b7-x0", "3aff74a1-3000-1000-80a4-8f2c61d0e5b7"
ALIASES = {"0000:05:00.0": GPU0, "0000:26:00.0": GPU1}


def holding(name: str, resource: str, device_id: str) -> PodDevices:
    return PodDevices("ml", name, (ContainerDevices("main", (Device(resource, device_id),)),))


def test_a_whole_gpu_by_its_pci_address() -> None:
    match = match_gpus(
        [holding("train", "amd.com/gpu", "0000:26:00.0")],
        gpu_uuids={GPU0, GPU1},
        mig_uuids={},
        aliases=ALIASES,
    )
    assert match.allocations == (GpuAllocation(GPU1, None, "ml", "train", "main"),)
    assert match.unmatched == ()


def test_partitions_by_pci_address_and_platform_device_under_either_strategy() -> None:
    """On a CPX GPU the PCI address names partition 0, not the GPU."""
    partitions = {XCP0: GPU0, "0000:05:00.0": GPU0, XCP3: GPU0, "amdgpu_xcp_2": GPU0}
    pods = [
        holding("a", "amd.com/gpu", "0000:05:00.0"),
        holding("b", "amd.com/cpx_nps4", "amdgpu_xcp_2"),
        holding("c", "amd.com/gpu", "amdgpu_xcp_9"),  # not this node's: reported, not held
    ]
    match = match_gpus(pods, gpu_uuids={GPU0, GPU1}, mig_uuids=partitions, aliases=ALIASES)
    assert match.allocations == (
        GpuAllocation(GPU0, "0000:05:00.0", "ml", "a", "main"),
        GpuAllocation(GPU0, "amdgpu_xcp_2", "ml", "b", "main"),
    )
    assert [m.pod for m in match.unmatched] == ["c"]


def test_other_vendors_resources_and_renamed_ones_are_not_gpus_unless_named() -> None:
    pods = [holding("x", "amd.com/fpga", "0000:05:00.0")]
    match = match_gpus(pods, gpu_uuids={GPU0}, mig_uuids={}, aliases=ALIASES)
    assert match.allocations == () and match.unmatched == ()

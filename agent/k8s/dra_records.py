"""Immutable records of the `dra` collector: which GPU each container got through Dynamic
Resource Allocation (`resource.k8s.io` v1, v1beta2 or v1beta1), from the claims' allocation
results and the driver's ResourceSlices. Kept apart from the watches (I/O) so that the
attribution stage imports only data."""

from __future__ import annotations

from dataclasses import dataclass

# NVIDIA's DRA driver (k8s-dra-driver-gpu) publishes its GPUs and MIG devices as driver
# `gpu.nvidia.com`; its ComputeDomain driver (compute-domain.nvidia.com) publishes IMEX
# channels and daemons, which are not GPUs.
DEFAULT_DRA_DRIVERS: tuple[str, ...] = ("gpu.nvidia.com",)


@dataclass(frozen=True, slots=True)
class DraAllocation:
    """One device of a claim, given to one container of a pod on this node.

    `device_uuid` is the device's `uuid` attribute in its ResourceSlice: a GPU UUID
    (`GPU-...`, device `type` "gpu") or a MIG device's (`MIG-...`, type "mig", with its
    GPU in `parent_uuid`); "" for a device published without one (NVIDIA's dynamic MIG
    devices), which counts for the GPU in `parent_uuid` (its `parentUUID` attribute, or the
    whole GPU whose counter set it consumes from). `claim` is the ResourceClaim's name (in
    the pod's namespace), the generated one for a claim made from a ResourceClaimTemplate.
    """

    namespace: str
    pod: str
    container: str
    claim: str
    request: str
    driver: str
    pool: str
    device: str
    device_uuid: str
    device_type: str = ""
    parent_uuid: str = ""


@dataclass(frozen=True, slots=True)
class DraSnapshot:
    """Every DRA GPU allocation of this node's pods, and why any other was left out.

    `unresolved` holds one line per allocated device that could not be named (its slice
    gives it neither a `uuid` nor a GPU to place it on, or no slice of this node publishes
    it): the attribution stage logs
    each once and leaves that device unattributed.
    """

    allocations: tuple[DraAllocation, ...] = ()
    unresolved: tuple[str, ...] = ()

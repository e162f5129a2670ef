"""NVML field ids gpuscope reads, and the one batched request per device built from them.

Field ids are from nvml.h (NVML_FI_DEV_*). NVLink fields are scoped by link index, which is
how NVML exposes links beyond the twelve that have per-lane field ids (H100 has 18).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

MEMORY_TEMP = 82
NVLINK_LINK_COUNT = 91
PCIE_COUNT_TX_BYTES = 197
PCIE_COUNT_RX_BYTES = 198
NVLINK_THROUGHPUT_DATA_TX = 138  # KiB, cumulative, scope = link
NVLINK_THROUGHPUT_DATA_RX = 139
NVLINK_ERROR_DL_REPLAY = 161
NVLINK_ERROR_DL_RECOVERY = 162
NVLINK_ERROR_DL_CRC = 163  # flit CRC
NVLINK_GET_STATE = 165
# NVLink5 (Blackwell and later): nvml.h marks 161-163 "unsupported for Blackwell+" and points
# to these, scoped by link like the others (from R560).
NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL = 213
NVLINK_COUNT_LINK_RECOVERY_FAILED = 214
# What the driver asks for to bring the GPU back (R570+; XID 154 announces a change).
# Replaces 226/227 (reset status, drain and reset status), deprecated from R570.
GPU_RECOVERY_ACTION = 230
# NVML_GPU_RECOVERY_ACTION_*: 0-4 mean the same in every header that has the field (R570,
# R575, R580); 5 and above do not (R580's 13.580.65 names 5 GPU_RESET_BUS, later headers
# RECOVER_IMEX_DOMAIN, with 6 BUS_RESET and 7 SYSTEM_REBOOT): exported as "unknown", with
# the code as the value.
RECOVERY_ACTIONS = ("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset")


def recovery_action_name(code: int) -> str:
    return RECOVERY_ACTIONS[code] if 0 <= code < len(RECOVERY_ACTIONS) else "unknown"


# NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L<n>: only links 0-11 have one.
_CRC_DATA_PER_LINK = (39, 40, 41, 42, 43, 44, 102, 103, 104, 105, 106, 107)

NVLINK_ERROR_KINDS = ("crc_flit", "crc_data", "replay", "recovery", "recovery_failed")
# The error fields per NVLink generation: (kind, field id), each scoped by link.
_LINK_ERRORS_NVLINK4 = (
    ("crc_flit", NVLINK_ERROR_DL_CRC),
    ("replay", NVLINK_ERROR_DL_REPLAY),
    ("recovery", NVLINK_ERROR_DL_RECOVERY),
)
_LINK_ERRORS_NVLINK5 = (
    ("recovery", NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL),
    ("recovery_failed", NVLINK_COUNT_LINK_RECOVERY_FAILED),
)

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class FieldRequest:
    """One device's batched field request: the (field id, scope id) pairs NVML is asked for, and
    the key each value is filed under."""

    keys: tuple[Key, ...]
    ids: tuple[tuple[int, int], ...]  # (field id, scope id) in the same order as keys


@lru_cache(maxsize=32)
def device_fields(nvlink_count: int, *, nvlink5: bool = False) -> FieldRequest:
    """The fields read from a device with `nvlink_count` links, built once per link count
    and NVLink generation: Blackwell's links (`nvlink5`) count errors in other fields."""
    link_errors = _LINK_ERRORS_NVLINK5 if nvlink5 else _LINK_ERRORS_NVLINK4
    pairs: list[tuple[Key, tuple[int, int]]] = [
        (("memory_temp", 0), (MEMORY_TEMP, 0)),
        (("pcie_tx", 0), (PCIE_COUNT_TX_BYTES, 0)),
        (("pcie_rx", 0), (PCIE_COUNT_RX_BYTES, 0)),
        (("recovery_action", 0), (GPU_RECOVERY_ACTION, 0)),
    ]
    for link in range(nvlink_count):
        pairs += [
            (("nvlink_state", link), (NVLINK_GET_STATE, link)),
            (("nvlink_tx", link), (NVLINK_THROUGHPUT_DATA_TX, link)),
            (("nvlink_rx", link), (NVLINK_THROUGHPUT_DATA_RX, link)),
            *((("nvlink_" + kind, link), (field, link)) for kind, field in link_errors),
        ]
        if link < len(_CRC_DATA_PER_LINK):
            pairs.append((("nvlink_crc_data", link), (_CRC_DATA_PER_LINK[link], 0)))
    return FieldRequest(keys=tuple(k for k, _ in pairs), ids=tuple(i for _, i in pairs))

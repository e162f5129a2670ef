"""The GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, field 230, driver R570+):
what the driver requires to bring a GPU back, announced by XID 154. Exported as
`gpuscope_gpu_recovery_action_info{action, code}`; absent where the
driver predates the field. The GPURecoveryActionRequired alert reads it."""

from __future__ import annotations

import pytest

from tests.support import wait_for


def actions(h, gpu: str) -> dict[str, str]:
    """{action: code} of one GPU (one series, value 1)."""
    h.clock.advance(2)  # past --collection-max-age
    found = h.scrape().series("gpuscope_gpu_recovery_action_info", gpu=gpu)
    assert set(found.values()) <= {1}
    return {dict(labels)["action"]: dict(labels)["code"] for labels in found}


def xids(h, gpu: str) -> dict[str, float]:
    h.clock.advance(2)
    return dict(h.scrape().by_label("gpuscope_gpu_xid_errors_total", "xid", gpu=gpu))


def test_none_until_the_driver_asks_then_the_action_and_its_xid(inprocess) -> None:
    h = inprocess("gb200-nvl")  # driver 570
    gpus = {dict(k)["gpu"] for k in h.scrape().series("gpuscope_gpu_up")}
    assert len(gpus) > 1
    assert all(actions(h, g) == {"none": "0"} for g in gpus)

    h.fake.set_recovery_action(1, 4)  # NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    wait_for(lambda: xids(h, "1") == {"154": 1}, what="XID 154 counted")
    assert actions(h, "1") == {"drain_and_reset": "4"}
    assert actions(h, "0") == {"none": "0"}

    h.fake.set_recovery_action(1, 6)  # a code whose name differs between driver headers
    assert actions(h, "1") == {"unknown": "6"}
    h.fake.set_recovery_action(1, 0)  # recovered
    assert actions(h, "1") == {"none": "0"}


def test_absent_before_r570(inprocess) -> None:
    h = inprocess("dgx-h100")  # driver 550
    metrics = h.scrape()
    assert metrics.series("gpuscope_gpu_up")
    assert not metrics.series("gpuscope_gpu_recovery_action_info")
    with pytest.raises(ValueError, match="no recovery action"):
        h.fake.set_recovery_action(0, 1)

"""XIDs are counted from NVML's event stream one by one: none lost, none counted twice."""

from __future__ import annotations

import time

from tests.support import wait_for


def xids(h, gpu: str) -> dict[str, float]:
    """One scrape's XID counts; scrapes are seconds apart (the agent reuses a collection
    younger than --collection-max-age)."""
    h.clock.advance(2)
    return dict(h.scrape().by_label("gpuscope_gpu_xid_errors_total", "xid", gpu=gpu))


def test_several_xids_between_two_scrapes_are_all_counted(inprocess) -> None:
    h = inprocess("dgx-h100")
    assert xids(h, "2") == {}

    h.fake.inject_xid(2, 48)
    h.fake.inject_xid(2, 48)
    h.fake.inject_xid(2, 94)
    h.fake.inject_xid(5, 79)
    wait_for(lambda: sum(xids(h, "2").values()) == 3 and xids(h, "5"), what="XIDs counted")

    assert xids(h, "2") == {"48": 2, "94": 1}
    assert xids(h, "5") == {"79": 1}
    assert xids(h, "0") == {}


def test_an_xid_is_never_counted_twice(inprocess) -> None:
    h = inprocess("dgx-h100")
    h.fake.inject_xid(1, 63)
    wait_for(lambda: xids(h, "1") == {"63": 1}, what="first XID")
    time.sleep(0.3)  # several event waits and scrapes later
    for _ in range(3):
        assert xids(h, "1") == {"63": 1}

    h.fake.inject_xid(1, 63)
    wait_for(lambda: xids(h, "1") == {"63": 2}, what="second XID")
    time.sleep(0.2)
    assert xids(h, "1") == {"63": 2}

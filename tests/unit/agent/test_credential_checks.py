"""The bcrypt queue: wrong passwords, from one address or many, never starve a right one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from gpuscope.agent.serve.credential_checks import CredentialChecks, Verdict, client_key


class Recorder:
    """Checks that answer a fixed verdict and record the order in which they ran; the
    first one can be held, so that everything submitted meanwhile queues up."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.verdicts: dict[str, Verdict] = {}
        self.gate = threading.Event()
        self._held = threading.Event()
        self._finished = threading.Condition()

    def check(self, name: str, ok: bool, *, hold: bool = False) -> Callable[[], bool]:
        def run() -> bool:
            if hold:
                self._held.set()
                self.gate.wait(5)
            self.ran.append(name)
            return ok

        return run

    def done(self, name: str) -> Callable[[Verdict], None]:
        def record(verdict: Verdict) -> None:
            with self._finished:
                self.verdicts[name] = verdict
                self._finished.notify_all()

        return record

    def wait_held(self) -> None:
        assert self._held.wait(5), "the held check never started"

    def wait_for(self, count: int) -> None:
        with self._finished:
            assert self._finished.wait_for(lambda: len(self.verdicts) >= count, 5), self.verdicts


@pytest.fixture
def checks() -> Iterator[CredentialChecks]:
    queue = CredentialChecks(max_pending=8, max_per_client=4)
    queue.start()
    yield queue
    queue.stop()


def submit(
    checks: CredentialChecks, rec: Recorder, client: str, name: str, ok: bool, **kw: bool
) -> None:
    checks.submit(client, rec.check(name, ok, **kw), rec.done(name))


def history(checks: CredentialChecks, rec: Recorder, client: str, ok: bool, times: int) -> None:
    """Give `client` a record: `times` checks that passed or failed."""
    for i in range(times):
        submit(checks, rec, client, f"{client}-history-{i}", ok)
    expected = {f"{client}-history-{i}" for i in range(times)}
    with rec._finished:
        assert rec._finished.wait_for(lambda: expected <= rec.verdicts.keys(), 5)
    rec.ran.clear()


def test_a_right_password_from_a_new_address_is_checked_next_despite_a_flood(
    checks: CredentialChecks,
) -> None:
    rec = Recorder()
    for attacker in ("10.0.0.1", "10.0.0.2"):
        history(checks, rec, attacker, ok=False, times=1)
    submit(checks, rec, "10.0.0.1", "held", False, hold=True)
    rec.wait_held()
    for i in range(3):
        submit(checks, rec, "10.0.0.1", f"a1-{i}", False)
        submit(checks, rec, "10.0.0.2", f"a2-{i}", False)
    submit(checks, rec, "10.0.0.9", "scraper", True)
    rec.gate.set()
    rec.wait_for(2 + 1 + 6 + 1)
    assert rec.ran[:2] == ["held", "scraper"]
    assert rec.verdicts["scraper"] is Verdict.GOOD
    assert rec.verdicts["a1-0"] is Verdict.WRONG


def test_an_address_known_good_comes_before_a_new_one_and_among_equals_the_newest(
    checks: CredentialChecks,
) -> None:
    rec = Recorder()
    history(checks, rec, "10.0.0.5", ok=True, times=1)
    submit(checks, rec, "10.0.0.7", "held", True, hold=True)
    rec.wait_held()
    submit(checks, rec, "10.0.0.6", "new-1", True)
    submit(checks, rec, "10.0.0.8", "new-2", True)
    submit(checks, rec, "10.0.0.5", "known", True)
    rec.gate.set()
    rec.wait_for(1 + 4)
    assert rec.ran == ["held", "known", "new-2", "new-1"]


def test_one_address_may_have_only_a_few_checks_waiting(checks: CredentialChecks) -> None:
    rec = Recorder()
    submit(checks, rec, "10.0.0.1", "held", False, hold=True)
    rec.wait_held()
    for i in range(5):
        submit(checks, rec, "10.0.0.1", f"flood-{i}", False)
    assert rec.verdicts == {"flood-4": Verdict.BUSY}  # at once, not after the others
    submit(checks, rec, "10.0.0.2", "other", True)
    assert checks.pending() == 5
    rec.gate.set()
    rec.wait_for(1 + 5 + 1)
    assert rec.verdicts["other"] is Verdict.GOOD


def test_a_full_queue_makes_room_for_a_better_placed_check_only(checks: CredentialChecks) -> None:
    rec = Recorder()
    attackers = [f"10.0.1.{i}" for i in range(1, 5)]
    for n, attacker in enumerate(attackers):
        history(checks, rec, attacker, ok=False, times=1 + (n == 3))  # the last failed twice
    history(checks, rec, "10.0.1.5", ok=False, times=3)
    submit(checks, rec, "10.0.9.9", "held", False, hold=True)
    rec.wait_held()
    for attacker in attackers:
        for i in range(2):
            submit(checks, rec, attacker, f"{attacker}-{i}", False)
    assert checks.pending() == 8 and not rec.verdicts.keys() - _history_names(rec)
    submit(checks, rec, "10.0.1.5", "worse", False)  # more failures than any waiting: refused
    assert rec.verdicts["worse"] is Verdict.BUSY
    assert checks.pending() == 8
    submit(checks, rec, "10.0.2.1", "scraper", True)  # pushes out the worst: most failures,
    assert rec.verdicts["10.0.1.4-0"] is Verdict.BUSY  # and the older of two such
    assert checks.pending() == 8
    rec.gate.set()
    rec.wait_for(len(_history_names(rec)) + 1 + 8 + 2)
    assert rec.ran[:2] == ["held", "scraper"]
    assert rec.verdicts["scraper"] is Verdict.GOOD


def test_a_new_login_overtakes_a_flood_that_bcrypt_has_not_found_wrong_yet(
    checks: CredentialChecks,
) -> None:
    """A flood's first requests look like new scrapers. But each address is refused "busy"
    as soon as the queue is full, and its retries then place after a truly new client."""
    rec = Recorder()
    submit(checks, rec, "10.0.3.0", "held", False, hold=True)
    rec.wait_held()
    for i in range(1, 13):  # 12 first attempts from 12 addresses: 8 wait, 4 are refused
        submit(checks, rec, f"10.0.3.{i}", f"first-{i}", False)
    refused = sorted(name for name, verdict in rec.verdicts.items() if verdict is Verdict.BUSY)
    assert len(refused) == 4 and checks.pending() == 8
    for name in refused:  # their retries are refused again: placed after all that wait
        number = name.removeprefix("first-")
        submit(checks, rec, f"10.0.3.{number}", f"retry-{number}", False)
        assert rec.verdicts[f"retry-{number}"] is Verdict.BUSY
    submit(checks, rec, "10.0.4.1", "scraper", True)
    assert sum(v is Verdict.BUSY for v in rec.verdicts.values()) == 4 + 4 + 1
    rec.gate.set()
    rec.wait_for(1 + 12 + 4 + 1)
    assert rec.ran[:2] == ["held", "scraper"]


def _history_names(rec: Recorder) -> set[str]:
    return {name for name in rec.verdicts if "-history-" in name}


def test_a_success_clears_an_address_record_of_failures(checks: CredentialChecks) -> None:
    rec = Recorder()
    history(checks, rec, "10.0.0.1", ok=False, times=3)
    history(checks, rec, "10.0.0.1", ok=True, times=1)  # the scraper's own typo, then fixed
    history(checks, rec, "10.0.0.2", ok=False, times=1)
    submit(checks, rec, "10.0.0.3", "held", True, hold=True)
    rec.wait_held()
    submit(checks, rec, "10.0.0.2", "attacker", False)
    submit(checks, rec, "10.0.0.4", "new", True)
    submit(checks, rec, "10.0.0.1", "fixed", True)
    rec.gate.set()
    rec.wait_for(len(_history_names(rec)) + 4)
    assert rec.ran == ["held", "fixed", "new", "attacker"]


def test_a_check_that_raises_is_a_wrong_password_and_the_queue_goes_on(
    checks: CredentialChecks,
) -> None:
    rec = Recorder()

    def broken() -> bool:
        raise RuntimeError("bug")

    checks.submit("10.0.0.1", broken, rec.done("broken"))
    submit(checks, rec, "10.0.0.1", "after", True)
    rec.wait_for(2)
    assert rec.verdicts == {"broken": Verdict.WRONG, "after": Verdict.GOOD}


def test_after_stop_a_check_is_answered_busy_at_once() -> None:
    queue = CredentialChecks()
    queue.start()
    queue.stop()
    rec = Recorder()
    submit(queue, rec, "10.0.0.1", "late", True)
    assert rec.verdicts == {"late": Verdict.BUSY} and rec.ran == []


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        ("10.1.2.3", "10.1.2.3"),
        ("::ffff:10.1.2.3", "10.1.2.3"),  # a dual-stack socket's IPv4 client
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::7", "2001:db8:1:2::/64"),  # the same host's /64
        ("fe80::1%eth0", "fe80::/64"),
        ("?", "?"),
    ],
)
def test_checks_are_counted_per_ipv4_address_and_per_ipv6_64(peer: str, key: str) -> None:
    assert client_key(peer) == key

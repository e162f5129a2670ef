"""The queue of basic-auth credentials waiting for bcrypt, ordered so that wrong passwords
cannot starve right ones.

bcrypt costs 70-100 ms at cost 10 and runs one check at a time, so a few clients sending
wrong passwords in a loop can keep the queue full forever. Arrival order would then make a
right password wait behind every wrong one, and a plain bound would refuse it outright
(the 48-client flood of #21 answered every new correct login `503`). Instead each client
address earns a standing from what its earlier requests got:

- first, an address that passed a check before and has failed none since (a scraper whose
  remembered login was lost, e.g. its password changed);
- then addresses with no failure on record (a new scraper, a new Prometheus pod);
- then addresses whose checks failed, fewest failures first;
- within each, addresses refused "busy" fewer times first, and among equals the newest
  check first. A flood's first requests are as new as a new scraper's, but its retries
  after each `503` are not, so a fresh correct login overtakes them all, even in the
  seconds before bcrypt has found each flood address wrong.

The worker always takes the best-placed check. Each address may have at most
`max_per_client` checks waiting, and all addresses together `max_pending`; when the queue
is full, a newcomer placed better than the worst one waiting takes its place and that one
is answered "busy" (the server's `503` with `Retry-After`), otherwise the newcomer is. A
success clears the address's record. So a flood from any number of addresses delays a
right password by about the check in progress, and a flood from one address cannot fill
the queue. What is left: an attacker that rotates through more fresh addresses (IPv6
counts by /64, `client_key`) than `max_failing_addresses` remembers stays level with a new
scraper (an address already known good still comes first).
"""

from __future__ import annotations

import enum
import ipaddress
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["CredentialChecks", "Verdict", "client_key"]

log = logging.getLogger("gpuscope.server")


def client_key(address: str) -> str:
    """The client a check is counted against: its IPv4 address (also when it arrives
    IPv4-mapped on a dual-stack socket), or its IPv6 /64, which one host is usually given
    whole, so rotating through it earns no fresh standing."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class Verdict(enum.Enum):
    GOOD = "good"
    WRONG = "wrong"
    BUSY = "busy"  # not checked: the queue had no room for it


@dataclass(order=True)
class _Pending:
    """One credential check waiting for the worker. Entries compare by `rank` alone, so the
    best-placed check is the smallest (`min`) and the worst the largest."""

    # (standing, failures, refusals, -arrival): lower is served first, newest among equals
    rank: tuple[int, int, int, int]
    client: str = field(compare=False)
    check: Callable[[], bool] = field(compare=False)
    done: Callable[[Verdict], None] = field(compare=False)


class CredentialChecks:
    """One thread running credential checks (`submit`) in the order described above.

    `done` is called with the verdict once, from the worker thread, or from `submit`'s
    caller when the check is refused or pushed out: a caller on an event loop hands it to
    the loop (`call_soon_threadsafe`). Not started, or stopped, nothing is checked."""

    def __init__(
        self,
        *,
        max_pending: int = 32,
        max_per_client: int = 4,
        max_good_addresses: int = 256,
        max_failing_addresses: int = 1024,
    ) -> None:
        self.max_pending = max_pending
        self.max_per_client = max_per_client
        self._max_good = max_good_addresses
        self._max_failing = max_failing_addresses
        self._pending: list[_Pending] = []
        self._per_client: dict[str, int] = {}
        self._good: OrderedDict[str, None] = OrderedDict()
        self._record_of: OrderedDict[str, tuple[int, int]] = OrderedDict()  # failures, busy
        self._arrivals = itertools.count()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="http-auth", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread after the check in progress (at most a second's wait); checks
        still waiting get no verdict."""
        with self._cond:
            self._stopping = True
            self._pending.clear()
            self._per_client.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(1.0)

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def submit(
        self, client: str, check: Callable[[], bool], done: Callable[[Verdict], None]
    ) -> None:
        """Queue `check` (True: the credentials are right) for `client`'s address."""
        refused: _Pending | None = None
        with self._cond:
            entry = _Pending(self._rank(client), client, check, done)
            if self._stopping or self._per_client.get(client, 0) >= self.max_per_client:
                refused = entry
            elif len(self._pending) >= self.max_pending:
                worst = max(self._pending)
                if entry.rank < worst.rank:
                    self._pending.remove(worst)
                    self._leave(worst.client)
                    self._enter(entry)
                    refused = worst
                else:
                    refused = entry
            else:
                self._enter(entry)
            if refused is not None:
                self._note(refused.client, failed=False)
        if refused is not None:
            refused.done(Verdict.BUSY)

    def _rank(self, client: str) -> tuple[int, int, int, int]:
        failures, refusals = self._record_of.get(client, (0, 0))
        standing = 2 if failures else (0 if client in self._good else 1)
        return (standing, failures, refusals, -next(self._arrivals))

    def _enter(self, entry: _Pending) -> None:
        self._pending.append(entry)
        self._per_client[entry.client] = self._per_client.get(entry.client, 0) + 1
        self._cond.notify()

    def _leave(self, client: str) -> None:
        left = self._per_client[client] - 1
        if left:
            self._per_client[client] = left
        else:
            del self._per_client[client]

    def _take(self) -> _Pending | None:
        with self._cond:
            while not self._pending and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            entry = min(self._pending)
            self._pending.remove(entry)
            self._leave(entry.client)
            return entry

    def _note(self, client: str, *, failed: bool) -> None:
        """Count a failed check, or a refusal (`failed=False`), against `client`."""
        failures, refusals = self._record_of.get(client, (0, 0))
        self._record_of[client] = (failures + 1, refusals) if failed else (failures, refusals + 1)
        self._record_of.move_to_end(client)
        while len(self._record_of) > self._max_failing:
            self._record_of.popitem(last=False)

    def _record(self, client: str, ok: bool) -> None:
        with self._cond:
            if ok:
                self._record_of.pop(client, None)
                self._good[client] = None
                self._good.move_to_end(client)
                while len(self._good) > self._max_good:
                    self._good.popitem(last=False)
            else:
                self._note(client, failed=True)

    def _run(self) -> None:
        while (entry := self._take()) is not None:
            try:
                ok = entry.check()
            except Exception:  # a bug here must not end the thread: no check would run
                log.exception("http: a credential check failed")
                ok = False
            self._record(entry.client, ok)
            entry.done(Verdict.GOOD if ok else Verdict.WRONG)

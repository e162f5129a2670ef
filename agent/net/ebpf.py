"""The network probes' maps, read through bpf(2) from their pins (agent/bpf): what the
kernel has counted, per cgroup, as plain tuples for the net source."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from gpuscope.agent.bpf.layout import text
from gpuscope.agent.bpf.maps import PinnedFamily
from gpuscope.agent.net.bpf_program import MAP_INDEX
from gpuscope.agent.net.probes import RETIRED_TRAFFIC
from gpuscope.agent.net.records import RTT_SLOTS


@dataclass(frozen=True, slots=True)
class RawCounters:
    """Map contents, summed over nothing: the kernel's own monotonic values per key."""

    traffic: dict[tuple[int, int, int], tuple[int, int]]  # (cgroup, proto, dir) -> (bytes, calls)
    tcp: dict[
        int, tuple[int, int, int, int, int]
    ]  # cgroup -> opened, closed, retrans, rtt sum µs, n
    rtt: dict[tuple[int, int], int]  # (cgroup, slot) -> samples
    map_full: dict[str, int]

    def cgroups(self) -> set[int]:
        return {k[0] for k in self.traffic} | set(self.tcp) | {k[0] for k in self.rtt}


@dataclass(frozen=True, slots=True)
class RetiredTotals:
    """One pod's sums from cgroups that are gone, as the retired map keeps them."""

    pod_uid: str
    container_id: str
    bytes: dict[tuple[str, str], int]  # (protocol, direction) -> bytes
    calls: dict[tuple[str, str], int]
    retransmits: int
    opened: int
    closed: int
    rtt_sum_us: int
    rtt_count: int
    rtt_slots: tuple[int, ...]


class NetMaps:
    """The pinned maps of the network probes. Not thread-safe: the runner serializes
    collections."""

    def __init__(self, pinned: PinnedFamily) -> None:
        self.pinned = pinned
        self.modes: dict[str, str] = dict(pinned.manifest.get("modes", {}))
        self._sockets_count = 0
        self._sockets_counted_at: float | None = None

    def read(self) -> RawCounters:
        maps = self.pinned
        # Keys and values are ints already (struct); the layouts fix their order.
        traffic = {k: v for k, v in maps["traffic"].entries()}
        tcp = {k[0]: v for k, v in maps["tcp"].entries()}
        rtt: dict[tuple[int, int], int] = {}
        if "rtt" in maps:
            rtt = {k: v[0] for k, v in maps["rtt"].entries()}
        full = {k[0]: v[0] for k, v in maps["map_full"].entries()}
        map_full = {name: full.get(i, 0) for i, name in enumerate(MAP_INDEX)}
        return RawCounters(traffic=traffic, tcp=tcp, rtt=rtt, map_full=map_full)

    def map_entries(self, raw: RawCounters) -> dict[str, int]:
        """Entries per map: from what `read` returned, and for the socket map (which can hold
        hundreds of thousands of entries nobody needs to see) a count refreshed once a minute."""
        out = {"traffic": len(raw.traffic), "tcp": len(raw.tcp)}
        if "sockets" in self.pinned:
            now = time.monotonic()
            if self._sockets_counted_at is None or now - self._sockets_counted_at >= 60:
                self._sockets_count = self.pinned["sockets"].count()
                self._sockets_counted_at = now
            out["sockets"] = self._sockets_count
        if "rtt" in self.pinned:
            out["rtt"] = len(raw.rtt)
        return out

    def map_max_entries(self) -> dict[str, int]:
        return {
            name: self.pinned[name].max_entries
            for name in ("traffic", "tcp", "sockets", "rtt")
            if name in self.pinned
        }

    def delete_cgroups(self, cgroups: Iterable[int]) -> None:
        """Remove every entry of these cgroups (they no longer exist)."""
        gone = set(cgroups)
        if not gone:
            return
        for name in ("traffic", "tcp", "rtt"):
            if name not in self.pinned:
                continue
            table = self.pinned[name]
            for key, _ in table.entries():
                if int(key[0]) in gone:
                    table.delete(key)  # False: raced with another deletion

    def retired(self) -> list[RetiredTotals]:
        out = []
        for key, value in self.pinned["retired"].entries():
            n = len(RETIRED_TRAFFIC)
            values = [int(x) for x in value]
            out.append(
                RetiredTotals(
                    pod_uid=text(key[0]),
                    container_id=text(key[1]),
                    bytes=dict(zip(RETIRED_TRAFFIC, values[:n], strict=True)),
                    calls=dict(zip(RETIRED_TRAFFIC, values[n : 2 * n], strict=True)),
                    retransmits=values[2 * n],
                    opened=values[2 * n + 1],
                    closed=values[2 * n + 2],
                    rtt_sum_us=values[2 * n + 3],
                    rtt_count=values[2 * n + 4],
                    rtt_slots=tuple(values[2 * n + 5 : 2 * n + 5 + RTT_SLOTS]),
                )
            )
        return out

    def put_retired(self, totals: RetiredTotals) -> None:
        key = (totals.pod_uid.encode(), totals.container_id.encode())
        self.pinned["retired"].put(
            key,
            (
                *(totals.bytes.get(pd, 0) for pd in RETIRED_TRAFFIC),
                *(totals.calls.get(pd, 0) for pd in RETIRED_TRAFFIC),
                totals.retransmits,
                totals.opened,
                totals.closed,
                totals.rtt_sum_us,
                totals.rtt_count,
                *totals.rtt_slots,
            ),
        )

    def delete_retired(self, pod_uid: str, container_id: str) -> None:
        self.pinned["retired"].delete((pod_uid.encode(), container_id.encode()))

    def close(self) -> None:
        """Close the maps; the pins, and so the programs and counts, stay."""
        self.pinned.close()

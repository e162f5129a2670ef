"""The network probes' maps, read through bpf(2) from their pins (agent/bpf): what the
kernel has counted, per cgroup, as plain tuples for the net source."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.agent.bpf.layout import text
from gpuscope.agent.net.bpf_program import MAP_INDEX

if TYPE_CHECKING:
    from gpuscope.agent.bpf.maps import PinnedFamily


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

    def delete_cgroups(self, raw: RawCounters, cgroups: Iterable[int]) -> None:
        """Remove these cgroups' entries (they no longer exist): the keys `read` returned,
        so nothing is read again."""
        gone = set(cgroups)
        if not gone:
            return
        for name, keys in (
            ("traffic", [k for k in raw.traffic if k[0] in gone]),
            ("tcp", [(k,) for k in raw.tcp if k in gone]),
            ("rtt", [k for k in raw.rtt if k[0] in gone]),
        ):
            if name in self.pinned:
                for key in keys:
                    self.pinned[name].delete(key)  # False: raced with another deletion

    def retired(self) -> dict[tuple[str, str], tuple[int, ...]]:
        """The retired map: (pod uid, container id) -> a row in `probes.RETIRED`'s order."""
        return {(text(k[0]), text(k[1])): v for k, v in self.pinned["retired"].entries()}

    def put_retired(self, key: tuple[str, str], row: tuple[int, ...]) -> None:
        self.pinned["retired"].put((key[0].encode(), key[1].encode()), row)

    def delete_retired(self, pod_uid: str, container_id: str) -> None:
        self.pinned["retired"].delete((pod_uid.encode(), container_id.encode()))

    def close(self) -> None:
        """Close the maps; the pins, and so the programs and counts, stay."""
        self.pinned.close()

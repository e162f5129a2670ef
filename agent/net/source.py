"""The network source: eBPF counters keyed by cgroup id -> per-pod records.

The kernel never resets its counters and user space never resets the kernel's: a pod's
counters are sums over its cgroups' kernel values. When a cgroup disappears (a container
exits), its entries are deleted from the maps after a grace period and its last values
move to a per-pod "retired" total, so the pod's counters stay monotonic. When every cgroup
of a pod is gone, the pod's series disappear. Cgroups that belong to no pod (system
services, the root, sockets whose owner was never seen) are summed into one host set with
`pod_uid=""`: never one series per host cgroup.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gpuscope.agent.bpf.pins import DEFAULT_PIN_ROOT
from gpuscope.agent.bpf.session import open_family
from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.k8s.cgroups import CgroupResolver, detect_cgroup_v2_root
from gpuscope.agent.net.bpf_program import MapLimits
from gpuscope.agent.net.ebpf import NetMaps, RawCounters
from gpuscope.agent.net.probes import RETIRED_TRAFFIC, NetFamily
from gpuscope.agent.net.records import (
    DIRECTIONS,
    PROTOCOLS,
    RTT_SLOTS,
    NetSnapshot,
    PodNetwork,
)
from gpuscope.agent.runtime.sources import SourceUnavailable

log = logging.getLogger("gpuscope.net")

HOST = ("", "")
UNATTRIBUTED = 0  # cgroup id the probes use for sockets whose owner they never saw

Key = tuple[str, str]  # (pod_uid, container_id)


@dataclass(frozen=True, slots=True)
class NetConfig:
    """The net source's settings, made from the flags by `net_config` (agent/net/collector.py);
    `helper_args` hands the same to `gpuscope bpf-load`."""

    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    cgroup_root: Path | None = None  # None: detect under <sysfs>/fs/cgroup
    per_container: bool = False
    prune_grace: float = 60.0
    traffic_mode: str = "auto"  # auto | tracepoint | cgroup_skb
    limits: MapLimits = field(default_factory=MapLimits)
    modules_dir: Path = Path("/lib/modules")
    fallback_headers: Path = Path("/usr/src/gpuscope-kernel-headers")
    pin_root: Path = DEFAULT_PIN_ROOT
    run_helper: bool = True  # no pins for this program: run `gpuscope bpf-load` as a child

    def cgroup_v2_root(self) -> Path:
        """--cgroup-root, or the v2 hierarchy detected under <sysfs>/fs/cgroup (or unified/)."""
        found = self.cgroup_root or detect_cgroup_v2_root(self.sysfs / "fs" / "cgroup")
        if found is None:
            raise SourceUnavailable(
                f"no cgroup v2 hierarchy under {self.sysfs / 'fs' / 'cgroup'} (nor unified/)"
            )
        return found

    def family(self, cgroup_root: Path) -> NetFamily:
        return NetFamily(self.traffic_mode, self.limits, cgroup_root)

    def helper_args(self, cgroup_root: Path) -> list[str]:
        """The bpf-load flags that load exactly this configuration's probes."""
        return [
            f"--net-traffic-mode={self.traffic_mode}",
            f"--bpf-max-cgroups={self.limits.cgroups}",
            f"--bpf-max-sockets={self.limits.sockets}",
            f"--kernel-modules={self.modules_dir}",
            f"--kernel-headers={self.fallback_headers}",
            f"--bpf-pin-root={self.pin_root}",
            f"--procfs={self.procfs}",
            f"--sysfs={self.sysfs}",
            f"--cgroup-root={cgroup_root}",
            "--log-level=warning",
        ]


@dataclass
class _Totals:
    """Mutable running sums for one pod (user space only)."""

    bytes: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    retransmits: int = 0
    opened: int = 0
    closed: int = 0
    rtt_slots: list[int] = field(default_factory=lambda: [0] * RTT_SLOTS)
    rtt_sum_us: int = 0
    rtt_count: int = 0

    def add(self, other: _Totals) -> None:
        for k, v in other.bytes.items():
            self.bytes[k] += v
        for k, v in other.calls.items():
            self.calls[k] += v
        self.retransmits += other.retransmits
        self.opened += other.opened
        self.closed += other.closed
        self.rtt_sum_us += other.rtt_sum_us
        self.rtt_count += other.rtt_count
        self.rtt_slots = [a + b for a, b in zip(self.rtt_slots, other.rtt_slots, strict=True)]

    def merged(self, other: _Totals) -> _Totals:
        out = _Totals()
        out.add(self)
        out.add(other)
        return out

    @classmethod
    def from_row(cls, row: tuple[int, ...]) -> _Totals:
        """Totals from a row of the retired map (`probes.RETIRED`'s field order)."""
        n = len(RETIRED_TRAFFIC)
        out = cls()
        for pair, nbytes, ncalls in zip(RETIRED_TRAFFIC, row[:n], row[n : 2 * n], strict=True):
            if nbytes or ncalls:  # a pod's record has only the protocols it used
                out.bytes[pair], out.calls[pair] = nbytes, ncalls
        out.retransmits, out.opened, out.closed, out.rtt_sum_us, out.rtt_count = row[2 * n :][:5]
        out.rtt_slots = list(row[2 * n + 5 :][:RTT_SLOTS])
        return out

    def row(self) -> tuple[int, ...]:
        """These totals as a row of the retired map."""
        return (
            *(self.bytes.get(pair, 0) for pair in RETIRED_TRAFFIC),
            *(self.calls.get(pair, 0) for pair in RETIRED_TRAFFIC),
            self.retransmits,
            self.opened,
            self.closed,
            self.rtt_sum_us,
            self.rtt_count,
            *self.rtt_slots,
        )

    def record(self, key: Key) -> PodNetwork:
        def by_proto(table: dict[tuple[str, str], int], direction: str) -> dict[str, int]:
            return {p: table[(p, d)] for (p, d) in sorted(table) if d == direction}

        return PodNetwork(
            pod_uid=key[0],
            container_id=key[1],
            transmit_bytes=by_proto(self.bytes, "transmit"),
            receive_bytes=by_proto(self.bytes, "receive"),
            transmit_calls=by_proto(self.calls, "transmit"),
            receive_calls=by_proto(self.calls, "receive"),
            tcp_retransmits=self.retransmits,
            connections_opened=self.opened,
            connections_closed=self.closed,
            rtt_slots=tuple(self.rtt_slots),
            rtt_sum_seconds=self.rtt_sum_us / 1e6,
            rtt_count=self.rtt_count,
        )


def by_cgroup(raw: RawCounters) -> dict[int, _Totals]:
    """One pass over each map's entries, grouped by cgroup id."""
    out: dict[int, _Totals] = defaultdict(_Totals)
    for (cgroup, proto, direction), (nbytes, ncalls) in raw.traffic.items():
        totals = out[cgroup]
        key = (PROTOCOLS[proto], DIRECTIONS[direction])
        totals.bytes[key] += nbytes
        totals.calls[key] += ncalls
    for cgroup, (opened, closed, retransmits, rtt_sum_us, rtt_count) in raw.tcp.items():
        totals = out[cgroup]
        totals.opened += opened
        totals.closed += closed
        totals.retransmits += retransmits
        totals.rtt_sum_us += rtt_sum_us
        totals.rtt_count += rtt_count
    for (cgroup, slot), count in raw.rtt.items():
        if 0 <= slot < RTT_SLOTS:
            out[cgroup].rtt_slots[slot] += count
    return out


class NetSource:
    name = "net"

    def __init__(self, config: NetConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config or NetConfig()
        self.clock = clock or SystemClock()
        self.probes: NetMaps | None = None
        self.resolver: CgroupResolver | None = None
        self._keys: dict[int, Key] = {}
        self._missing_since: dict[int, float] = {}
        self._retired: dict[Key, _Totals] = {}
        self._root_id: int | None = None

    def start(self) -> None:
        cfg = self.config
        root = cfg.cgroup_v2_root()
        family = cfg.family(root)
        pinned = open_family(
            family,
            cfg.pin_root,
            helper_args=cfg.helper_args(root) if cfg.run_helper else None,
        )
        probes = NetMaps(pinned)
        resolver = CgroupResolver(root, monotonic=self.clock.monotonic)
        try:
            self._retired = self._restore(probes, resolver)
        except Exception:
            probes.close()
            raise
        self.probes = probes
        self.resolver = resolver
        self._root_id = root.stat().st_ino
        log.info(
            "eBPF probes pinned at %s (loaded %s): %s; cgroup v2 root %s",
            pinned.directory,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(pinned.manifest.get("loaded_at", 0))),
            ", ".join(f"{k}={v}" for k, v in probes.modes.items()),
            root,
        )

    @staticmethod
    def _restore(probes: NetMaps, resolver: CgroupResolver) -> dict[Key, _Totals]:
        """What the agent had retired before it restarted, kept in the kernel beside the live
        counts so that a pod's counters continue across the restart; less the pods that
        went while the agent was down."""
        saved = probes.retired()
        if not saved:
            return {}
        present = resolver.pod_uids()
        out: dict[Key, _Totals] = {}
        for key, row in saved.items():
            if key == HOST or key[0] in present:
                out[key] = _Totals.from_row(row)
            else:
                probes.delete_retired(*key)
        return out

    def read(self) -> NetSnapshot:
        probes, resolver = self.probes, self.resolver
        if probes is None or resolver is None:
            raise SourceUnavailable("eBPF probes are not loaded")
        raw = probes.read()
        raw = self._prune(raw)

        live: dict[Key, _Totals] = defaultdict(_Totals)
        for cgroup, totals in by_cgroup(raw).items():
            key = self._key(cgroup)
            if key is not None:  # not resolvable yet: reported once its owner is known
                live[key].add(totals)
        pods = []
        for key in sorted(set(live) | set(self._retired)):
            totals = live.get(key, _Totals())
            retired = self._retired.get(key)
            pods.append((totals.merged(retired) if retired else totals).record(key))
        return NetSnapshot(
            pods=tuple(pods),
            probes=probes.modes,
            map_full=raw.map_full,
            map_entries=probes.map_entries(raw),
            map_max_entries=probes.map_max_entries(),
        )

    def _key(self, cgroup: int) -> Key | None:
        """Whose traffic this cgroup's is; None while its path is unknown.

        A cgroup created since the last walk of the hierarchy is not resolvable yet. Its
        counts are held back rather than put on the host for a scrape and then moved to the
        pod, which would make the host's counters go backwards.
        """
        cached = self._keys.get(cgroup)
        if cached is not None:
            return cached
        assert self.resolver is not None
        if cgroup in (UNATTRIBUTED, self._root_id):
            return HOST
        if self.resolver.resolve(cgroup) is None:
            return None
        pod = self.resolver.resolve_pod(cgroup)
        if pod is None:
            key = HOST
        else:
            container = (pod.container_id or "") if self.config.per_container else ""
            key = (pod.pod_uid, container)
        self._keys[cgroup] = key
        return key

    def _prune(self, raw: RawCounters) -> RawCounters:
        """Retire and delete the entries of cgroups gone for longer than the grace period."""
        assert self.probes is not None and self.resolver is not None
        now = self.clock.monotonic()
        present = raw.cgroups() - {UNATTRIBUTED, self._root_id}
        for cgroup in present:
            if self.resolver.exists(cgroup):
                self._missing_since.pop(cgroup, None)
            else:
                self._missing_since.setdefault(cgroup, now)
        for cgroup in list(self._missing_since):
            if cgroup not in present:
                del self._missing_since[cgroup]
        expired = {
            c for c, since in self._missing_since.items() if now - since >= self.config.prune_grace
        }
        if not expired:
            return raw
        grouped = by_cgroup(raw)
        changed: set[Key] = set()
        for cgroup in expired:
            key = self._key(cgroup) or HOST  # never resolved: it lived and died between walks
            self._retired.setdefault(key, _Totals()).add(grouped[cgroup])
            changed.add(key)
        # Saved before the live entries go: a restart in between counts them twice at worst
        # for one scrape, never loses them.
        for key in changed:
            self.probes.put_retired(key, self._retired[key].row())
        self.probes.delete_cgroups(raw, expired)
        remaining = RawCounters(
            traffic={k: v for k, v in raw.traffic.items() if k[0] not in expired},
            tcp={k: v for k, v in raw.tcp.items() if k not in expired},
            rtt={k: v for k, v in raw.rtt.items() if k[0] not in expired},
            map_full=raw.map_full,
        )
        for cgroup in expired:
            self._missing_since.pop(cgroup, None)
            self._keys.pop(cgroup, None)
        still_live = {self._keys.get(c) for c in remaining.cgroups()}
        for key in list(self._retired):
            if key != HOST and key not in still_live:
                del self._retired[key]  # the whole pod is gone: its series go too
                self.probes.delete_retired(*key)
        log.debug("pruned %d cgroups that no longer exist", len(expired))
        return remaining

    def stop(self) -> None:
        if self.probes is not None:
            self.probes.close()
            self.probes = None

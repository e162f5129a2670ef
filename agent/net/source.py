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
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.k8s.cgroups import CgroupResolver, detect_cgroup_v2_root
from gpuscope.agent.net.bpf_program import MapLimits
from gpuscope.agent.net.ebpf import BpfProbes, RawCounters, check_host, import_bcc, plan_probes
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
    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    cgroup_root: Path | None = None  # None: detect under <sysfs>/fs/cgroup
    per_container: bool = False
    prune_grace: float = 60.0
    traffic_mode: str = "auto"  # auto | tracepoint | cgroup_skb
    limits: MapLimits = field(default_factory=MapLimits)
    modules_dir: Path = Path("/lib/modules")
    fallback_headers: Path = Path("/usr/src/gpuscope-kernel-headers")


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
        self.probes: BpfProbes | None = None
        self.resolver: CgroupResolver | None = None
        self._keys: dict[int, Key] = {}
        self._missing_since: dict[int, float] = {}
        self._retired: dict[Key, _Totals] = {}
        self._root_id: int | None = None

    def start(self) -> None:
        cfg = self.config
        root = cfg.cgroup_root or detect_cgroup_v2_root(cfg.sysfs / "fs" / "cgroup")
        if root is None:
            raise SourceUnavailable(
                f"no cgroup v2 hierarchy under {cfg.sysfs / 'fs' / 'cgroup'} (nor unified/)"
            )
        tracefs, headers = check_host(
            traffic_mode=cfg.traffic_mode,
            modules_dir=cfg.modules_dir,
            fallback_headers=cfg.fallback_headers,
            procfs=cfg.procfs,
        )
        import_bcc()
        plan = plan_probes(tracefs, cfg.traffic_mode)
        probes = BpfProbes(plan, cfg.limits)
        probes.load(headers, root)
        self.probes = probes
        self.resolver = CgroupResolver(root, monotonic=self.clock.monotonic)
        self._root_id = root.stat().st_ino
        log.info(
            "eBPF probes loaded (kernel headers %s, from %s): %s; cgroup v2 root %s",
            headers.path,
            headers.how,
            ", ".join(f"{k}={v}" for k, v in plan.modes().items()),
            root,
        )

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
            probes=probes.plan.modes(),
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
        for cgroup in expired:
            key = self._key(cgroup) or HOST  # never resolved: it lived and died between walks
            self._retired.setdefault(key, _Totals()).add(grouped[cgroup])
        self.probes.delete_cgroups(expired)
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
        log.debug("pruned %d cgroups that no longer exist", len(expired))
        return remaining

    def stop(self) -> None:
        if self.probes is not None:
            self.probes.close()
            self.probes = None

"""Loading gpuscope's eBPF programs with bcc and reading their maps.

bcc is imported only here, and only when the network source starts, so a GPU-only agent
never pays for libbcc's LLVM (about 85 MB of mappings).

Before compiling anything, `check_host` tells which prerequisite is missing (bcc bindings,
tracefs, a capability, a kernel header tree), because bcc's own errors ("Failed to compile
BPF module <text>") do not tell an operator what to fix.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscope.agent.net.bpf_program import MAP_INDEX, MapLimits, ProbePlan, program_text
from gpuscope.agent.net.compiler_pages import release_compiler_pages
from gpuscope.agent.runtime.sources import SourceUnavailable

log = logging.getLogger("gpuscope.net.bpf")

TRACEFS_CANDIDATES = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


@dataclass(frozen=True, slots=True)
class HeaderTree:
    path: Path
    how: str  # "BCC_KERNEL_SOURCE" | "modules" | "fallback"


def effective_capabilities(procfs: Path = Path("/proc")) -> int:
    for line in (procfs / "self" / "status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def missing_capabilities(caps: int, *, attach_cgroup: bool) -> list[str]:
    """The capabilities loading the probes needs and this process lacks (names)."""

    def has(cap: int) -> bool:
        return bool(caps >> cap & 1)

    if has(CAP_SYS_ADMIN):
        return []
    missing = [
        name for cap, name in ((CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")) if not has(cap)
    ]
    if attach_cgroup and not has(CAP_NET_ADMIN):
        missing.append("CAP_NET_ADMIN")
    return missing


def tracefs_root() -> Path | None:
    for candidate in TRACEFS_CANDIDATES:
        if (candidate / "events").is_dir():
            return candidate
    return None


def tracepoint_fields(tracefs: Path, category: str, event: str) -> set[str] | None:
    """Argument names of a tracepoint from its tracefs format file; None if it does not exist."""
    try:
        text = (tracefs / "events" / category / event / "format").read_text()
    except OSError:
        return None
    names: set[str] = set()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("field:"):
            decl = line[len("field:") :].split(";", 1)[0]
            names.add(decl.replace("*", " ").split()[-1].split("[", 1)[0])
    return names


def plan_probes(tracefs: Path, traffic_mode: str = "auto") -> ProbePlan:
    """Feature detection: which tracepoints this kernel has, and what to fall back to."""
    send = tracepoint_fields(tracefs, "sock", "sock_send_length")
    recv = tracepoint_fields(tracefs, "sock", "sock_recv_length")
    state = tracepoint_fields(tracefs, "sock", "inet_sock_set_state")
    retrans = tracepoint_fields(tracefs, "tcp", "tcp_retransmit_skb")
    probe = tracepoint_fields(tracefs, "tcp", "tcp_probe")
    if traffic_mode == "auto":
        traffic = "tracepoint" if send is not None and recv is not None else "cgroup_skb"
    elif traffic_mode == "tracepoint" and (send is None or recv is None):
        raise SourceUnavailable("this kernel has no sock:sock_send_length/sock_recv_length")
    else:
        traffic = traffic_mode
    connections = state is not None and "skaddr" in state
    return ProbePlan(
        traffic=traffic,
        connections=connections,
        retransmits=connections and retrans is not None and "skaddr" in retrans,
        rtt=connections and probe is not None and {"skaddr", "srtt"} <= probe,
        retransmit_err=retrans is not None and "err" in retrans,
    )


def _has_kconfig(tree: Path) -> bool:
    return (tree / "include" / "linux" / "kconfig.h").is_file()


def find_kernel_headers(
    modules_dir: Path, fallback: Path, env: Mapping[str, str] | None = None
) -> HeaderTree | None:
    """Header discovery order: $BCC_KERNEL_SOURCE, <modules>/<release>/build, the fallback."""
    env = os.environ if env is None else env
    configured = env.get("BCC_KERNEL_SOURCE")
    if configured and _has_kconfig(Path(configured)):
        return HeaderTree(Path(configured), "BCC_KERNEL_SOURCE")
    release = modules_dir / platform.release()
    build, source = release / "build", release / "source"
    if _has_kconfig(build) or (build.is_dir() and _has_kconfig(source)):
        return HeaderTree(build, "modules")
    if _has_kconfig(fallback):
        return HeaderTree(fallback, "fallback")
    return None


def check_host(
    *,
    traffic_mode: str,
    modules_dir: Path,
    fallback_headers: Path,
    procfs: Path = Path("/proc"),
) -> tuple[Path, HeaderTree]:
    """Raise SourceUnavailable naming the first missing prerequisite."""
    tracefs = tracefs_root()
    if tracefs is None:
        raise SourceUnavailable(
            "tracefs is not mounted (looked at /sys/kernel/tracing and /sys/kernel/debug/tracing);"
            " mount it: mount -t tracefs tracefs /sys/kernel/tracing"
        )
    missing = missing_capabilities(
        effective_capabilities(procfs), attach_cgroup=traffic_mode == "cgroup_skb"
    )
    if missing:
        raise SourceUnavailable(
            f"missing capabilities {', '.join(missing)} (or CAP_SYS_ADMIN) to load eBPF probes"
        )
    headers = find_kernel_headers(modules_dir, fallback_headers)
    if headers is None:
        raise SourceUnavailable(
            "no kernel header tree: looked at $BCC_KERNEL_SOURCE, "
            f"{modules_dir}/{platform.release()}/build and {fallback_headers}"
        )
    return tracefs, headers


def import_bcc() -> Any:
    try:
        import bcc
    except ImportError as exc:
        raise SourceUnavailable(
            f"bcc Python bindings not importable ({exc}); install Debian's python3-bpfcc"
        ) from exc
    return bcc


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


class BpfProbes:
    """The loaded programs. Not thread-safe: the runner serializes collections."""

    def __init__(self, plan: ProbePlan, limits: MapLimits) -> None:
        self.plan = plan
        self.limits = limits
        self._bpf: Any = None
        self._cgroup_fd: int | None = None
        self._attached: list[tuple[Any, int]] = []
        self._sockets_count = 0
        self._sockets_counted_at: float | None = None

    def load(self, headers: HeaderTree, cgroup_root: Path | None) -> None:
        bcc = import_bcc()
        if headers.how != "modules":
            os.environ["BCC_KERNEL_SOURCE"] = str(headers.path)
        text = program_text(self.plan, self.limits)
        try:
            self._bpf = bcc.BPF(text=text.encode())
        except Exception as exc:  # bcc raises bare Exception with the compiler's message
            raise SourceUnavailable(
                f"compiling the eBPF probes failed against headers {headers.path}: {exc}"
            ) from exc
        if self.plan.traffic == "cgroup_skb":
            if cgroup_root is None:
                raise SourceUnavailable("cgroup_skb mode needs a cgroup v2 mount")
            self._attach_cgroup_skb(bcc, cgroup_root)
        release_compiler_pages()

    def _attach_cgroup_skb(self, bcc: Any, cgroup_root: Path) -> None:
        self._cgroup_fd = os.open(cgroup_root, os.O_RDONLY | os.O_DIRECTORY)
        for name, kind in (
            ("gpuscope_egress", bcc.BPFAttachType.CGROUP_INET_EGRESS),
            ("gpuscope_ingress", bcc.BPFAttachType.CGROUP_INET_INGRESS),
        ):
            fn = self._bpf.load_func(name.encode(), bcc.BPF.CGROUP_SKB)
            # BPF_F_ALLOW_MULTI (2): coexist with the CNI's or the runtime's own programs.
            bcc.BPF.attach_func(fn, self._cgroup_fd, kind, 2)
            self._attached.append((fn, kind))

    def read(self) -> RawCounters:
        bpf = self._bpf
        traffic = {
            (int(k.cgroup), int(k.proto), int(k.dir)): (
                sum(int(cpu.bytes) for cpu in v),  # a per-CPU map: one value per CPU
                sum(int(cpu.calls) for cpu in v),
            )
            for k, v in _items(bpf[b"traffic"])
        }
        tcp = {
            _scalar(k): (
                int(v.opened),
                int(v.closed),
                int(v.retransmits),
                int(v.rtt_sum_us),
                int(v.rtt_count),
            )
            for k, v in _items(bpf[b"tcp"])
        }
        rtt: dict[tuple[int, int], int] = {}
        if self.plan.connections and self.plan.rtt:
            rtt = {(int(k.cgroup), int(k.slot)): _scalar(v) for k, v in _items(bpf[b"rtt"])}
        full_table = bpf[b"map_full"]
        map_full = {name: _scalar(full_table[ctypes.c_int(i)]) for i, name in enumerate(MAP_INDEX)}
        return RawCounters(traffic=traffic, tcp=tcp, rtt=rtt, map_full=map_full)

    def map_entries(self, raw: RawCounters) -> dict[str, int]:
        """Entries per map: from what `read` returned, and for the socket map (which can hold
        hundreds of thousands of entries nobody needs to see) a count refreshed once a minute."""
        out = {"traffic": len(raw.traffic), "tcp": len(raw.tcp)}
        if self.plan.connections:
            now = time.monotonic()
            if self._sockets_counted_at is None or now - self._sockets_counted_at >= 60:
                self._sockets_count = len(_items(self._bpf[b"sockets"]))
                self._sockets_counted_at = now
            out["sockets"] = self._sockets_count
            if self.plan.rtt:
                out["rtt"] = len(raw.rtt)
        return out

    def map_max_entries(self) -> dict[str, int]:
        out = {"traffic": self.limits.traffic, "tcp": self.limits.cgroups}
        if self.plan.connections:
            out["sockets"] = self.limits.sockets
            if self.plan.rtt:
                out["rtt"] = self.limits.rtt
        return out

    def delete_cgroups(self, cgroups: Iterable[int]) -> None:
        """Remove every entry of these cgroups (they no longer exist)."""
        gone = set(cgroups)
        if not gone:
            return
        bpf = self._bpf
        names = ["traffic", "tcp"]
        if self.plan.connections and self.plan.rtt:
            names.append("rtt")
        for name in names:
            table = bpf[name.encode()]
            for key in [k for k, _ in _items(table) if _key_cgroup(k) in gone]:
                with contextlib.suppress(KeyError):  # raced with another deletion
                    del table[table.Key(key) if isinstance(key, int) else key]

    def close(self) -> None:
        if self._bpf is None:
            return
        if self._cgroup_fd is not None:
            for fn, kind in self._attached:
                try:
                    self._bpf.detach_func(fn, self._cgroup_fd, kind)
                except Exception as exc:  # noqa: BLE001 - best effort on shutdown
                    log.debug("detaching %s: %s", fn.name, exc)
            os.close(self._cgroup_fd)
            self._cgroup_fd = None
        self._bpf.cleanup()
        self._bpf = None


def _key_cgroup(key: Any) -> int:
    """The cgroup id in a map key: a struct with a `cgroup` field, or the bare u64."""
    return int(key.cgroup) if hasattr(key, "cgroup") else _scalar(key)


def _scalar(value: Any) -> int:
    """A u64 from bcc: a ctypes scalar from items(), a plain int from the batch API."""
    return int(value.value) if hasattr(value, "value") else int(value)


def _items(table: Any) -> list[tuple[Any, Any]]:
    """Batched map reads (one syscall per batch) where the kernel has them (5.6+)."""
    try:
        return list(table.items_lookup_batch())
    except Exception:  # noqa: BLE001 - old kernel or an array map: fall back to iteration
        return list(table.items())

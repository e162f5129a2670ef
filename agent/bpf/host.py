"""What the host must have before BPF work starts, checked up front so an operator reads
what to fix ("mount bpffs", "add CAP_BPF") instead of bcc's or the kernel's bare errors.

The helper that compiles and loads (`gpuscope bpf-load`) needs tracefs, a kernel header
tree, bpffs and CAP_BPF + CAP_PERFMON (+ CAP_NET_ADMIN to attach to a cgroup). The agent
that reads pinned maps needs no capability on Linux 6.5 and later (the pins' file permissions
guard them) and CAP_BPF before (bpf(2) is closed to processes without it while
kernel.unprivileged_bpf_disabled is set, the default of distribution kernels); the kernel's
answer is what the agent reports (agent/bpf/session.py), not a check of its own.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscope.agent.runtime.sources import SourceUnavailable

TRACEFS_CANDIDATES = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


@dataclass(frozen=True, slots=True)
class HeaderTree:
    """A kernel header tree bcc can compile against, and where it was found (in the order of
    `find_kernel_headers`)."""

    path: Path
    how: str  # "BCC_KERNEL_SOURCE" | "modules" | "fallback"


def effective_capabilities(procfs: Path = Path("/proc")) -> int:
    for line in (procfs / "self" / "status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def missing_capabilities(caps: int, *, attach_cgroup: bool = False) -> list[str]:
    """The capabilities this process lacks (names) to load and attach the programs."""

    def has(cap: int) -> bool:
        return bool(caps >> cap & 1)

    if has(CAP_SYS_ADMIN):
        return []
    wanted = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
    if attach_cgroup:
        wanted.append((CAP_NET_ADMIN, "CAP_NET_ADMIN"))
    return [name for cap, name in wanted if not has(cap)]


def tracefs_root() -> Path | None:
    for candidate in TRACEFS_CANDIDATES:
        if (candidate / "events").is_dir():
            return candidate
    return None


def require_tracefs() -> Path:
    tracefs = tracefs_root()
    if tracefs is None:
        raise SourceUnavailable(
            "tracefs is not mounted (looked at /sys/kernel/tracing and /sys/kernel/debug/tracing);"
            " mount it: mount -t tracefs tracefs /sys/kernel/tracing"
        )
    return tracefs


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


def require_kernel_headers(modules_dir: Path, fallback: Path) -> HeaderTree:
    headers = find_kernel_headers(modules_dir, fallback)
    if headers is None:
        raise SourceUnavailable(
            "no kernel header tree: looked at $BCC_KERNEL_SOURCE, "
            f"{modules_dir}/{platform.release()}/build and {fallback}"
        )
    return headers


def require_capabilities(procfs: Path, *, attach_cgroup: bool = False) -> None:
    missing = missing_capabilities(effective_capabilities(procfs), attach_cgroup=attach_cgroup)
    if missing:
        raise SourceUnavailable(
            f"missing capabilities {', '.join(missing)} (or CAP_SYS_ADMIN) to load eBPF probes"
        )


def import_bcc() -> Any:
    """bcc's Python bindings (Debian's python3-bpfcc): only the helper imports them."""
    try:
        import bcc
    except ImportError as exc:
        raise SourceUnavailable(
            f"bcc Python bindings not importable ({exc}); install Debian's python3-bpfcc"
        ) from exc
    return bcc

"""The helper's side: compile a family with bcc, attach it through BPF links, pin its maps
and links under bpffs with a manifest, and exit.

This is the only module that imports bcc (and so LLVM and clang, about 120 MB): it runs in
`gpuscope bpf-load`, once per node boot or upgrade, never in the long-lived agent. Links,
not bcc's perf-event attachments, hold the programs, because a link pinned under bpffs keeps
its program attached after the process that made it exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscope.agent.bpf import pins, syscall
from gpuscope.agent.bpf.family import PIN_FORMAT, ProbeFamily, Program, program_hash
from gpuscope.agent.bpf.host import HeaderTree, import_bcc
from gpuscope.agent.runtime.sources import SourceUnavailable

log = logging.getLogger("gpuscope.bpf")


@dataclass(frozen=True, slots=True)
class Loaded:
    directory: Path
    program_hash: str
    modes: dict[str, str]
    seconds: float
    peak_rss_bytes: int
    reused: bool  # the pins were there already (another helper, or an earlier boot's)
    removed: tuple[str, ...]  # stale pin directories removed


def _compile(bcc: Any, program: Program, headers: HeaderTree) -> Any:
    if headers.how != "modules":
        os.environ["BCC_KERNEL_SOURCE"] = str(headers.path)

    class Unattached(bcc.BPF):  # type: ignore[misc]
        """bcc attaches `tracepoint__*` functions through perf events that close when this
        process exits; gpuscope attaches them through pinned links instead."""

        def _trace_autoload(self) -> None:
            return None

    try:
        return Unattached(text=program.text.encode())
    except Exception as exc:  # bcc raises bare Exception with the compiler's message
        raise SourceUnavailable(
            f"compiling the eBPF probes failed against headers {headers.path}: {exc}"
        ) from exc


def _attach(bcc: Any, bpf: Any, program: Program, directory: Path, tracefs: Path,
            cgroup_root: Path | None) -> None:  # fmt: skip
    for attachment in program.attachments:
        if attachment.kind == "cgroup_skb":
            if cgroup_root is None:
                raise SourceUnavailable("cgroup_skb mode needs a cgroup v2 mount")
            fn = bpf.load_func(attachment.function.encode(), bcc.BPF.CGROUP_SKB)
            target = os.open(cgroup_root, os.O_RDONLY | os.O_DIRECTORY)
            direction = attachment.target.split(":", 1)[1]
            attach_type = (
                syscall.ATTACH_CGROUP_INET_EGRESS
                if direction == "egress"
                else syscall.ATTACH_CGROUP_INET_INGRESS
            )
        else:
            fn = bpf.load_func(attachment.function.encode(), bcc.BPF.TRACEPOINT)
            category, event = attachment.target.split(":", 1)
            target = syscall.tracepoint_event(tracefs, category, event)
            attach_type = syscall.ATTACH_PERF_EVENT
        try:
            link = syscall.link_create(fn.fd, target, attach_type)
        except syscall.BpfError as exc:
            raise SourceUnavailable(
                f"attaching {attachment.function} to {attachment.target}: {exc.strerror} "
                "(BPF links for tracepoints need Linux 5.15+, for cgroups 5.7+)"
            ) from exc
        finally:
            os.close(target)
        try:
            syscall.obj_pin(link, pins.link_path(directory, attachment.link_name))
        finally:
            os.close(link)


def load(
    family: ProbeFamily,
    *,
    pin_root: Path,
    tracefs: Path,
    headers: HeaderTree,
    cgroup_root: Path | None,
) -> Loaded:
    """Pins for `family` under `pin_root`, loaded now unless pins of its hash exist."""
    started = time.monotonic()
    digest = program_hash(family)
    final = pins.published(pin_root, family.name, digest)
    removed: list[str] = []

    def finish(reused: bool, modes: dict[str, str]) -> Loaded:
        for stale in pins.stale_pins(pin_root, family.name, keep=final.name):
            pins.remove(stale.path)
            removed.append(f"{stale.path.name} ({stale.why})")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return Loaded(final, digest, modes, time.monotonic() - started, peak, reused,
                      tuple(removed))  # fmt: skip

    if (final / pins.MANIFEST).exists():
        return finish(True, dict(pins.read_manifest(final).get("modes", {})))

    bcc = import_bcc()
    program = family.program(tracefs)
    bpf = _compile(bcc, program, headers)
    pin_root.mkdir(parents=True, exist_ok=True)
    building = pins.building(pin_root, family.name, digest, os.getpid())
    building.mkdir()
    try:
        for spec in program.maps:
            syscall.obj_pin(bpf[spec.name.encode()].map_fd, pins.map_path(building, spec.name))
        _attach(bcc, bpf, program, building, tracefs, cgroup_root)
        pins.write_manifest(
            building,
            {
                "format": PIN_FORMAT,
                "family": family.name,
                "hash": digest,
                "modes": dict(program.modes),
                "maps": {spec.name: spec.to_json() for spec in program.maps},
                "links": [a.link_name for a in program.attachments],
                "kernel": platform.release(),
                "machine": platform.machine(),
                "loaded_at": time.time(),
            },
        )
        try:
            building.rename(final)
        except OSError:
            if not (final / pins.MANIFEST).exists():
                raise
            # Another helper published the same program first: its pins count, ours go.
            pins.remove(building)
            return finish(True, dict(program.modes))
    except BaseException:
        with contextlib.suppress(OSError):
            pins.remove(building)
        raise
    finally:
        bpf.cleanup()
    return finish(False, dict(program.modes))


def unload(pin_root: Path) -> list[str]:
    """Remove every pin under `pin_root` (every family and hash): the programs detach."""
    try:
        names = sorted(entry.name for entry in os.scandir(pin_root))
    except FileNotFoundError:
        return []
    for name in names:
        pins.remove(pin_root / name)
    with contextlib.suppress(OSError):
        pin_root.rmdir()
    return names

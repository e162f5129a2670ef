"""Where a family's pinned maps and links live under bpffs, and the manifest beside them.

    <pin root>/<family>-<hash>/manifest          an array map holding the manifest (JSON)
    <pin root>/<family>-<hash>/map_<name>        a map user space reads
    <pin root>/<family>-<hash>/link_<target>     a link keeping a program attached

bpffs holds BPF objects and directories, not regular files, so the manifest is a one-entry
array map (a u32 length, then JSON), frozen: readable by whoever may open the pins, with
the same permissions, and gone with them. A helper builds its pins in a hidden directory
and renames it into place: a `<family>-<hash>` directory is always complete. (bpffs
refuses names with a dot in them.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscope.agent.bpf import syscall
from gpuscope.agent.bpf.family import PIN_FORMAT

DEFAULT_PIN_ROOT = Path("/sys/fs/bpf/gpuscope")
MANIFEST = "manifest"


def published(pin_root: Path, family: str, program_hash: str) -> Path:
    return pin_root / f"{family}-{program_hash}"


def building(pin_root: Path, family: str, program_hash: str, pid: int) -> Path:
    """Where a helper builds the pins before publishing them."""
    return pin_root / f"building-{family}-{program_hash}-{pid}"


def map_path(directory: Path, name: str) -> Path:
    return directory / f"map_{name}"


def link_path(directory: Path, name: str) -> Path:
    return directory / f"link_{name}"


def bpffs_mount(path: Path, mounts: Path = Path("/proc/self/mounts")) -> Path | None:
    """The bpffs mount point that holds `path`, None when the file system there is another."""
    best: tuple[Path, str] | None = None
    for line in mounts.read_text().splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = Path(fields[1].replace("\\040", " "))
        if (path == point or point in path.parents) and (
            best is None or len(point.parts) > len(best[0].parts)
        ):
            best = (point, fields[2])
    return best[0] if best is not None and best[1] == "bpf" else None


def write_manifest(directory: Path, manifest: Mapping[str, Any]) -> None:
    data = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    value = struct.pack("=I", len(data)) + data
    value += bytes(-len(value) % 8)
    fd = syscall.map_create(syscall.MAP_TYPE_ARRAY, 4, len(value), 1, "gpuscope_mnfst")
    try:
        syscall.update(fd, struct.pack("=I", 0), value)
        syscall.map_freeze(fd)
        syscall.obj_pin(fd, directory / MANIFEST)
    finally:
        os.close(fd)


class ManifestError(Exception):
    """Pins exist but their manifest is unreadable or of another format."""


def read_manifest(directory: Path) -> dict[str, Any]:
    fd = syscall.obj_get(directory / MANIFEST, read_only=True)
    try:
        info = syscall.map_info(fd)
        raw = syscall.lookup(fd, struct.pack("=I", 0), info.value_size)
    finally:
        os.close(fd)
    if raw is None or len(raw) < 4:
        raise ManifestError(f"{directory / MANIFEST} is empty")
    (length,) = struct.unpack_from("=I", raw)
    try:
        manifest = json.loads(raw[4 : 4 + length])
    except ValueError as exc:
        raise ManifestError(f"{directory / MANIFEST} is not JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != PIN_FORMAT:
        raise ManifestError(f"{directory / MANIFEST} is not pin format {PIN_FORMAT}")
    return manifest


def remove(path: Path) -> None:
    """Unpin everything under `path` (a pin directory): its links detach their programs, and
    its maps go once no program or open fd holds them."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@dataclass(frozen=True, slots=True)
class Stale:
    """A family's pin directory that is no longer wanted: another program hash's, or the build
    directory of a helper that is no longer running (`why` says which)."""

    path: Path
    why: str  # "another program" | "unfinished"


def stale_pins(pin_root: Path, family: str, keep: str) -> Iterator[Stale]:
    """The family's pins other than `keep` (a directory name): those of another program
    hash, and hidden build directories of helpers that are no longer running."""
    try:
        entries = list(os.scandir(pin_root))
    except FileNotFoundError:
        return
    for entry in entries:
        name = entry.name
        if name.startswith(f"{family}-") and name != keep:
            yield Stale(Path(entry.path), "another program")
        elif name.startswith(f"building-{family}-"):
            pid = name.rsplit("-", 1)[-1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                yield Stale(Path(entry.path), "unfinished")

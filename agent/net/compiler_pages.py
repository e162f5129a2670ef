"""Give back the compiler's memory once the eBPF probes are loaded.

bcc compiles the probes with clang and LLVM inside the agent's process: about 80 MB of
libLLVM and libclang-cpp code is paged in for half a second and never touched again. Those
pages are file-backed and clean, so `madvise(MADV_PAGEOUT)` (Linux 5.4+) lets the kernel
drop them at once instead of carrying them in the agent's RSS, and in its memory cgroup's
page cache, until memory pressure. Pages the relocation step dirtied are anonymous and stay;
a later compile (the net source restarting) simply faults the code back in.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("gpuscope.net")

MADV_PAGEOUT = 21
COMPILER_LIBRARIES = ("libLLVM", "libclang")


def compiler_mappings(
    maps_text: str, names: Iterable[str] = COMPILER_LIBRARIES
) -> list[tuple[int, int]]:
    """(start, length) of the mappings of the compiler's shared libraries in a maps file."""
    wanted = tuple(names)
    ranges = []
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not any(n in Path(fields[5]).name for n in wanted):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        ranges.append((start, end - start))
    return ranges


def release_compiler_pages(maps: Path = Path("/proc/self/maps")) -> int:
    """Ask the kernel to page out the compiler's mappings; returns how many were advised."""
    try:
        ranges = compiler_mappings(maps.read_text())
    except OSError:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    done = 0
    for start, length in ranges:
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), MADV_PAGEOUT) == 0:
            done += 1
    log.debug("paged out %d of %d compiler mappings", done, len(ranges))
    return done

"""Where the agent image's bytes are: its size by layer, its ten largest directories and its
largest files (docs/deploy.md, "Image size"). Run after `make image`:

    .venv/bin/python bench/image_size.py [IMAGE]

The directories are ranked by the bytes of their own files, so that they do not overlap (the
list names places, not /usr); the size of everything below each is printed beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpuscope import __version__

MB = 1_000_000


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=True).stdout


def tree_sizes(root: Path) -> tuple[dict[str, int], list[tuple[int, str]]]:
    """Bytes below each directory (apparent sizes of regular files, hard links once) and every
    file's size, paths relative to `root`."""
    dirs: dict[str, int] = {}
    files: list[tuple[int, str]] = []
    seen: set[tuple[int, int]] = set()
    for top, _, names in os.walk(root):
        rel = os.path.relpath(top, root)
        for name in names:
            st = os.lstat(os.path.join(top, name))
            if not os.path.isfile(os.path.join(top, name)) or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            path = os.path.normpath(os.path.join("/", rel, name))
            files.append((st.st_size, path))
            parent = os.path.dirname(path)
            while True:
                dirs[parent] = dirs.get(parent, 0) + st.st_size
                if parent == "/":
                    break
                parent = os.path.dirname(parent)
    return dirs, files


def largest_places(files: list[tuple[int, str]], count: int) -> list[tuple[int, str]]:
    """The directories holding the most bytes in files of their own (not below them): places
    that do not overlap, so the list says where the bytes are rather than naming /usr."""
    own: dict[str, int] = {}
    for size, path in files:
        own[os.path.dirname(path)] = own.get(os.path.dirname(path), 0) + size
    return sorted(((size, d) for d, size in own.items()), reverse=True)[:count]


def main() -> int:
    image = sys.argv[1] if len(sys.argv) > 1 else f"ghcr.io/gpuscope/gpuscope:{__version__}"
    (info,) = json.loads(podman("image", "inspect", image))
    print(f"{image}: {int(info['Size']) / MB:.0f} MB")
    print("\nlayers (newest first):")
    history = podman("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", image)
    for line in history.splitlines():
        size, created = line.split("\t", 1)
        if size != "0 B":
            print(f"  {size:>9}  {created[:110]}")
    container = podman("create", image).strip()
    try:
        root = Path(podman("mount", container).strip())
        dirs, files = tree_sizes(root)
        print(f"\nfiles: {sum(s for s, _ in files) / MB:.1f} MB in {len(files)} files")
        print("\nten largest directories (bytes in their own files, with everything below):")
        for size, d in largest_places(files, 10):
            print(f"  {size / MB:7.1f} MB  {dirs[d] / MB:7.1f} MB  {d}")
        print("\nten largest files:")
        for size, f in sorted(files, reverse=True)[:10]:
            print(f"  {size / MB:7.1f} MB  {f}")
    finally:
        subprocess.run(["podman", "rm", "--force", container], capture_output=True, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The agent's side: a family's pinned maps opened by path and read through bpf(2).

No bcc, no compiler: keys and values are decoded with the layouts the helper wrote in the
manifest, checked against the sizes the kernel reports for each map. Per-CPU values are
summed field by field (they are counters).
"""

from __future__ import annotations

import os
import platform
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpuscope.agent.bpf import syscall
from gpuscope.agent.bpf.family import MapSpec
from gpuscope.agent.bpf.pins import ManifestError, map_path, read_manifest

Entry = tuple[tuple[Any, ...], tuple[Any, ...]]


class PinnedMap:
    """One pinned map, open for reading (and deleting: the agent prunes dead cgroups)."""

    def __init__(self, spec: MapSpec, fd: int, info: syscall.MapInfo, cpus: int) -> None:
        self.spec = spec
        self.fd = fd
        self.info = info
        self.cpus = cpus if info.percpu else 1
        self._stride = -spec.value.size % 8 + spec.value.size if info.percpu else 0
        self.value_bytes = self._stride * self.cpus if info.percpu else spec.value.size
        self._batch: syscall.BatchLookup | None = syscall.BatchLookup(
            fd, spec.key.size, self.value_bytes, info.max_entries
        )
        if info.percpu:
            cpu_format = spec.value.format + "x" * (self._stride - spec.value.size)
            self._cpu_struct = struct.Struct(cpu_format)

    @property
    def max_entries(self) -> int:
        return self.info.max_entries

    def _value(self, raw: bytes) -> tuple[Any, ...]:
        if not self.info.percpu:
            return self.spec.value.decode(raw)
        (summed,) = self._summed(raw)
        return summed

    def _summed(self, raw: bytes) -> list[tuple[Any, ...]]:
        """Per-CPU values (one key's or many keys' in a row), summed field by field per key:
        one unpack over the whole buffer, then the CPUs of each key grouped."""
        rows = self._cpu_struct.iter_unpack(raw)
        if self.cpus == 1:
            return list(rows)
        groups = zip(*[rows] * self.cpus, strict=True)
        return [tuple(map(sum, zip(*group, strict=True))) for group in groups]

    def entries(self) -> list[Entry]:
        """Every (key, value), by batch lookup where the kernel has it (5.6+)."""
        key_layout, key_size = self.spec.key, self.spec.key.size
        if self._batch is not None:
            got = self._batch()
            if got is not None:
                keys, values, _ = got
                key_rows = struct.Struct(key_layout.format).iter_unpack(keys)
                if not self.info.percpu:
                    value_rows = struct.Struct(self.spec.value.format).iter_unpack(values)
                    return list(zip(key_rows, value_rows, strict=True))
                return list(zip(key_rows, self._summed(values), strict=True))
            self._batch = None
        out: list[Entry] = []
        for raw_key in syscall.keys(self.fd, key_size):
            raw_value = syscall.lookup(self.fd, raw_key, self.value_bytes)
            if raw_value is not None:  # deleted between the two calls
                out.append((key_layout.decode(raw_key), self._value(raw_value)))
        return out

    def put(self, key: Iterable[Any], value: Iterable[Any]) -> None:
        """Write a value (a map only user space writes: per-CPU maps are not written)."""
        assert not self.info.percpu
        syscall.update(self.fd, self.spec.key.encode(key), self.spec.value.encode(value))

    def delete(self, key: Iterable[Any]) -> bool:
        return syscall.delete(self.fd, self.spec.key.encode(key))

    def count(self) -> int:
        """Entries, without decoding values (for maps too large to read every scrape)."""
        got = self._batch() if self._batch is not None else None
        if got is not None:
            return got[2]
        return sum(1 for _ in syscall.keys(self.fd, self.spec.key.size))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PinnedFamily:
    """A family's pins as the agent uses them: the manifest and the maps it lists."""

    def __init__(self, directory: Path, manifest: Mapping[str, Any], maps: dict[str, PinnedMap]):
        self.directory = directory
        self.manifest = manifest
        self.maps = maps

    @classmethod
    def open(cls, directory: Path) -> PinnedFamily:
        """Open every map of the manifest. Raises ManifestError when a map is missing or its
        sizes are not what the manifest says (pins damaged or from another gpuscope)."""
        manifest = read_manifest(directory)
        if manifest.get("machine") not in (None, platform.machine()):
            raise ManifestError(f"{directory} was pinned for {manifest['machine']}")
        cpus = syscall.possible_cpus()
        maps: dict[str, PinnedMap] = {}
        try:
            for name, value in manifest["maps"].items():
                spec = MapSpec.from_json(name, value)
                fd = syscall.obj_get(map_path(directory, name))
                maps[name] = PinnedMap(spec, fd, syscall.map_info(fd), cpus)
                info = maps[name].info
                if (info.key_size, info.value_size) != (spec.key.size, spec.value.size):
                    raise ManifestError(
                        f"map {name} has {info.key_size}-byte keys and {info.value_size}-byte "
                        f"values, the manifest says {spec.key.size} and {spec.value.size}"
                    )
        except BaseException:
            for m in maps.values():
                m.close()
            raise
        return cls(directory, manifest, maps)

    def __getitem__(self, name: str) -> PinnedMap:
        return self.maps[name]

    def __contains__(self, name: str) -> bool:
        return name in self.maps

    def close(self) -> None:
        for m in self.maps.values():
            m.close()

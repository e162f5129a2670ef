"""The bpf(2) and perf_event_open(2) system calls through ctypes: what reading pinned maps
and attaching pinned links takes, without bcc or libbpf in the process.

Each call raises `BpfError` (an OSError with the call's name) on failure. Attribute layouts
follow include/uapi/linux/bpf.h; unused trailing attribute bytes are zero, which the kernel
requires.
"""

from __future__ import annotations

import ctypes
import errno as errno_codes
import os
import platform
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# enum bpf_cmd
MAP_CREATE = 0
MAP_LOOKUP_ELEM = 1
MAP_UPDATE_ELEM = 2
MAP_DELETE_ELEM = 3
MAP_GET_NEXT_KEY = 4
OBJ_PIN = 6
OBJ_GET = 7
OBJ_GET_INFO_BY_FD = 15
MAP_FREEZE = 22
MAP_LOOKUP_BATCH = 24
LINK_CREATE = 28

# enum bpf_map_type (those gpuscope uses)
MAP_TYPE_HASH = 1
MAP_TYPE_ARRAY = 2
MAP_TYPE_PERCPU_HASH = 5
MAP_TYPE_PERCPU_ARRAY = 6
PERCPU_MAP_TYPES = frozenset({MAP_TYPE_PERCPU_HASH, MAP_TYPE_PERCPU_ARRAY})

# enum bpf_attach_type (those gpuscope uses)
ATTACH_CGROUP_INET_INGRESS = 0
ATTACH_CGROUP_INET_EGRESS = 1
ATTACH_PERF_EVENT = 41

BPF_F_RDONLY = 1 << 3  # file_flags of BPF_OBJ_GET
BPF_ANY = 0

PERF_TYPE_TRACEPOINT = 2
PERF_FLAG_FD_CLOEXEC = 8
PERF_EVENT_IOC_ENABLE = 0x2400

_ATTR_SIZE = 128  # larger than every attribute struct used here; the rest stays zero
_SYSCALLS = {
    "x86_64": {"bpf": 321, "perf_event_open": 298},
    "aarch64": {"bpf": 280, "perf_event_open": 241},
}

BPF_OBJ_NAME_LEN = 16


class BpfError(OSError):
    """A bpf(2) call failed: `errno` is the kernel's, the message names the call."""


@cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _number(name: str) -> int:
    machine = platform.machine()
    try:
        return _SYSCALLS[machine][name]
    except KeyError:
        raise BpfError(errno_codes.ENOSYS, f"{name}: no syscall number for {machine}") from None


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char], what: str) -> int:
    ret = _libc().syscall(
        ctypes.c_long(_number("bpf")), ctypes.c_int(cmd), attr, ctypes.c_uint(_ATTR_SIZE)
    )
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"{what}: {os.strerror(err)}")
    return int(ret)


def _attr(fmt: str, *values: object) -> ctypes.Array[ctypes.c_char]:
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into(fmt, attr, 0, *values)
    return attr


def _addr(buf: ctypes.Array[ctypes.c_char] | None) -> int:
    return 0 if buf is None else ctypes.addressof(buf)


def obj_get(path: Path, *, read_only: bool = False) -> int:
    """Open a pinned object (map, link) by its bpffs path; the caller closes the fd."""
    name = ctypes.create_string_buffer(os.fsencode(path))
    flags = BPF_F_RDONLY if read_only else 0
    return _bpf(OBJ_GET, _attr("=QII", _addr(name), 0, flags), f"opening {path}")


def obj_pin(fd: int, path: Path) -> None:
    name = ctypes.create_string_buffer(os.fsencode(path))
    _bpf(OBJ_PIN, _attr("=QII", _addr(name), fd, 0), f"pinning {path}")


@dataclass(frozen=True, slots=True)
class MapInfo:
    """What the kernel reports of a BPF map (`struct bpf_map_info`): the sizes the manifest's
    layouts are checked against, and whether its values are per CPU."""

    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    name: str

    @property
    def percpu(self) -> bool:
        return self.type in PERCPU_MAP_TYPES


def map_info(fd: int) -> MapInfo:
    info = ctypes.create_string_buffer(88)  # struct bpf_map_info
    _bpf(
        OBJ_GET_INFO_BY_FD,
        _attr("=IIQ", fd, len(info), _addr(info)),
        "reading a map's info",
    )
    kind, ident, key_size, value_size, max_entries, _flags, name = struct.unpack_from(
        "=IIIIII16s", info
    )
    return MapInfo(kind, ident, key_size, value_size, max_entries, name.split(b"\0")[0].decode())


def map_create(kind: int, key_size: int, value_size: int, max_entries: int, name: str) -> int:
    encoded = name.encode()[: BPF_OBJ_NAME_LEN - 1]
    attr = _attr("=IIIIIII16s", kind, key_size, value_size, max_entries, 0, 0, 0, encoded)
    return _bpf(MAP_CREATE, attr, f"creating map {name}")


def map_freeze(fd: int) -> None:
    _bpf(MAP_FREEZE, _attr("=I", fd), "freezing a map")


def lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    """The value under `key` (value_size bytes: per-CPU maps' full size), None if absent."""
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value_size)
    try:
        _bpf(MAP_LOOKUP_ELEM, _attr("=IxxxxQQQ", fd, _addr(k), _addr(v), 0), "map lookup")
    except BpfError as exc:
        if exc.errno == errno_codes.ENOENT:
            return None
        raise
    return v.raw


def update(fd: int, key: bytes, value: bytes) -> None:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    _bpf(MAP_UPDATE_ELEM, _attr("=IxxxxQQQ", fd, _addr(k), _addr(v), BPF_ANY), "map update")


def delete(fd: int, key: bytes) -> bool:
    """Delete `key`; False if it was not there (raced with another deletion)."""
    k = ctypes.create_string_buffer(key, len(key))
    try:
        _bpf(MAP_DELETE_ELEM, _attr("=IxxxxQQQ", fd, _addr(k), 0, 0), "map delete")
    except BpfError as exc:
        if exc.errno == errno_codes.ENOENT:
            return False
        raise
    return True


def keys(fd: int, key_size: int) -> Iterator[bytes]:
    """Every key, by BPF_MAP_GET_NEXT_KEY (the kernel before 5.6 has no batch lookup)."""
    current: ctypes.Array[ctypes.c_char] | None = None
    nxt = ctypes.create_string_buffer(key_size)
    while True:
        try:
            _bpf(
                MAP_GET_NEXT_KEY,
                _attr("=IxxxxQQQ", fd, _addr(current), _addr(nxt), 0),
                "map iteration",
            )
        except BpfError as exc:
            if exc.errno == errno_codes.ENOENT:
                return
            raise
        yield nxt.raw
        current = ctypes.create_string_buffer(nxt.raw, key_size)


class BatchLookup:
    """Every entry of one map in as few BPF_MAP_LOOKUP_BATCH calls as the kernel allows,
    into buffers kept between reads (a scrape reads the same maps every time)."""

    def __init__(self, fd: int, key_size: int, value_size: int, max_entries: int,
                 chunk: int = 4096) -> None:  # fmt: skip
        self.fd, self.key_size, self.value_size = fd, key_size, value_size
        self.max_entries = max(1, max_entries)
        self._size(max(1, min(chunk, self.max_entries)))
        token_size = max(key_size, 8)  # hash maps use a u32 bucket index, arrays a key
        self._tokens = (ctypes.create_string_buffer(token_size),
                        ctypes.create_string_buffer(token_size))  # fmt: skip

    def _size(self, count: int) -> None:
        self.count = count
        self._keys = ctypes.create_string_buffer(self.key_size * count)
        self._values = ctypes.create_string_buffer(self.value_size * count)

    def __call__(self) -> tuple[bytes, bytes, int] | None:
        """(keys, values, count), packed key_size and value_size bytes apart. None where the
        kernel or the map type has no batch lookup (EINVAL, ENOTSUPP): the caller falls back
        to `keys`."""
        out_keys, out_values, total = [], [], 0
        in_batch, out_batch = self._tokens
        first = True
        while True:
            attr = _attr(
                "=QQQQIIQQ",
                0 if first else _addr(in_batch),
                _addr(out_batch),
                _addr(self._keys),
                _addr(self._values),
                self.count,
                self.fd,
                0,
                0,
            )
            done = False
            try:
                _bpf(MAP_LOOKUP_BATCH, attr, "batch lookup")
            except BpfError as exc:
                if exc.errno == errno_codes.ENOENT:
                    done = True  # the last batch: attr.count says how many it filled
                elif exc.errno == errno_codes.ENOSPC and self.count < self.max_entries * 4:
                    # One bucket holds more entries than `count` (the kernel then copied
                    # none): the same batch again, with room for them.
                    self._size(self.count * 4)
                    continue
                elif exc.errno in (errno_codes.EINVAL, errno_codes.ENOTSUP, 524) and first:
                    return None  # 524: the kernel's internal ENOTSUPP
                else:
                    raise
            filled = struct.unpack_from("=I", attr, 32)[0]
            if filled:
                out_keys.append(ctypes.string_at(self._keys, filled * self.key_size))
                out_values.append(ctypes.string_at(self._values, filled * self.value_size))
                total += filled
            if done:
                return b"".join(out_keys), b"".join(out_values), total
            first = False
            in_batch, out_batch = out_batch, in_batch


def link_create(prog_fd: int, target_fd: int, attach_type: int) -> int:
    """A BPF link attaching a program to a perf event (a tracepoint) or a cgroup; pinned,
    it keeps the program attached after every fd of it is closed."""
    return _bpf(
        LINK_CREATE, _attr("=IIII", prog_fd, target_fd, attach_type, 0), "creating a BPF link"
    )


def tracepoint_event(tracefs: Path, category: str, event: str) -> int:
    """A perf event on a tracepoint (CPU 0, every process) to attach a program to; the
    program then runs for the tracepoint on every CPU."""
    ident = int((tracefs / "events" / category / event / "id").read_text())
    attr = ctypes.create_string_buffer(struct.pack("=IIQQQQQII", PERF_TYPE_TRACEPOINT, 64,
                                                   ident, 1, 0, 0, 0, 1, 0) + bytes(8))  # fmt: skip
    libc = _libc()
    fd = libc.syscall(
        ctypes.c_long(_number("perf_event_open")),
        attr,
        ctypes.c_int(-1),
        ctypes.c_int(0),
        ctypes.c_int(-1),
        ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"perf_event_open {category}:{event}: {os.strerror(err)}")
    libc.ioctl(ctypes.c_int(fd), ctypes.c_ulong(PERF_EVENT_IOC_ENABLE), ctypes.c_int(0))
    return int(fd)


def possible_cpus() -> int:
    """How many values a per-CPU map holds per key: the kernel's possible CPUs ("0-3,8").

    Read from this process's own /sys, not the host root the agent is pointed at
    (--sysfs): it is the running kernel's, the same in any sysfs mount, and a fixture tree
    standing in for the host's /sys has no reason to carry it."""
    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    highest = 0
    for part in text.split(","):
        highest = max(highest, int(part.split("-")[-1]))
    return highest + 1

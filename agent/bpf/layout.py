"""Byte layouts of BPF map keys and values, declared once beside the C structs they mirror.

A layout is a list of (field, type) with C's natural alignment, so it can be written in a
manifest (JSON), checked against the kernel's key and value sizes, and decoded with
`struct` in user space without the compiler that built the program.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

_SCALARS = {"u8": ("B", 1), "u16": ("H", 2), "u32": ("I", 4), "u64": ("Q", 8)}


def _parse_type(kind: str) -> tuple[str, int, int]:
    """(struct code, size, alignment) of `u32`, `u64`, ... or `char[N]`."""
    if kind in _SCALARS:
        code, size = _SCALARS[kind]
        return code, size, size
    if kind.startswith("char[") and kind.endswith("]"):
        n = int(kind[5:-1])
        if n > 0:
            return f"{n}s", n, 1
    raise ValueError(f"unknown field type {kind!r} (u8, u16, u32, u64 or char[N])")


@dataclass(frozen=True)
class Layout:
    """A C struct of scalars and char arrays, naturally aligned, native byte order."""

    fields: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, *fields: tuple[str, str]) -> Layout:
        for _, kind in fields:
            _parse_type(kind)
        return cls(tuple(fields))

    @classmethod
    def from_json(cls, value: Sequence[Sequence[str]]) -> Layout:
        return cls.of(*((str(name), str(kind)) for name, kind in value))

    def to_json(self) -> list[list[str]]:
        return [[name, kind] for name, kind in self.fields]

    @cached_property
    def _format(self) -> tuple[str, int]:
        fmt, offset, align = "=", 0, 1
        for _, kind in self.fields:
            code, size, field_align = _parse_type(kind)
            pad = -offset % field_align
            fmt += "x" * pad + code
            offset += pad + size
            align = max(align, field_align)
        tail = -offset % align
        return fmt + "x" * tail, offset + tail

    @property
    def format(self) -> str:
        return self._format[0]

    @property
    def size(self) -> int:
        return self._format[1]

    def decode(self, data: bytes) -> tuple[int | bytes, ...]:
        return struct.unpack(self.format, data)

    def encode(self, values: Iterable[int | bytes]) -> bytes:
        return struct.pack(self.format, *values)


def text(value: int | bytes) -> str:
    """A char[N] field as text, up to its first NUL."""
    assert isinstance(value, bytes)
    return value.split(b"\0", 1)[0].decode(errors="replace")

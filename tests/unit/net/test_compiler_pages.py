"""Which mappings are the compiler's pages, chosen from /proc/self/maps text (the release on
a real compile is tests/kernel/test_compiler_pages.py)."""

from __future__ import annotations

from gpuscope.agent.net.compiler_pages import compiler_mappings

MAPS = """\
55d1c0a00000-55d1c0a2f000 r--p 00000000 08:01 1234 /usr/bin/python3.11
7f10a0000000-7f10a3c00000 r-xp 00400000 08:01 5678 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f10a3c00000-7f10a3e00000 r--p 03c00000 08:01 5678 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f10b0000000-7f10b1000000 r-xp 00000000 08:01 9012 /usr/lib/llvm-14/lib/libclang-cpp.so.14
7f10c0000000-7f10c0100000 rw-p 00000000 00:00 0
7f10d0000000-7f10d0200000 r-xp 00000000 08:01 3456 /usr/lib/x86_64-linux-gnu/libbcc.so.0.26.0
"""


def test_only_llvm_and_clang_mappings_are_chosen() -> None:
    assert compiler_mappings(MAPS) == [
        (0x7F10A0000000, 0x3C00000),
        (0x7F10A3C00000, 0x200000),
        (0x7F10B0000000, 0x1000000),
    ]

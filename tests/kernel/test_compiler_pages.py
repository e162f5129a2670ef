"""After the probes compile, the compiler's pages go back to the kernel (RSS: 183 -> 111 MB
on the 110-pod benchmark)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuscope.agent.net.compiler_pages import release_compiler_pages
from tests.support import HEADERS

pytestmark = [pytest.mark.kernel, pytest.mark.root(reason="compiling a BPF program")]


def test_release_lowers_rss_after_a_real_compile() -> None:
    from gpuscope.agent.net.ebpf import import_bcc

    bcc = import_bcc()
    os.environ.setdefault("BCC_KERNEL_SOURCE", str(HEADERS))
    program = bcc.BPF(text=b"int probe(void *ctx) { return 0; }")

    def rss_file_kb() -> int:
        status = Path("/proc/self/status").read_text()
        return int(
            next(line for line in status.splitlines() if line.startswith("RssFile")).split()[1]
        )

    before = rss_file_kb()
    assert release_compiler_pages() > 0
    assert rss_file_kb() < before - 10_000  # tens of MB of LLVM code, handed back
    program.cleanup()

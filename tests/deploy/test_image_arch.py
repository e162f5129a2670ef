"""The image builds for amd64 and arm64: the fallback kernel header tree is the target's.

No image is built here (no container engine). The Dockerfile's choice of the
linux-headers package by TARGETARCH is checked in test_deploy_manifests.py; this runs the
script the Dockerfile runs, daemonset/image/fallback-kernel-headers.sh, on header trees laid
out as Debian's packages lay them out, for each architecture the image is built for.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO

SCRIPT = REPO / "daemonset" / "image" / "fallback-kernel-headers.sh"
KERNEL_ARCH = {"amd64": "x86", "arm64": "arm64"}  # Debian's name -> the kernel's arch/ folder


def debian_headers(src: Path, deb_arch: str, release: str = "6.1.0-42") -> None:
    """linux-headers-RELEASE-common (every architecture's headers) and -DEB_ARCH (the
    configured kernel: .config and generated headers), as the packages install them."""
    common = src / f"linux-headers-{release}-common"
    (common / "include" / "linux").mkdir(parents=True, exist_ok=True)
    (common / "include" / "linux" / "kconfig.h").write_text("/* kconfig */\n")
    (common / "Makefile").write_text("# common\n")
    for arch in ("x86", "arm64", "riscv"):
        (common / "arch" / arch / "include" / "asm").mkdir(parents=True, exist_ok=True)
        (common / "arch" / arch / "include" / "asm" / "ptrace.h").write_text(f"/* {arch} */\n")
    built = src / f"linux-headers-{release}-{deb_arch}"
    (built / "include" / "generated").mkdir(parents=True)
    (built / "include" / "generated" / "autoconf.h").write_text(f"/* {deb_arch} */\n")
    (built / ".config").write_text(f"CONFIG_{deb_arch.upper()}=y\n")
    (built / "scripts").mkdir()
    (built / "scripts" / "tool").write_text("kbuild\n")


def run_script(out: Path, src: Path, target_arch: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TARGETARCH"} | {"TARGETARCH": target_arch}
    return subprocess.run(
        ["bash", str(SCRIPT), str(out), str(src)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("deb_arch", sorted(KERNEL_ARCH))
def test_fallback_tree_is_the_target_architectures(deb_arch: str, tmp_path: Path) -> None:
    src, out = tmp_path / "usr-src", tmp_path / "out"
    for arch in KERNEL_ARCH:  # a build host may hold both; TARGETARCH picks
        debian_headers(src, arch)
    result = run_script(out, src, deb_arch)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (out / "arch").iterdir()) == [KERNEL_ARCH[deb_arch]]
    assert (out / ".config").read_text() == f"CONFIG_{deb_arch.upper()}=y\n"
    assert (out / "include" / "generated" / "autoconf.h").read_text() == f"/* {deb_arch} */\n"
    assert (out / "include" / "linux" / "kconfig.h").is_file()
    assert not (out / "scripts").exists()


def test_an_architecture_without_headers_is_one_line(tmp_path: Path) -> None:
    src = tmp_path / "usr-src"
    debian_headers(src, "amd64")
    result = run_script(tmp_path / "out", src, "arm64")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"fallback-kernel-headers: no linux-headers-*-arm64 in {src}"
    ]


def test_an_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "usr-src"
    debian_headers(src, "amd64")
    result = run_script(tmp_path / "out", src, "s390x")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "fallback-kernel-headers: unsupported architecture s390x (amd64 or arm64)"
    ]

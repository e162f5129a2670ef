"""The docs name only what exists: every repository path, `make` target and gpuscope `--flag`
that README.md and docs/*.md write in code exists in this checkout. A renamed file, a removed
target or a dropped flag fails here instead of misleading a reader."""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

from tests.support import GPUSCOPE, REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Where repository paths start: the design's top-level folders and files.
TOP = ("agent", "exporters", "dashboards", "daemonset", "tests", "docs", "bench", "scripts",
       "gpuscope", ".ci")  # fmt: skip
TOP_FILES = ("Makefile", "pyproject.toml", "CHANGELOG.md", "README.md", "LICENSE",
             "requirements-dev.txt", ".dockerignore")  # fmt: skip
# Paths the docs name on purpose although they do not exist: the worked example of a new
# collector in docs/architecture.md ("Adding a collector").
EXAMPLES = {"agent/disk", "agent/disk/records.py", "agent/disk/source.py",
            "agent/disk/collector.py", "exporters/prometheus/disk.py",
            "exporters/prometheus/catalog_disk.py",
            "tests/unit/disk",
            # docs/architecture.md, "Adding a vendor": AMD's collector, to come (#23)
            "agent/amd/records.py", "agent/amd/source.py", "agent/amd/collector.py",
            "exporters/prometheus/amd.py", "exporters/labels/amd.py"}  # fmt: skip
NOT_PATHS = {"gpuscope/gpuscope"}  # the PodMonitor's Prometheus job name
# Other programs' flags the docs name alone, in a code span of their own.
FOREIGN_FLAGS = {
    "max-pods",  # the kubelet's
    "set",  # helm's (the GPU Operator's chart values)
    "enable-feature",  # Prometheus's (agent mode in 2.x)
    "agent",  # Prometheus 3.x's
    "build-arg",  # docker's and podman's
}
# Commands whose flags are theirs, not gpuscope's: a code span or line starting with one is
# not checked for flags.
FOREIGN = ("podman", "docker", "kubectl", "promtool", "curl", "nvidia-smi", "pip", "git",
           "mmdebstrap", "strace", "iperf3", "ip", "nft", "capsh", "setpriv", "prometheus",
           "victoria-metrics", "hadolint", "apt-get", "pytest", ".venv/bin/python -m pytest",
           "python -m pytest", "kustomize", "helm", "vmagent", "node_exporter", "dcgm-exporter",
           "chroot", "unshare", "bpftool", "nstat", "perf", "valgrind", "ssh", "openssl",
           "htpasswd", "systemctl", "mount", "ls", "cat", "grep", "sudo", "kind", "nerdctl",
           "crictl", "ctr", "amd-smi", "rocm-smi", "python3 -m venv", "uv", "nvidia-ctk",
           "thanos", "mimirtool", "lightkube", "grpcurl", "jq", "tar")  # fmt: skip

_SPAN = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FLAG = re.compile(r"(?<![\w.-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?![\w.])")
_MAKE = re.compile(r"(?<![\w-])make\s+((?:[a-z][\w-]*\s*)+)")


def code_of(path: Path) -> list[str]:
    """The lines of fenced blocks (a line ending in a backslash joined to the next), then the
    inline code spans."""
    text = path.read_text()
    pieces = [
        line for block in _FENCE.findall(text) for line in block.replace("\\\n", " ").splitlines()
    ]
    prose = _FENCE.sub("", text)
    return pieces + _SPAN.findall(prose)


def _is_path(token: str) -> bool:
    return token in TOP_FILES or any(token.startswith(t + "/") for t in TOP)


def referenced_paths(path: Path) -> set[str]:
    found = set()
    relative_links = {
        str((path.parent / target.split("#")[0]).resolve().relative_to(REPO))
        for target in _LINK.findall(path.read_text())
        if not re.match(r"[a-z]+:|#", target)
        and (path.parent / target.split("#")[0]).resolve().is_relative_to(REPO)
    }
    for piece in code_of(path):
        for token in re.split(r"[\s\"'=(),;]+", piece):
            token = token.rstrip(".:").split("#")[0]
            token = re.sub(r":\d+(-\d+)?$", "", token)
            if _is_path(token) and not re.search(r"[<>{}$*?\[\]|]|\.\.\.", token):
                found.add(token.rstrip("/"))
    return found | relative_links


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = [
        f"{doc.relative_to(REPO)}: {p}"
        for doc in DOCS
        for p in sorted(referenced_paths(doc))
        if p not in EXAMPLES | NOT_PATHS and not (REPO / p).exists()
    ]
    assert not missing, "\n".join(missing)


@functools.cache
def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*)\s*:(?!=)", text, re.M))


def test_every_make_target_the_docs_name_exists() -> None:
    missing = []
    for doc in DOCS:
        for piece in code_of(doc):
            for group in _MAKE.findall(piece):
                for word in group.split():
                    if word not in make_targets():
                        missing.append(f"{doc.relative_to(REPO)}: make {word} ({piece.strip()})")
    assert not missing, "\n".join(missing)


@functools.cache
def known_flags() -> set[str]:
    """gpuscope's flags, the agent's and each command's (from their --help), and those the
    repository's scripts and benchmarks declare (their string literals)."""
    helps = [subprocess.run([*GPUSCOPE, "--help"], capture_output=True, text=True, check=True)]
    commands = re.findall(r"^\s{2,}(\w[\w-]*)\s{2,}", helps[0].stdout, re.M)
    for command in commands:
        helps.append(
            subprocess.run(
                [*GPUSCOPE, command, "--help"], capture_output=True, text=True, check=False
            )
        )
    flags = {f for h in helps for f in _FLAG.findall(h.stdout)}
    for folder in ("scripts", "bench", "agent", "exporters", "tests/doubles"):
        for source in (REPO / folder).rglob("*"):
            if source.is_file() and (source.suffix == ".py" or source.name == "gpu-check"):
                flags |= set(re.findall(r"[\"']--([a-z][a-z0-9-]*)[\"'=]", source.read_text()))
    return flags


def _checked_for_flags(piece: str) -> bool:
    stripped = piece.strip().lstrip("$# ")
    return not any(stripped == c or stripped.startswith(c + " ") for c in FOREIGN)


def test_every_gpuscope_flag_the_docs_name_exists() -> None:
    missing = []
    for doc in DOCS:
        for piece in code_of(doc):
            if not _checked_for_flags(piece):
                continue
            for flag in _FLAG.findall(piece):
                if flag not in known_flags() | FOREIGN_FLAGS:
                    missing.append(f"{doc.relative_to(REPO)}: --{flag} ({piece.strip()[:80]})")
    assert not missing, "\n".join(missing)

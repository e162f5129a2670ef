"""A GPU-only agent imports what its collector needs, and nothing else (issue #24).

Every module an agent imports is paid for at every start (start to first GPU series) and in
every node's memory, so what a `--collectors gpu` agent loads is checked here: the real
`gpuscope` entry point (`cli.main`) runs in a child process on the fake NVML until its first
text-format /metrics holds a GPU series, and then lists `sys.modules`. The `labels` and
`check` commands, the labels loop, the other collectors' sources, the Kubernetes and gRPC
clients, bcc, the web configuration's TLS and auth, asyncio and ssl (only a server with TLS
runs on asyncio), and prometheus_client (only OpenMetrics needs it) must not be among them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.support import free_port
from tests.support.common import REPO

# The child: the agent's own main(); a thread that waits for the first GPU series over a
# plain socket (urllib would import http.client and email into the process it inspects),
# notes sys.modules, and stops the agent as SIGTERM does.
CHILD = r"""
import json, os, signal, socket, sys, threading, time

from gpuscope.agent import codecache
from gpuscope.agent.app import cli

port = int(sys.argv[1])
seen = []


def first_gpu_series():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                body = b""
                while chunk := s.recv(65536):
                    body += chunk
            if b"\ngpuscope_gpu_" in body:
                seen.extend(sorted(sys.modules))
                break
        except OSError:
            pass
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=first_gpu_series, daemon=True).start()
rc = cli.main(["--listen", f"127.0.0.1:{port}", "--collectors", "gpu", "--labels-mode", "none",
               "--log-level", "warning"])
print("MODULES", json.dumps(seen))
print("CACHED", codecache.hits)
print("COMPILED", codecache.compiled)
sys.exit(rc)
"""

# Whole packages (and what is under them) a GPU-only agent has no use for.
NOT_IMPORTED = (
    "prometheus_client",  # the text format is written by exporters/prometheus/families.py
    "gpuscope.agent.check",  # `gpuscope check` (the package itself holds only its summary)
    "gpuscope.agent.labels.loop",
    "gpuscope.exporters.labels",
    "gpuscope.agent.net.source",
    "gpuscope.agent.net.records",  # collector declarations name no records (runtime/spec.py)
    "gpuscope.agent.amd.records",
    "gpuscope.agent.k8s.records",
    "gpuscope.exporters.prometheus.amd",  # the catalog is assembled from metric specs
    "gpuscope.exporters.prometheus.net",
    "gpuscope.exporters.prometheus.dcgm",  # --dcgm-compat is off by default
    "gpuscope.exporters.prometheus.catalog_dcgm",
    "gpuscope.exporters.prometheus.net_devices",
    "gpuscope.agent.net.ebpf",
    "gpuscope.agent.net.bpf_program",
    "gpuscope.agent.net.nic",
    "gpuscope.agent.net.rdma",
    "gpuscope.agent.net.placement",
    "gpuscope.agent.amd.source",
    "gpuscope.agent.amd.library",
    "gpuscope.agent.k8s.client",
    "gpuscope.agent.k8s.listwatch",
    "gpuscope.agent.k8s.kubelet_source",
    "gpuscope.agent.k8s.pods_source",
    "gpuscope.agent.k8s.dra_source",
    "gpuscope.agent.k8s.podresources.client",
    "amdsmi",
    "bcc",
    "lightkube",
    "grpc",
    "google.protobuf",
    "yaml",
    "bcrypt",
    "hashlib",  # OpenSSL's hashes: bounded names and basic auth import them when they hash
    "hmac",
    "email",
    "http.server",
    "urllib.request",
    # The event loop and TLS: a server without TLS runs on agent/serve/selector_loop.py.
    "asyncio",
    "ssl",
    "_ssl",
)
# Allowed: the `check` package's __init__ (its one-line summary for `gpuscope --help`), and
# the label validation that checks --label-prefix when the flags are parsed.
ALLOWED = frozenset(
    {"gpuscope.agent.check", "gpuscope.exporters.labels", "gpuscope.exporters.labels.validation"}
)


def run_gpu_agent(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """CHILD on a fake pcie-l40s: the agent's main() until its first GPU series."""
    fake = FakeNvml("pcie-l40s", tmp_path / "state")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(free_port())],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")} | fake.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.pinned_bindings(
    "with 12.535 the agent's one-time note on what the bindings lack reads their version "
    "through importlib.metadata (agent/gpu/nvml.py), which imports email"
)
def test_a_gpu_only_agent_imports_only_what_its_collector_needs(tmp_path: Path) -> None:
    proc = run_gpu_agent(tmp_path)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("MODULES "))
    modules = json.loads(line.removeprefix("MODULES "))
    # What the agent did import: the GPU source and its bindings, the text renderer.
    for needed in ("gpuscope.agent.gpu.source", "pynvml", "gpuscope.exporters.prometheus.gpu"):
        assert needed in modules, f"{needed} not imported: did the agent serve GPU series?"
    # What the NVML bindings import themselves is theirs, not the agent's (the oldest
    # nvidia-ml-py that `make oldest-nvml` runs imports email, for one).
    bindings = subprocess.run(
        [sys.executable, "-c", "import json, sys, pynvml; print(json.dumps(sorted(sys.modules)))"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    theirs = set(json.loads(bindings.stdout))
    unwanted = sorted(
        m
        for m in modules
        if m not in ALLOWED
        and m not in theirs
        and any(_under(m, package) for package in NOT_IMPORTED)
    )
    assert unwanted == [], f"a GPU-only agent imported {unwanted}"


def test_a_warm_start_compiles_no_dataclass_method(tmp_path: Path) -> None:
    """After `codecache.warm()` (what the image runs at build), the GPU-only agent creates
    its ~100 dataclasses from kept code: it compiles none of their methods (issue #24: that
    compiling was about a third of its start)."""
    warm = "from gpuscope.agent import codecache; codecache.warm()"
    subprocess.run([sys.executable, "-c", warm], cwd=REPO, check=True, capture_output=True)
    out = run_gpu_agent(tmp_path).stdout
    compiled = next(x for x in out.splitlines() if x.startswith("COMPILED "))
    used = next(x for x in out.splitlines() if x.startswith("CACHED "))
    assert int(used.split()[1]) > 300
    assert compiled == "COMPILED 0"


# The child: every module of the package imported as `codecache.warm()` walks them (a module
# whose optional dependency is missing is skipped), then every dataclass defined in one of
# them, nested ones included, and those whose docstring is the one `dataclasses` made: the
# class name and its signature (or the name alone where no signature could be had).
DATACLASSES = r"""
import dataclasses, importlib, json, pkgutil, sys

import gpuscope

for info in pkgutil.walk_packages(gpuscope.__path__, "gpuscope.", onerror=lambda _name: None):
    if info.name.endswith(".__main__"):
        continue
    try:
        importlib.import_module(info.name)
    except Exception:
        continue


def classes(namespace, module, seen):
    for value in list(vars(namespace).values()):
        if isinstance(value, type) and value.__module__ == module and value not in seen:
            seen.add(value)
            yield value
            yield from classes(value, module, seen)


found = {}
for name, module in list(sys.modules.items()):
    if name.startswith("gpuscope.") and module is not None:
        for cls in classes(module, name, set()):
            if dataclasses.is_dataclass(cls):
                found[f"{name}.{cls.__qualname__}"] = cls
generated = sorted(
    name
    for name, cls in found.items()
    if not cls.__doc__ or cls.__doc__ == cls.__name__ or cls.__doc__.startswith(cls.__name__ + "(")
)
print(json.dumps({"dataclasses": len(found), "generated": generated}))
"""


def test_every_dataclass_says_what_it_is() -> None:
    """`dataclasses` gives a class without a docstring one made from `inspect.signature(cls)`,
    some 30-50 µs a class at every start (issue #24): each says what it is instead."""
    proc = subprocess.run(
        [sys.executable, "-c", DATACLASSES], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = json.loads(proc.stdout)
    assert found["dataclasses"] > 100  # the walk found the package's modules
    assert found["generated"] == [], (
        f"{len(found['generated'])} dataclasses have no docstring, so `dataclasses` computes "
        "one with inspect.signature() each time the class is created, some 30-50 µs a class "
        "paid at every agent start (issue #24); give each a docstring that says what it is: "
        + ", ".join(found["generated"])
    )

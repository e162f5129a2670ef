"""The DaemonSet's capabilities are enough, and each of them is needed.

The real agent runs here as a container runtime would start it from
daemonset/base/daemonset.yaml: uid 0, every capability outside the manifest's `add` list
removed from the bounding set, nothing inheritable or ambient, no_new_privs set
(allowPrivilegeEscalation: false). The capability list is read from the rendered manifest, so
the test and the DaemonSet cannot drift apart, and the agent compiles its probes against the
header tree the image ships (daemonset/image/fallback-kernel-headers.sh, as the Dockerfile
runs it).

- With exactly that set every collector comes up, in both traffic modes (`cgroup_skb` is what
  kernels before 6.3 get in the default `auto` mode).
- Without any one of them the net collector fails, with the documented message
  (docs/deploy.md), and the others keep working.
- The kernel agrees: loading the probes directly, without the agent's up-front check, fails
  without each capability. So the agent's check is not stricter than the kernel.
- As a non-root user with the same capabilities, tracefs is out of reach: why runAsUser is 0.
  That user runs copies of the agent and its dependencies in a world-readable directory, so
  the checkout may sit where only root can enter (a CI clone under `mktemp -d`).

Needs root, capsh (libcap2-bin), BPF and tracefs, like tests/kernel/test_net_kernel.py.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.doubles.fakenvml.control import LIB_PATH, FakeNvml
from tests.support import REPO
from tests.support.manifests import capabilities, render
from tests.support.promtext import Exposition

pytestmark = [
    pytest.mark.slow,
    pytest.mark.kernel,
    pytest.mark.e2e,
    pytest.mark.root(reason="the agent runs as a container runtime would start it"),
]

COLLECTORS = ("gpu", "net", "nic", "rdma")  # those that need host privileges, if any
DOCS = REPO / "docs" / "deploy.md"

# For each capability of the manifest: the traffic mode in which the net collector needs it,
# and what the agent logs without it. A capability added to the manifest without an entry
# here (a reason, shown by a failure) fails test_every_capability_is_accounted_for.
NEEDED_FOR = {
    "CAP_BPF": (
        "auto",
        "collector net failed: missing capabilities CAP_BPF (or CAP_SYS_ADMIN) to load eBPF probes",
    ),
    "CAP_PERFMON": (
        "auto",
        "collector net failed: missing capabilities CAP_PERFMON (or CAP_SYS_ADMIN) "
        "to load eBPF probes",
    ),
    "CAP_NET_ADMIN": (
        "cgroup_skb",
        "collector net failed: missing capabilities CAP_NET_ADMIN (or CAP_SYS_ADMIN) "
        "to load eBPF probes",
    ),
}
NON_ROOT_ERROR = "collector net failed: PermissionError: [Errno 13] Permission denied: "


@functools.cache
def manifest_caps() -> tuple[str, ...]:
    """The capabilities the rendered DaemonSet adds (CAP_BPF, ...)."""
    return tuple(capabilities(render("base")))


@functools.cache
def _all_capabilities() -> list[str]:
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    out = subprocess.run(
        ["capsh", f"--decode={(1 << (last + 1)) - 1:x}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [c.upper() for c in out.strip().split("=", 1)[1].split(",")]


def _mask(caps: tuple[str, ...] | list[str]) -> int:
    """The CapEff bit mask of these capabilities (capsh --decode lists them in bit order)."""
    names = _all_capabilities()
    return sum(1 << names.index(c) for c in caps)


def contained(keep: tuple[str, ...] | list[str], *, uid: int = 0) -> list[str]:
    """A capsh command line that runs what follows as a container with `keep` would."""
    drop = [c.lower() for c in _all_capabilities() if c not in keep]
    keep_l = ",".join(c.lower() for c in keep)
    if uid == 0:
        prefix = ["capsh", f"--drop={','.join(drop)}", "--inh=", "--noamb"]
    else:
        # A non-root user that keeps the capabilities across exec (ambient): the most
        # generous case. Container runtimes do not even do that; a non-root process loses
        # the added capabilities at exec unless its binary carries file capabilities.
        prefix = [
            "capsh",
            f"--gid={uid}",
            f"--groups={uid}",
            "--keep=1",
            f"--uid={uid}",
            f"--drop={','.join(drop)}",
            f"--inh={keep_l}",
            f"--addamb={keep_l}",
        ]
    return [*prefix, "--no-new-privs", "--", "-c", 'exec "$@"', "sh"]


@pytest.fixture(scope="module", autouse=True)
def _requirements() -> None:
    if shutil.which("capsh") is None:
        pytest.fail("capsh missing: `make deps` installs libcap2-bin")
    missing = [c for c in manifest_caps() if c not in _bounding()]
    if missing:
        pytest.fail(f"this machine's own bounding set lacks {missing}")


def _bounding() -> list[str]:
    status = Path("/proc/self/status").read_text()
    (line,) = [x for x in status.splitlines() if x.startswith("CapBnd:")]
    mask = int(line.split()[1], 16)
    return [c for i, c in enumerate(_all_capabilities()) if mask >> i & 1]


@pytest.fixture(scope="module")
def image_headers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fallback header tree, built by the script the Dockerfile runs."""
    out = tmp_path_factory.mktemp("image") / "kernel-headers"
    subprocess.run(
        ["bash", str(REPO / "daemonset" / "image" / "fallback-kernel-headers.sh"), str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    """World-readable scratch space (the non-root run reads the fake NVML state from it)."""
    path = Path(tempfile.mkdtemp(prefix="gpuscope-lp-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _runtime_distributions(name: str) -> list[importlib.metadata.Distribution]:
    """The installed distributions `name` needs at run time (its requirements, recursively;
    no extras)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = list(importlib.metadata.requires(name) or [])
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = req.name.lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist = importlib.metadata.distribution(req.name)
        todo.extend(dist.requires or [])
    return list(seen.values())


def world_readable_install(workdir: Path) -> dict[str, str]:
    """Copies, under the world-readable `workdir`, of what the agent needs to run as another
    user, who may not be able to enter the checkout: the gpuscope package (links followed),
    its installed runtime dependencies and the fake NVML library. Returns the environment
    that points the system interpreter at them."""
    site, lib = workdir / "site", workdir / "lib"
    if not site.exists():
        shutil.copytree(
            REPO / "gpuscope", site / "gpuscope", ignore=shutil.ignore_patterns("__pycache__")
        )
        for dist in _runtime_distributions("gpuscope"):
            for file in dist.files or []:
                if ".." in file.parts or "__pycache__" in file.parts:
                    continue  # console scripts outside site-packages; bytecode
                (site / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(str(dist.locate_file(file))), site / file)
        lib.mkdir()
        shutil.copy2(LIB_PATH, lib / LIB_PATH.name)
        for path in (workdir, *workdir.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
    return {"PYTHONPATH": str(site), "LD_LIBRARY_PATH": str(lib)}


@dataclass
class Run:
    success: dict[str, float]
    log: str
    cap_eff: int
    uid: int


def _readable_fake(workdir: Path) -> FakeNvml:
    """A fake NVML whose state a non-root agent can read."""
    fake = FakeNvml("dgx-h100", Path(tempfile.mkdtemp(dir=workdir)) / "state")
    fake.state_path.chmod(0o644)
    fake.state_path.parent.chmod(0o755)
    return fake


def _launch(
    keep: tuple[str, ...] | list[str],
    workdir: Path,
    headers: Path,
    extra: tuple[str, ...],
    uid: int,
    fake: FakeNvml,
    port: int,
) -> subprocess.Popen[str]:
    """The agent under `contained(keep, uid)`, with no GPUSCOPE_/BCC_ settings inherited
    and no /lib/modules tree, so it uses the image's kernel headers as the DaemonSet does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCOPE_", "BCC_"))}
    env |= fake.env() | {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    no_modules = workdir / "no-modules"  # force the image's tree: no /lib/modules/<release>
    no_modules.mkdir(exist_ok=True)
    python, cwd = sys.executable, REPO
    if uid != 0:  # the system interpreter on copies: nothing read from the checkout
        python, cwd = os.path.realpath(sys.executable), workdir
        env |= world_readable_install(workdir)
    cmd = [
        python, "-m", "gpuscope",
        "--listen", f"127.0.0.1:{port}",
        "--collectors", ",".join(COLLECTORS),
        "--labels-mode", "none",
        "--kernel-modules", str(no_modules),
        "--kernel-headers", str(headers),
        *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        [*contained(keep, uid=uid), *cmd],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _first_scrape(proc: subprocess.Popen[str], port: int) -> tuple[str, str]:
    """/metrics once /readyz answers ("" if it never does, or the agent exits), and the
    agent's /proc status read while it still runs, for its capabilities and uid."""
    body = ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/metrics", timeout=10
                    ) as m:
                        body = m.read().decode()
                    break
        except OSError:
            time.sleep(0.05)
    status = Path(f"/proc/{proc.pid}/status").read_text() if proc.poll() is None else ""
    return body, status


def _stop(proc: subprocess.Popen[str]) -> str:
    """Terminate the agent (kill it if it hangs) and return its log."""
    proc.terminate()
    try:
        log, _ = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        log, _ = proc.communicate()
    return log


def run_agent(
    keep: tuple[str, ...] | list[str],
    workdir: Path,
    headers: Path,
    *extra: str,
    uid: int = 0,
) -> Run:
    """Start the agent under `keep`, wait for its first collection, scrape once, stop it."""
    fake = _readable_fake(workdir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = _launch(keep, workdir, headers, extra, uid, fake, port)
    try:
        body, status = _first_scrape(proc, port)
    finally:
        log = _stop(proc)
    assert body, f"the agent never became ready under {keep}:\n{log}"
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return Run(
        success=dict(Exposition(body).by_label("gpuscope_collector_success", "collector")),
        log=log,
        cap_eff=int(fields["CapEff"].strip(), 16),
        uid=int(fields["Uid"].split()[1]),  # effective uid
    )


def test_manifest_lists_only_what_the_probes_need() -> None:
    # CAP_SYS_ADMIN would make every other entry moot; the set must stay this small.
    assert sorted(manifest_caps()) == ["CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"]


def test_every_capability_is_accounted_for() -> None:
    assert set(NEEDED_FOR) == set(manifest_caps())
    text = DOCS.read_text()
    for cap, (_, message) in NEEDED_FOR.items():
        assert cap in text and message in text, f"docs/deploy.md must show {message!r}"
    assert NON_ROOT_ERROR in text


@pytest.mark.parametrize("mode", ["auto", "cgroup_skb"])
def test_the_manifests_capabilities_are_enough(
    mode: str, workdir: Path, image_headers: Path
) -> None:
    run = run_agent(manifest_caps(), workdir, image_headers, "--net-traffic-mode", mode)
    assert run.uid == 0
    assert run.cap_eff == _mask(manifest_caps()), "the agent ran with other capabilities"
    # the attribution stage reports as collector="attribution" too
    assert run.success == dict.fromkeys((*COLLECTORS, "attribution"), 1.0), run.log
    assert f"kernel headers {image_headers}, from fallback" in run.log
    assert "failed" not in run.log, run.log


@pytest.mark.parametrize("cap", sorted(NEEDED_FOR))
def test_without_each_capability_net_fails(cap: str, workdir: Path, image_headers: Path) -> None:
    mode, message = NEEDED_FOR[cap]
    keep = [c for c in manifest_caps() if c != cap]
    run = run_agent(keep, workdir, image_headers, "--net-traffic-mode", mode)
    assert run.cap_eff == _mask(keep)
    expected = {"gpu": 1.0, "net": 0.0, "nic": 1.0, "rdma": 1.0, "attribution": 1.0}
    assert run.success == expected, run.log
    assert message in run.log, run.log


LOAD_DIRECTLY = """
import sys
from pathlib import Path
from gpuscope.agent.net.bpf_program import MapLimits
from gpuscope.agent.net.ebpf import BpfProbes, HeaderTree, plan_probes, tracefs_root
from gpuscope.agent.k8s.cgroups import detect_cgroup_v2_root
probes = BpfProbes(plan_probes(tracefs_root(), sys.argv[1]), MapLimits(cgroups=64, sockets=1024))
try:
    root = detect_cgroup_v2_root(Path("/sys/fs/cgroup"))
    probes.load(HeaderTree(Path(sys.argv[2]), "fallback"), root)
except BaseException as exc:
    print("refused:", str(exc).splitlines()[-1] if str(exc) else repr(exc))
    sys.exit(3)
finally:
    probes.close()
print("loaded")
"""


@pytest.mark.parametrize("cap", sorted(NEEDED_FOR))
def test_the_kernel_refuses_without_each_capability(
    cap: str, workdir: Path, image_headers: Path
) -> None:
    mode, _ = NEEDED_FOR[cap]

    def load(keep: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*contained(keep), sys.executable, "-c", LOAD_DIRECTLY, mode, str(image_headers)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    full = load(list(manifest_caps()))
    assert full.returncode == 0 and "loaded" in full.stdout, full.stdout + full.stderr
    without = load([c for c in manifest_caps() if c != cap])
    assert without.returncode == 3, without.stdout + without.stderr
    assert "refused:" in without.stdout


def test_non_root_cannot_read_tracefs(workdir: Path, image_headers: Path) -> None:
    run = run_agent(manifest_caps(), workdir, image_headers, uid=65534)
    assert run.uid == 65534 and run.cap_eff == _mask(manifest_caps())
    assert run.success["net"] == 0.0 and run.success["nic"] == 1.0, run.log
    assert NON_ROOT_ERROR + "'/sys/kernel/tracing/events'" in run.log, run.log

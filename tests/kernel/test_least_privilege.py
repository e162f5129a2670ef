"""The DaemonSet's capabilities are enough, and each of them is needed: the bpf-load init
container's to compile, attach and pin the probes, the agent's (CAP_BPF alone) to read them.

Both run here as a container runtime would start them from daemonset/base/daemonset.yaml:
uid 0, every capability outside the container's `add` list removed from the bounding set,
nothing inheritable or ambient, no_new_privs set (allowPrivilegeEscalation: false). The
capability lists are read from the rendered manifest, so the test and the DaemonSet cannot
drift apart, and the helper compiles the probes against the header tree the image ships
(daemonset/image/fallback-kernel-headers.sh, as the Dockerfile runs it).

- With exactly the helper's set the probes load, in both traffic modes (`cgroup_skb` is what
  kernels before 6.3 get in the default `auto` mode); with exactly the agent's set (CAP_BPF)
  every collector comes up on those pins. CAP_PERFMON and CAP_NET_ADMIN are not the agent's.
- Without any one of its capabilities the helper fails with the documented message
  (docs/deploy.md). The agent needs CAP_BPF only on kernels before 6.5 (which moved the
  unprivileged-BPF check to map and program creation): there, without it, the net collector
  fails with the documented message; from 6.5 on, an agent with no capability at all reads
  the pins. An agent that finds no pins runs the helper itself, which then lacks
  CAP_PERFMON: one line says so.
- The kernel agrees: loading the probes, or opening the pinned maps, directly, without the
  up-front checks, fails without each capability. So the checks are not stricter than the
  kernel.
- As a non-root user with the same capabilities, tracefs is out of reach: why runAsUser is 0.
  That user runs copies of gpuscope and its dependencies in a world-readable directory, so
  the checkout may sit where only root can enter (a CI clone under `mktemp -d`).

Needs root, capsh (libcap2-bin), BPF, bpffs and tracefs, like tests/kernel/test_net_kernel.py.
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
from tests.support.bpf import fresh_pin_root
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


def _missing(cap: str, what: str) -> str:
    return f"missing capabilities {cap} (or CAP_SYS_ADMIN) {what}"


# For each capability of the helper's container: the traffic mode in which loading needs it,
# and what the helper says without it. A capability added to the manifest without an entry
# here (a reason, shown by a failure) fails test_every_capability_is_accounted_for.
HELPER_NEEDS = {
    "CAP_BPF": ("auto", "gpuscope bpf-load: " + _missing("CAP_BPF", "to load eBPF probes")),
    "CAP_PERFMON": ("auto", "gpuscope bpf-load: " + _missing("CAP_PERFMON", "to load eBPF probes")),
    "CAP_NET_ADMIN": (
        "cgroup_skb",
        "gpuscope bpf-load: " + _missing("CAP_NET_ADMIN", "to load eBPF probes"),
    ),
}
AGENT_NEEDS = {
    "CAP_BPF": "collector net failed: "
    + _missing("CAP_BPF", "to read the pinned eBPF maps")
    + " (Linux before 6.5, with kernel.unprivileged_bpf_disabled set)",
}
# Linux 6.5 checks unprivileged BPF at map and program creation only: opening and reading
# pinned maps needs no capability from then on.
READ_NEEDS_CAP_BPF = tuple(int(x) for x in os.uname().release.split(".")[:2]) < (6, 5)
NO_PINS_NO_PERFMON = "collector net failed: bpf-load helper: " + _missing(
    "CAP_PERFMON", "to load eBPF probes"
)
NON_ROOT_ERROR = "gpuscope bpf-load: PermissionError: [Errno 13] Permission denied: "


@functools.cache
def helper_caps() -> tuple[str, ...]:
    """The capabilities the rendered DaemonSet's bpf-load init container adds."""
    return tuple(capabilities(render("base"), helper=True))


@functools.cache
def agent_caps() -> tuple[str, ...]:
    """The capabilities the rendered DaemonSet's agent container adds (CAP_BPF, ...)."""
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
    missing = [c for c in {*helper_caps(), *agent_caps()} if c not in _bounding()]
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


def _environment(
    workdir: Path, uid: int, fake: FakeNvml | None
) -> tuple[str, Path, dict[str, str]]:
    """The interpreter, working directory and environment of a contained gpuscope: no
    GPUSCOPE_/BCC_ settings inherited; for another uid, copies it can read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCOPE_", "BCC_"))}
    env |= {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    if fake is not None:
        env |= fake.env()
    python, cwd = sys.executable, REPO
    if uid != 0:  # the system interpreter on copies: nothing read from the checkout
        python, cwd = os.path.realpath(sys.executable), workdir
        env |= world_readable_install(workdir)
    return python, cwd, env


def _host_flags(workdir: Path, headers: Path, pins: Path) -> list[str]:
    """No /lib/modules tree, so the image's kernel headers are used as the DaemonSet does."""
    no_modules = workdir / "no-modules"
    no_modules.mkdir(exist_ok=True)
    return ["--kernel-modules", str(no_modules), "--kernel-headers", str(headers),
            "--bpf-pin-root", str(pins)]  # fmt: skip


def run_helper(
    keep: tuple[str, ...] | list[str],
    workdir: Path,
    headers: Path,
    pins: Path,
    mode: str,
    *,
    uid: int = 0,
) -> subprocess.CompletedProcess[str]:
    """`gpuscope bpf-load` under `contained(keep, uid)`, as the init container runs it."""
    python, cwd, env = _environment(workdir, uid, None)
    cmd = [python, "-m", "gpuscope", "bpf-load", "--net-traffic-mode", mode,
           *_host_flags(workdir, headers, pins)]  # fmt: skip
    return subprocess.run(
        [*contained(keep, uid=uid), *cmd],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _launch(
    keep: tuple[str, ...] | list[str],
    workdir: Path,
    headers: Path,
    pins: Path,
    extra: tuple[str, ...],
    fake: FakeNvml,
    port: int,
) -> subprocess.Popen[str]:
    """The agent under `contained(keep)`."""
    python, cwd, env = _environment(workdir, 0, fake)
    cmd = [
        python, "-m", "gpuscope",
        "--listen", f"127.0.0.1:{port}",
        "--collectors", ",".join(COLLECTORS),
        "--labels-mode", "none",
        *_host_flags(workdir, headers, pins),
        *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        [*contained(keep), *cmd],
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
    pins: Path,
    *extra: str,
) -> Run:
    """Start the agent under `keep`, wait for its first collection, scrape once, stop it."""
    fake = _readable_fake(workdir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = _launch(keep, workdir, headers, pins, extra, fake, port)
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


@pytest.fixture
def pins() -> Iterator[Path]:
    with fresh_pin_root("least-privilege") as root:
        yield root


def test_manifest_lists_only_what_each_container_needs() -> None:
    # CAP_SYS_ADMIN would make every other entry moot; the sets must stay this small.
    assert sorted(helper_caps()) == ["CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"]
    assert sorted(agent_caps()) == ["CAP_BPF"]


def test_every_capability_is_accounted_for() -> None:
    assert set(HELPER_NEEDS) == set(helper_caps())
    assert set(AGENT_NEEDS) == set(agent_caps())
    text = DOCS.read_text()
    messages = [m for _, m in HELPER_NEEDS.values()] + list(AGENT_NEEDS.values())
    for message in [*messages, NO_PINS_NO_PERFMON, NON_ROOT_ERROR]:
        assert message in text, f"docs/deploy.md must show {message!r}"


@pytest.mark.parametrize("mode", ["auto", "cgroup_skb"])
def test_the_manifests_capabilities_are_enough(
    mode: str, workdir: Path, image_headers: Path, pins: Path
) -> None:
    helper = run_helper(helper_caps(), workdir, image_headers, pins, mode)
    assert helper.returncode == 0, helper.stderr
    assert f"headers {image_headers} (fallback)" in helper.stderr, helper.stderr
    run = run_agent(agent_caps(), workdir, image_headers, pins, "--net-traffic-mode", mode)
    assert run.uid == 0
    assert run.cap_eff == _mask(agent_caps()), "the agent ran with other capabilities"
    # the attribution stage reports as collector="attribution" too
    assert run.success == dict.fromkeys((*COLLECTORS, "attribution"), 1.0), run.log
    assert "running the bpf-load helper" not in run.log, "the agent loaded its own probes"
    assert "failed" not in run.log, run.log


@pytest.mark.parametrize("cap", sorted(HELPER_NEEDS))
def test_without_each_capability_the_helper_fails(
    cap: str, workdir: Path, image_headers: Path, pins: Path
) -> None:
    mode, message = HELPER_NEEDS[cap]
    helper = run_helper([c for c in helper_caps() if c != cap], workdir, image_headers, pins, mode)
    assert helper.returncode == 1, helper.stderr
    assert helper.stderr.strip().splitlines()[-1] == message, helper.stderr
    assert not pins.exists() or not any(pins.iterdir()), "a refused load left pins"


def test_without_cap_bpf_the_agent_reads_pins_only_from_linux_6_5(
    workdir: Path, image_headers: Path, pins: Path
) -> None:
    assert run_helper(helper_caps(), workdir, image_headers, pins, "auto").returncode == 0
    run = run_agent([], workdir, image_headers, pins)
    assert run.cap_eff == 0
    net = 0.0 if READ_NEEDS_CAP_BPF else 1.0
    expected = {"gpu": 1.0, "net": net, "nic": 1.0, "rdma": 1.0, "attribution": 1.0}
    assert run.success == expected, run.log
    assert (AGENT_NEEDS["CAP_BPF"] in run.log) == READ_NEEDS_CAP_BPF, run.log


def test_an_agent_without_pins_cannot_load_them_with_its_own_capabilities(
    workdir: Path, image_headers: Path, pins: Path
) -> None:
    run = run_agent(agent_caps(), workdir, image_headers, pins)
    assert run.success["net"] == 0.0 and run.success["gpu"] == 1.0, run.log
    assert NO_PINS_NO_PERFMON in run.log, run.log


LOAD_DIRECTLY = """
import sys
from pathlib import Path
from gpuscope.agent.bpf import loader
from gpuscope.agent.bpf.host import HeaderTree, tracefs_root
from gpuscope.agent.k8s.cgroups import detect_cgroup_v2_root
from gpuscope.agent.net.bpf_program import MapLimits
from gpuscope.agent.net.probes import NetFamily
root = detect_cgroup_v2_root(Path("/sys/fs/cgroup"))
family = NetFamily(sys.argv[1], MapLimits(cgroups=64, sockets=1024), root)
try:
    loader.load(family, pin_root=Path(sys.argv[3]), tracefs=tracefs_root(),
                headers=HeaderTree(Path(sys.argv[2]), "fallback"), cgroup_root=root)
except BaseException as exc:
    print("refused:", str(exc).splitlines()[-1] if str(exc) else repr(exc))
    sys.exit(3)
finally:
    loader.unload(Path(sys.argv[3]))
print("loaded")
"""

READ_DIRECTLY = """
import sys
from pathlib import Path
from gpuscope.agent.bpf.maps import PinnedFamily
(directory,) = Path(sys.argv[1]).glob("net-*")
try:
    family = PinnedFamily.open(directory)
    print("read", len(family["traffic"].entries()))
except OSError as exc:
    print("refused:", exc)
    sys.exit(3)
"""


def _direct(keep: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*contained(keep), sys.executable, "-c", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("cap", sorted(HELPER_NEEDS))
def test_the_kernel_refuses_to_load_without_each_capability(
    cap: str, image_headers: Path, pins: Path
) -> None:
    mode, _ = HELPER_NEEDS[cap]
    full = _direct(list(helper_caps()), LOAD_DIRECTLY, mode, str(image_headers), str(pins))
    assert full.returncode == 0 and "loaded" in full.stdout, full.stdout + full.stderr
    keep = [c for c in helper_caps() if c != cap]
    without = _direct(keep, LOAD_DIRECTLY, mode, str(image_headers), str(pins))
    assert without.returncode == 3, without.stdout + without.stderr
    assert "refused:" in without.stdout


def test_the_kernel_decides_whether_reading_pins_needs_cap_bpf(
    workdir: Path, image_headers: Path, pins: Path
) -> None:
    assert run_helper(helper_caps(), workdir, image_headers, pins, "auto").returncode == 0
    full = _direct(list(agent_caps()), READ_DIRECTLY, str(pins))
    assert full.returncode == 0 and "read" in full.stdout, full.stdout + full.stderr
    without = _direct([], READ_DIRECTLY, str(pins))
    if READ_NEEDS_CAP_BPF:
        assert without.returncode == 3, without.stdout + without.stderr
        assert "Operation not permitted" in without.stdout, without.stdout
    else:
        assert without.returncode == 0 and "read" in without.stdout, without.stderr


def test_non_root_cannot_read_tracefs(workdir: Path, image_headers: Path, pins: Path) -> None:
    helper = run_helper(helper_caps(), workdir, image_headers, pins, "auto", uid=65534)
    assert helper.returncode == 1, helper.stderr
    assert NON_ROOT_ERROR + "'/sys/kernel/tracing/events'" in helper.stderr, helper.stderr

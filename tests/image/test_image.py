"""The agent image, run from its own file system as the DaemonSet runs it (tests/support/image.py):
its version, its size budget, and an agent whose GPU, kubelet and net collectors work with
only what the image carries (its bcc, its fallback kernel headers) and what the DaemonSet
mounts. `make image` builds the image first; `make image-test` runs this module alone."""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuscope import __version__
from tests.doubles.fakeamdsmi.control import ROCM_DIR as FAKE_ROCM_DIR
from tests.doubles.fakeamdsmi.control import STATE_ENV as AMD_STATE_ENV
from tests.doubles.fakeamdsmi.control import FakeAmdSmi
from tests.doubles.fakeamdsmi.control import ensure_built as ensure_fake_amdsmi
from tests.doubles.fakenvml.control import STATE_ENV, FakeNvml
from tests.doubles.kubelet_server import KubeletServer, container, devices, pod
from tests.support.bpf import pin_root, remove_pins
from tests.support.common import free_port
from tests.support.image import (
    NVML_IN_IMAGE,
    ImageRoot,
    Mount,
    daemonset_args_env,
    daemonset_capabilities,
    daemonset_mounts,
    inspect,
    require_image,
)
from tests.support.manifests import container as agent_container
from tests.support.manifests import daemonset, render
from tests.support.promtext import Exposition

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.root(reason="chroot and mounts into the image's file system"),
]

SIZE_BUDGET = 500_000_000  # bytes (issue #20; docs/deploy.md, "Image size")
FALLBACK_HEADERS = "/opt/gpuscope/kernel-headers"  # the Dockerfile's fallback tree
FAKE_STATE_DIR = "/run/fakenvml"  # the fake NVML's script, inside the container


@pytest.fixture(scope="module")
def image() -> str:
    return require_image()


@pytest.fixture
def image_root(image: str) -> Iterator[ImageRoot]:
    with ImageRoot(image, f"gpuscope-image-test-{os.getpid()}") as root:
        yield root


def test_the_image_says_the_package_version(image: str, image_root: ImageRoot) -> None:
    run = image_root.chroot("gpuscope", "--version")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["gpuscope", __version__], run.stdout
    labels = inspect(image)["Config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__


def test_the_image_carries_the_first_contact_suite(image_root: ImageRoot) -> None:
    """`kubectl exec ds/gpuscope -- gpuscope check` (docs/deploy.md, "First contact")."""
    run = image_root.chroot("gpuscope", "check", "--help")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: gpuscope check"), run.stdout


def test_the_image_keeps_the_agents_dataclass_methods_compiled(image_root: ImageRoot) -> None:
    """The build writes the cache of compiled dataclass methods (agent/codecache.py) that the
    running image cannot write (PYTHONDONTWRITEBYTECODE, a read-only root): what a GPU
    agent imports before its first series creates its ~100 dataclasses compiling none of
    their methods (issue #24)."""
    probe = (
        "from gpuscope.agent import codecache\n"
        "import gpuscope.agent.app.cli, gpuscope.agent.app.agent, gpuscope.agent.gpu.source\n"
        "import gpuscope.exporters.prometheus.gpu\n"
        "print(codecache.hits, codecache.compiled)"
    )
    run = image_root.chroot("python3", "-c", probe)
    assert run.returncode == 0, run.stderr
    hits, compiled = map(int, run.stdout.split())
    assert hits > 300 and compiled == 0, run.stdout


def test_the_image_fits_its_size_budget(image: str) -> None:
    size = int(inspect(image)["Size"])
    assert size <= SIZE_BUDGET, f"{image} is {size / 1e6:.0f} MB, budget {SIZE_BUDGET / 1e6:.0f}"


def _installed_packages(root: Path) -> set[str]:
    status = (root / "var/lib/dpkg/status").read_text()
    packages, name = set(), ""
    for line in status.splitlines():
        if line.startswith("Package: "):
            name = line.split(": ", 1)[1]
        elif line.startswith("Status: ") and line.endswith(" installed"):
            packages.add(name)
    return packages


def test_the_image_carries_no_build_tools(image_root: ImageRoot) -> None:
    """What the agent never opens at run time stays out (docs/deploy.md, "Image size"): no
    compiler, header packages, perl beyond Debian's essential perl-base, pip or setuptools,
    and no downloaded packages."""
    installed = _installed_packages(image_root.root)
    assert "python3-bpfcc" in installed  # the reading is right
    unwanted = {"perl", "usrmerge", "gcc", "python3-pip", "python3-venv", "python3-setuptools"}
    unwanted |= {p for p in installed if p.startswith(("linux-headers-", "libclang-1", "clang"))}
    leftovers = sorted(installed & unwanted)
    site = next((image_root.root / "opt/gpuscope/venv/lib").glob("python3*/site-packages"))
    leftovers += [p.name for p in site.iterdir() if p.name in ("setuptools", "pip")]
    debs = list((image_root.root / "var/cache/apt/archives").glob("*.deb"))
    assert not leftovers and not debs, (leftovers, debs[:3])


def _scrape(port: int) -> Exposition | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return Exposition(resp.read().decode())
    except (OSError, urllib.error.URLError):
        return None


def _collectors_up(metrics: Exposition | None, names: tuple[str, ...]) -> bool:
    if metrics is None:
        return False
    success = metrics.by_label("gpuscope_collector_success", "collector")
    return all(success.get(n) == 1.0 for n in names)


def test_the_agent_runs_from_the_image_as_the_daemonset_mounts_it(
    image_root: ImageRoot, fake_lib: Path, tmp_path: Path
) -> None:
    state_dir = tmp_path / "fakenvml"
    state_dir.mkdir()
    fake = FakeNvml("dgx-h100", state_dir / "state")
    gpu0 = fake.profile["gpus"][0]["uuid"]
    empty_modules, empty_src = tmp_path / "lib-modules", tmp_path / "usr-src"
    empty_modules.mkdir()
    empty_src.mkdir()
    with contextlib.ExitStack() as stack:
        kubelet = stack.enter_context(KubeletServer())
        kubelet.set_pods(
            pod("team-a", "trainer-0", container("main", devices("nvidia.com/gpu", gpu0)))
        )
        # The host's bpffs as the pods see it: a directory of this test's on bpffs.
        bpffs = pin_root("image")
        bpffs.mkdir(parents=True, exist_ok=True)
        stack.callback(remove_pins, bpffs)
        fields = {
            "spec.nodeName": "image-node",
            "metadata.namespace": "gpuscope",
            "metadata.name": "gpuscope-abcde",
            "metadata.uid": "00000000-0000-0000-0000-000000000001",
        }
        # First the init container: on a node without kernel headers (the volumes' host
        # paths are optional), it compiles the probes against the image's fallback tree.
        helper_args, helper_env = daemonset_args_env(fields, helper=True)
        helper_log = tmp_path / "bpf-load.log"
        loading = image_root.spawn(
            daemonset_mounts(
                {"lib-modules": str(empty_modules), "usr-src": str(empty_src),
                 "bpffs": str(bpffs)}, helper=True,
            ),
            [*list(image_root.config["Entrypoint"]), *helper_args],
            helper_env,
            daemonset_capabilities(helper=True),
            helper_log,
        )  # fmt: skip
        assert loading.wait(120) == 0, helper_log.read_text()
        loaded = helper_log.read_text()
        assert f"headers {FALLBACK_HEADERS} (fallback)" in loaded, loaded
        mounts = daemonset_mounts({"pod-resources": str(kubelet.directory), "bpffs": str(bpffs)})
        # What the NVIDIA container runtime injects (here the fake), and the fake's script.
        mounts += [
            Mount(NVML_IN_IMAGE, str(fake_lib), True),
            Mount(FAKE_STATE_DIR, str(state_dir), True),
        ]
        args, env = daemonset_args_env(fields)
        port = free_port()
        # The manifest's own arguments, then what this node lacks: no API server (pods
        # collector, node labels) and a loopback port of the test's choosing.
        overrides = [
            f"--listen=127.0.0.1:{port}",
            "--collectors=gpu,net,nic,rdma,kubelet",
            "--labels-mode=none",
            "--kubelet-interval=1",
        ]
        entrypoint = list(image_root.config["Entrypoint"])
        log_path = tmp_path / "agent.log"
        agent = image_root.spawn(
            mounts,
            [*entrypoint, *args, *overrides],
            {**env, STATE_ENV: f"{FAKE_STATE_DIR}/state"},
            daemonset_capabilities(),
            log_path,
        )
        stack.callback(agent.wait, 15)
        stack.callback(agent.terminate)
        wanted = ("gpu", "kubelet", "net", "nic")
        deadline = time.monotonic() + 60
        metrics = None
        while time.monotonic() < deadline and agent.poll() is None:
            metrics = _scrape(port)
            if (
                _collectors_up(metrics, wanted)
                and metrics is not None
                and metrics.get("gpuscope_gpu_allocation_info", pod="trainer-0")
            ):
                break
            time.sleep(0.5)
        log = log_path.read_text()
        assert agent.poll() is None, f"the agent exited {agent.returncode}:\n{log}"
        assert metrics is not None, log
        assert _collectors_up(metrics, wanted), (
            metrics.by_label("gpuscope_collector_success", "collector"),
            log,
        )
        assert len(metrics.series("gpuscope_gpu_info")) == 8
        assert metrics.get("gpuscope_gpu_allocation_info", pod="trainer-0", uuid=gpu0) == 1.0
        assert metrics.get("gpuscope_build_info", version=__version__) == 1.0
        assert "running the bpf-load helper" not in log, "the agent loaded its own probes"
        assert metrics.series("gpuscope_bpf_probe_info"), log
        maps = Path(f"/proc/{agent.pid}/maps").read_text()
        assert not [lib for lib in ("libLLVM", "libclang", "libbcc") if lib in maps], maps


# --- AMD nodes (issue #23; docs/amd.md): the amdsmi bindings the image carries, and ROCm's
# libamd_smi.so from the node, where daemonset/overlays/amd mounts it ---------------------

AMD_PROBE = """
import ctypes, json, sys
try:
    import amdsmi
except KeyError as exc:
    print(json.dumps({"import": "KeyError", "args": list(exc.args)}))
    sys.exit(0)
from amdsmi import amdsmi_wrapper
for name in ("libdrm.so.2", "libdrm_amdgpu.so.1"):  # what libamd_smi.so dlopen()s
    ctypes.CDLL(name)
amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
handles = amdsmi.amdsmi_get_processor_handles()
print(json.dumps({"import": "ok", "lib": amdsmi_wrapper._libraries["libamd_smi.so"]._name,
                  "gpus": len(handles)}))
amdsmi.amdsmi_shut_down()
"""


def _amd_overlay_rocm() -> tuple[str, str]:
    """ROCM_PATH and the ROCm volume's mount path in the rendered amd overlay."""
    docs = render("overlays/amd")
    c = agent_container(docs)
    env = {e["name"]: e.get("value") for e in c["env"]}
    volumes = {v["name"]: v for v in daemonset(docs)["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [
        m
        for m in c["volumeMounts"]
        if volumes[m["name"]].get("hostPath", {}).get("path") == "/opt/rocm"
    ]
    return env["ROCM_PATH"], mount["mountPath"]


def _run_probe(
    image_root: ImageRoot, mounts: list[Mount], env: dict[str, str], tmp_path: Path
) -> dict[str, object]:
    log_path = tmp_path / "probe.log"
    proc = image_root.spawn(
        mounts, ["python3", "-c", AMD_PROBE], env, daemonset_capabilities(), log_path
    )
    assert proc.wait(60) == 0, log_path.read_text()
    lines = log_path.read_text().splitlines()
    return dict(json.loads(lines[-1]), output=lines[:-1])


def test_amdsmi_loads_the_library_where_the_amd_overlay_mounts_rocm(
    image_root: ImageRoot, tmp_path: Path
) -> None:
    """The node's ROCm (here the fake libamd_smi.so's tree) at the overlay's mount path, and
    the overlay's ROCM_PATH: the image's amdsmi loads it, its libdrm is there, and init works."""
    rocm_path, mount_path = _amd_overlay_rocm()
    assert rocm_path == mount_path
    ensure_fake_amdsmi()
    state_dir = tmp_path / "fakeamdsmi"
    state_dir.mkdir()
    fake = FakeAmdSmi("mi300x", state_dir / "state")
    mounts = [
        Mount(mount_path, str(FAKE_ROCM_DIR), True),
        Mount("/run/fakeamdsmi", str(state_dir), True),
    ]
    env = {"ROCM_PATH": rocm_path, AMD_STATE_ENV: "/run/fakeamdsmi/state"}
    got = _run_probe(image_root, mounts, env, tmp_path)
    assert got["import"] == "ok", got
    assert got["lib"] == f"{mount_path}/lib/libamd_smi.so", got
    assert got["gpus"] == len(fake.profile["gpus"]), got


def test_amdsmi_without_the_library_fails_at_import_with_key_error(
    image_root: ImageRoot, tmp_path: Path
) -> None:
    """A node without ROCm (or an NVIDIA node): importing amdsmi prints the loader's error and
    a hint on stdout, then raises KeyError('libamd_smi.so'), not ImportError. The collector
    must catch that (and keep the two lines out of a JSON log)."""
    rocm_path, _ = _amd_overlay_rocm()
    got = _run_probe(image_root, [], {"ROCM_PATH": rocm_path}, tmp_path)
    assert got["import"] == "KeyError" and got["args"] == ["libamd_smi.so"], got
    assert got["output"] == [
        f"{rocm_path}/lib/libamd_smi.so: cannot open shared object file: No such file or directory",
        "Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager",
    ], got

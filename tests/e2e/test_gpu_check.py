"""`gpuscope check` (agent/check/, and scripts/gpu-check, its shim for a checkout) is a
first-contact suite for a real GPU; here it runs on the fake NVML node, to prove that every
check passes on a driver that behaves and fails, naming the problem, on one that does not.

The fake has no CUDA, so the script's load generator is replaced by its `--fake-load` hook:
a command that tells this test (over a unix socket) to put a 50% duty cycle on GPU 0 and
register the script's pid as a compute process there, to clear it, or to inject an XID.
`nvidia-smi` is a stand-in on PATH that prints what this test wrote. Misbehaviour the fake
never shows is injected at the pynvml boundary of the script's process (and its children) by
tests/doubles/misbehaving_nvml/sitecustomize.py, driven by GPUSCOPE_MISBEHAVE.
"""

from __future__ import annotations

import json
import os
import shlex
import socketserver
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.support import GPUSCOPE, REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MIB = 1024 * 1024
SCRIPT = REPO / "scripts" / "gpu-check"
MISBEHAVING = REPO / "tests" / "doubles" / "misbehaving_nvml"
POWER_W = 200.0
CONTEXT_MIB = 512
HOOK_CLIENT = (
    "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
    "s.sendall(' '.join(sys.argv[2:]).encode() + b'\\n'); "
    "sys.exit(0 if s.makefile().readline() == 'ok\\n' else 1)"
)
ALL_CHECKS = {
    "load_generator",
    "util_samples",
    "idle_accounting",
    "busy_accounting",
    "process_util",
    "process_path",
    "fields",
    "costs",
    "xid_registration",
    "series_budget",
    "xid_delivery",
    "nvidia_smi",
    "nvml_errors",
}
# Dropping to the DaemonSet's capabilities (the process-path check) needs root.
NEEDS_ROOT = pytest.mark.root(reason="process_path drops to the DaemonSet's capabilities")
ALLOWED_PACKAGES = {"gpuscope", "pynvml", "prometheus_client", "sitecustomize"}


class FakeNode:
    """The fake NVML node, the nvidia-smi stand-in and the load hook's other end."""

    def __init__(self, tmp_path: Path, *, lie_about_power: bool = False) -> None:
        self.fake = FakeNvml("pcie-l40s", tmp_path / "state")
        for gpu in range(self.fake.gpu_count()):
            self.fake.set_utilization(gpu, 0)
            self.fake.set_power(gpu, POWER_W)
        self.lie_about_power = lie_about_power
        self.requests: list[str] = []
        self.smi_file = tmp_path / "smi.json"
        self.apps: list[str] = []
        self.bin_dir = tmp_path / "bin"
        self.bin_dir.mkdir()
        self._write_smi()
        self._stand_in()
        self.sock_dir = Path(tempfile.mkdtemp(prefix="gpuchk"))  # a socket path is short
        self.sock = self.sock_dir / "hook.sock"
        self.server = socketserver.UnixStreamServer(str(self.sock), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.sock.unlink(missing_ok=True)
        self.sock_dir.rmdir()

    def _handler(self) -> type[socketserver.StreamRequestHandler]:
        node = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                node.handle(self.rfile.readline().decode().split())
                self.wfile.write(b"ok\n")

        return Handler

    def handle(self, words: list[str]) -> None:
        """start <duty> <slot> <pid> | stop | xid <gpu>, as scripts/gpu-check sends them."""
        self.requests.append(" ".join(words))
        if words[0] == "start":
            duty, slot, pid = float(words[1]), float(words[2]), int(words[3])
            on, off = duty * slot, (1 - duty) * slot
            self.fake.set_utilization_pattern(0, [(on, 100, 50), (off, 0, 0)])
            self.fake.add_process(0, pid, CONTEXT_MIB * MIB, sm_util=50, mem_util=25)
            self.apps = [f"{self.fake.gpu_uuid(0)}, {pid}, {CONTEXT_MIB}"]
            self._write_smi()
        elif words[0] == "stop":
            self.fake.set_utilization(0, 0)
        elif words[0] == "xid":
            self.fake.inject_xid(int(words[1]), 31)

    def _write_smi(self) -> None:
        gpus = []
        for i in range(self.fake.gpu_count()):
            info = self.fake.gpu_info(i)
            watts = POWER_W * (1.5 if self.lie_about_power and i == 1 else 1.0)
            gpus.append(
                f"{i}, {info['uuid']}, {info['name']}, {int(info['mem_total']) // MIB}, "
                f"{self.fake.profile['driver_version']}, {watts:.2f}, 50"
            )
        self.smi_file.write_text(json.dumps({"gpus": gpus, "apps": self.apps}))

    def _stand_in(self) -> None:
        script = self.bin_dir / "nvidia-smi"
        script.write_text(
            f"#!{sys.executable}\nimport json, sys\n"
            f"cfg = json.load(open({str(self.smi_file)!r}))\n"
            "apps = any(a.startswith('--query-compute-apps') for a in sys.argv)\n"
            "print('\\n'.join(cfg['apps' if apps else 'gpus']))\n"
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC)

    def hook(self) -> str:
        return shlex.join([sys.executable, "-c", HOOK_CLIENT, str(self.sock)])


@pytest.fixture
def node(fake_lib: Path, tmp_path: Path) -> Iterator[Any]:
    made: list[FakeNode] = []

    def make(**kwargs: Any) -> FakeNode:
        made.append(FakeNode(tmp_path, **kwargs))
        return made[-1]

    yield make
    for n in made:
        n.close()


def run_check(
    node: FakeNode, tmp_path: Path, *args: str, misbehave: str = ""
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    env = os.environ | node.fake.env() | {"PATH": f"{node.bin_dir}:{os.environ['PATH']}"}
    if misbehave:
        env |= {
            "GPUSCOPE_MISBEHAVE": misbehave,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(MISBEHAVING), os.environ.get("PYTHONPATH")])
            ),
        }
    env.pop("OUT", None)
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            *GPUSCOPE,
            "check",
            "--quick",
            "--fake-load",
            node.hook(),
            "--assume-duty",
            "0.5",
            "--provoke-xid",
            "--json",
            str(report),
            *args,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert report.exists(), result.stdout + result.stderr
    return result, json.loads(report.read_text())


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


@NEEDS_ROOT
def test_every_check_passes_on_a_well_behaved_driver(node: Any, tmp_path: Path) -> None:
    fake = node()
    started = time.monotonic()
    result, report = run_check(fake, tmp_path)
    checks = by_name(report)
    out = result.stdout + result.stderr
    assert set(checks) == ALL_CHECKS, out
    for name, check in checks.items():  # no hardware-only part is left unchecked here
        assert check["status"] == "pass", f"{name}: {check['message']}\n{out}"
    assert result.returncode == 0, out
    assert time.monotonic() - started < 60
    assert fake.requests[0].startswith("start 0.5 0.1 ") and "stop" in fake.requests
    assert "xid 0" in fake.requests
    # The evidence the real run is for, as the fake shows it.
    samples = checks["util_samples"]["details"]
    assert samples["clock"] == "realtime"
    assert samples["idle"]["spacing_ms"]["median"] == pytest.approx(166.667, abs=1)
    assert checks["busy_accounting"]["details"]["busy_metric"] == pytest.approx(
        0.5 * checks["busy_accounting"]["details"]["window"], rel=0.05
    )
    assert checks["xid_delivery"]["details"]["new_xids"] == {"31": 1}
    costs = checks["costs"]["details"]
    assert costs["tick_s"]["n"] >= 3 and costs["collect_s"]["n"] >= 3
    assert any(
        "PcieThroughput" in r["call"] and r["used_by_agent"] for r in costs["per_tick_calls_gpu0"]
    )  # L40S: no byte counters
    gpm_rows = {r["call"]: r for r in costs["per_tick_calls_gpu0"] if "Gpm" in r["call"]}
    support = gpm_rows.pop("nvmlGpmQueryDeviceSupport (first tick only)")
    assert support["answered"]  # asked on every GPU: the L40S (Ada) answers "no GPM" ...
    assert gpm_rows and not any(r["used_by_agent"] for r in gpm_rows.values())  # ... so none
    assert checks["fields"]["details"]["unknown_field_probes"] == {
        "0": 3,
        "250": 3,
        "1000": 3,
        "9999": 3,
    }  # the fake's choice
    inventory = report["inventory"]
    assert inventory["driver"] == fake.fake.profile["driver_version"]
    assert set(inventory["imported_packages"]) <= ALLOWED_PACKAGES | {
        p
        for p in inventory["imported_packages"]
        if p.startswith("_")  # site's own hooks
    }
    assert "[PASS] busy_accounting: busy" in result.stdout


def test_a_misbehaving_driver_fails_each_check_naming_the_problem(
    node: Any, tmp_path: Path
) -> None:
    """Utilization values above 100, per-process values above 100, events refused, and
    nvidia-smi disagreeing on GPU 1's power."""
    result, report = run_check(
        node(lie_about_power=True),
        tmp_path,
        misbehave="util_over_100,proc_util_over_100,registration_refused",
    )
    checks = by_name(report)
    assert result.returncode == 1
    failed = {n: c["message"] for n, c in checks.items() if c["status"] == "fail"}
    assert "utilization samples above 100%" in failed["util_samples"]
    assert "off, more than 5%" in failed["busy_accounting"]  # the agent drops them all
    assert "per-process utilization values above 100" in failed["process_util"]
    assert "GPU 0: XID events not registered" in failed["xid_registration"]
    assert "nvmlDeviceRegisterEvents" in failed["nvml_errors"]
    assert "GPU 1 power: agent 200.0 W, nvidia-smi 300.00 W" in failed["nvidia_smi"]
    assert checks["xid_delivery"]["status"] == "not_checked"  # nothing is watched
    assert "[FAIL] busy_accounting: busy seconds" in result.stdout


@NEEDS_ROOT
def test_bad_timestamps_and_fields_lost_events_and_hidden_processes_fail(
    node: Any, tmp_path: Path
) -> None:
    result, report = run_check(
        node(),
        tmp_path,
        misbehave="timestamps_zero,fields_invalid_argument,events_lost,procs_need_sys_admin",
    )
    checks = by_name(report)
    assert result.returncode == 1
    failed = {n: c["message"] for n, c in checks.items() if c["status"] == "fail"}
    assert "samples with timestamp 0" in failed["util_samples"]
    assert "GPU 0: idle seconds 0.00" in failed["idle_accounting"]
    assert "INVALID_ARGUMENT" in failed["fields"]
    assert "none reached the agent" in failed["xid_delivery"]
    # Without CAP_SYS_ADMIN the (misbehaving) driver lists nothing; with it, this process.
    assert "with daemonset capabilities the agent sees pids [] on GPU 0" in failed["process_path"]
    children = checks["process_path"]["details"]["children"]
    assert children["daemonset+sys_admin"]["gpus"][0]["processes"]


def test_the_wrong_clock_slow_fields_and_sparse_process_samples_fail(
    node: Any, tmp_path: Path
) -> None:
    result, report = run_check(
        node(),
        tmp_path,
        "--reps",
        "3",
        "--budget",
        "0.1",
        misbehave="wrong_clock,slow_field_values,proc_samples_sparse",
    )
    checks = by_name(report)
    assert result.returncode == 1
    failed = {n: c["message"] for n, c in checks.items() if c["status"] == "fail"}
    assert "sample timestamps follow monotonic" in failed["util_samples"]
    assert "GpuSource.read() p90" in failed["costs"]
    assert "more than 250 ms" in failed["costs"]
    assert "batched nvmlDeviceGetFieldValues latency" in failed["fields"]
    assert "longer than the agent's 2 s hold" in failed["process_util"]
    assert checks["busy_accounting"]["status"] == "pass"  # gaps, not epoch times, count


def only_the_gpu_machines_packages(tmp_path: Path) -> dict[str, str]:
    """An environment for `python -S`: no site-packages, only what the GPU machine has
    (nvidia-ml-py's pynvml, prometheus_client), so any other import fails."""
    import prometheus_client
    import pynvml

    site = tmp_path / "site"
    site.mkdir()
    for module in (Path(pynvml.__file__), Path(prometheus_client.__file__).parent):
        (site / module.name).symlink_to(module)
    return {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}  # and no nvidia-smi


def test_without_cuda_or_a_hook_the_load_checks_are_not_checked(
    fake_lib: Path, tmp_path: Path
) -> None:
    fake = FakeNvml("pcie-l40s", tmp_path / "state")
    env = os.environ | fake.env() | only_the_gpu_machines_packages(tmp_path)
    report = tmp_path / "r.json"
    result = subprocess.run(
        [
            sys.executable,
            "-S",
            str(SCRIPT),
            "--quick",
            "--idle-seconds",
            "1",
            "--json",
            str(report),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert report.exists(), result.stdout + result.stderr
    body = json.loads(report.read_text())
    checks = by_name(body)
    for name in ("load_generator", "busy_accounting", "process_util"):
        assert checks[name]["status"] == "not_checked", checks[name]
    assert "libcuda.so.1 not loadable" in checks["load_generator"]["message"]
    assert checks["xid_delivery"]["message"].startswith("not provoked")
    assert checks["nvidia_smi"]["status"] == "fail"  # no nvidia-smi on this PATH
    assert checks["idle_accounting"]["status"] == "pass"
    assert set(body["inventory"]["imported_packages"]) == {
        "gpuscope",
        "prometheus_client",
        "pynvml",
    }
    assert result.returncode == 1


def test_help() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True
    )
    assert result.stdout.startswith("usage: gpuscope check")
    assert "--fake-load" in result.stdout and "--quick" in result.stdout


def test_the_shim_without_the_gpu_machines_packages_says_what_to_install(tmp_path: Path) -> None:
    """Debian's own python3 has neither nvidia-ml-py nor prometheus-client: one line, exit 2."""
    bare = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}  # nothing importable there
    result = subprocess.run(
        [sys.executable, "-S", str(SCRIPT), "--help"],
        cwd=tmp_path, env=bare, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert "pip install nvidia-ml-py prometheus-client" in result.stderr

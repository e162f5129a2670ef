"""Check `process_path`: the agent's process list with the DaemonSet's capabilities exactly."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuscope.agent.check.common import MIB, Check, child_env, myself, not_checked, verdict
from gpuscope.agent.check.phases import smi_rows
from gpuscope.agent.gpu import device as dev
from gpuscope.agent.gpu.nvml import Nvml
from gpuscope.agent.gpu.processes import ProcessReader

if TYPE_CHECKING:
    from gpuscope.agent.check.load import Load
    from gpuscope.agent.gpu.source import GpuSource

CAP_SYS_ADMIN = 21


CAP_NAMES = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
]


# The capabilities daemonset/base/daemonset.yaml adds to the agent (not its bpf-load init
# container) after dropping ALL, as kernel names in
# lower case. A constant, so that the check runs where the manifest is not (the image, a GPU
# machine with no checkout); tests/deploy/test_check_manifest.py keeps it equal to the manifest.
DAEMONSET_CAPABILITIES = ("bpf",)


def daemonset_caps() -> list[str]:
    """The capabilities the DaemonSet adds after dropping ALL."""
    return list(DAEMONSET_CAPABILITIES)


def cap_mask(names: Sequence[str]) -> int:
    return sum(1 << CAP_NAMES.index(n.removeprefix("cap_").lower()) for n in names)


def cap_list(mask: int) -> list[str]:
    return [n for i, n in enumerate(CAP_NAMES) if mask >> i & 1]


def own_caps() -> dict[str, int]:
    status = Path("/proc/self/status").read_text()
    return {k: int(v, 16) for k, v in re.findall(r"^(Cap\w+):\s*([0-9a-f]+)$", status, re.M)}


def apply_caps(keep: int) -> None:
    """In a child: keep exactly `keep` (bounding, permitted, effective), no new privileges,
    through prctl and capset, for hosts without capsh."""
    libc = ctypes.CDLL(None, use_errno=True)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if not keep >> cap & 1:
            libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this pid
    data = (ctypes.c_uint32 * 6)(keep & 0xFFFFFFFF, keep & 0xFFFFFFFF, 0, keep >> 32, keep >> 32, 0)
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS


def process_probe(keep: int | None) -> int:
    """Child mode: list every GPU's processes the agent's way and print them as JSON."""
    report: dict[str, Any] = {"pid": os.getpid(), "uid": os.getuid()}
    try:
        if keep is not None:
            apply_caps(keep)
        report["caps"] = own_caps()
        nvml = Nvml()
        nvml.init()
        reader = ProcessReader(nvml)
        gpus = []
        for index in range(int(nvml.call("nvmlDeviceGetCount"))):
            device = dev.discover(nvml, index, Path("/sys"))
            procs = reader.read(device)
            gpus.append(
                {
                    "index": index,
                    "uuid": device.identity.uuid,
                    "processes": {str(p.pid): p.used_memory_bytes for p in procs},
                }
            )
        report["gpus"] = gpus
        report["nvml_errors"] = [f"{f}: {m} (x{n})" for (f, m), n in nvml.errors.items()]
        nvml.shutdown()
    except Exception as exc:  # noqa: BLE001 - the parent reports it
        report["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(report))
    return 0


def run_probe(keep: int) -> dict[str, Any]:
    """A child of this script holding exactly `keep`: through capsh where it exists (an exec
    with a reduced bounding set, as a container starts), else through prctl/capset."""
    script = [*myself(), "--process-probe"]
    if shutil.which("capsh"):
        drop = [str(c) for c in range(len(CAP_NAMES)) if not keep >> c & 1]
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        drop += [str(c) for c in range(len(CAP_NAMES), last + 1)]
        argv = [
            "capsh",
            f"--drop={','.join(drop)}",
            "--no-new-privs",
            f"--shell={sys.executable}",
            "--",
            *script[1:],
        ]
        how = "capsh"
    else:
        argv, how = [*script, "--apply-caps", hex(keep)], "prctl/capset"
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, check=False, env=child_env()
    )
    try:
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        result = {"error": f"rc {done.returncode}: {done.stderr.strip()[-400:]}"}
    result["how"] = how
    return result


def smi_apps() -> dict[str, dict[str, float | None]]:
    """nvidia-smi's compute processes by GPU UUID: pid -> MiB (None for [N/A])."""
    out: dict[str, dict[str, float | None]] = {}
    for row in smi_rows("--query-compute-apps", ("gpu_uuid", "pid", "used_memory")):
        try:
            mib: float | None = float(row["used_memory"])
        except ValueError:
            mib = None
        out.setdefault(row["gpu_uuid"], {})[row["pid"]] = mib
    return out


def check_process_path(load: Load | None, source: GpuSource) -> Check:
    name = "process_path"
    if os.geteuid() != 0:
        return not_checked(name, "not root: cannot drop to the DaemonSet's capabilities")
    try:
        caps = daemonset_caps()
        keep = cap_mask(caps)
        apps = smi_apps()
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return not_checked(name, f"cannot set up the comparison: {exc}")
    available = own_caps().get("CapBnd", 0)
    variants = {
        "daemonset": keep & available,
        "daemonset+sys_admin": (keep | 1 << CAP_SYS_ADMIN) & available,
    }
    runs = {label_: run_probe(mask) for label_, mask in variants.items()}
    details: dict[str, Any] = {
        "daemonset_caps": caps,
        "nvidia_smi": apps,
        "children": runs,
        "own_pid": os.getpid(),
        "holds_context": bool(load and load.holds_context and not load.error),
    }
    for label_, run in runs.items():
        if "error" in run:
            return not_checked(name, f"{label_} child failed: {run['error']}", details)
        if run["caps"].get("CapEff") != variants[label_]:
            return not_checked(
                name,
                f"could not drop to exactly {cap_list(variants[label_])} "
                f"({run['how']}): the child has {cap_list(run['caps']['CapEff'])}",
                details,
            )
    problems = process_problems(runs, apps, details["holds_context"], source)
    seen = {k: sum(len(g["processes"]) for g in r["gpus"]) for k, r in runs.items()}
    return verdict(
        name,
        problems,
        f"agent and nvidia-smi agree: processes seen {seen} ({runs['daemonset']['how']})",
        details,
    )


def process_problems(
    runs: Mapping[str, Any],
    apps: Mapping[str, Mapping[str, Any]],
    holds_context: bool,
    source: GpuSource,
) -> list[str]:
    problems = []
    pid = str(os.getpid())
    gpu0 = source.devices[0].identity.uuid
    if holds_context and pid not in apps.get(gpu0, {}):
        problems.append(
            f"nvidia-smi does not list this process (pid {pid}) on GPU 0, "
            "though it holds a CUDA context there"
        )
    for label_, run in runs.items():
        for gpu in run["gpus"]:
            agent_pids = set(gpu["processes"])
            smi_pids = set(apps.get(gpu["uuid"], {}))
            if agent_pids != smi_pids:
                problems.append(
                    f"with {label_} capabilities the agent sees pids {sorted(agent_pids)} on "
                    f"GPU {gpu['index']}, nvidia-smi {sorted(smi_pids)}"
                )
                continue
            for p, used in gpu["processes"].items():
                mib = apps[gpu["uuid"]][p]
                if used is not None and mib is not None and abs(used / MIB - mib) > 2:
                    problems.append(
                        f"{label_}: pid {p} holds {used / MIB:.0f} MiB by the "
                        f"agent, {mib:.0f} MiB by nvidia-smi"
                    )
    return problems

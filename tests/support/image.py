"""The agent image run as the DaemonSet runs it, where no container can start.

This sandbox's container runtimes refuse to start containers (hybrid cgroups, no setrlimit),
so `ImageRoot` does what the runtime and the kubelet would: a container's writable layer from
podman (`podman create` + `podman mount`), made read-only as `readOnlyRootFilesystem` asks,
then, in a private mount namespace, the container's own /proc, /sys and /dev, each volume of
the rendered DaemonSet at its `mountPath`, and what the NVIDIA container runtime injects
(libnvidia-ml.so.1, here the fake). The agent then runs chrooted into it, with the image's
environment and entrypoint, the manifest's environment and arguments, uid 0 and exactly the
capabilities the manifest adds (util-linux's `setpriv` from the image).

The volumes come from the manifest, not from a copy of it: a volume added, moved or made
read-only there is mounted so here. What a test puts behind a volume (the kubelet double's
socket directory, an empty /lib/modules for a node without kernel headers) is its choice.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuscope import __version__
from tests.support.common import REQUIRE_ROOT_ENV
from tests.support.manifests import container, daemonset, helper_container, render

IMAGE_ENV = "GPUSCOPE_IMAGE"  # set by `make image-test` and `make test`
DEFAULT_IMAGE = f"ghcr.io/gpuscope/gpuscope:{__version__}"
NVML_IN_IMAGE = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"  # where the NVIDIA runtime puts it


def image_name() -> str:
    return os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE


def require_image() -> str:
    """The image under test. Missing: a failure where root tests must run (CI), else a skip
    that says how to build it."""
    name = image_name()
    if shutil.which("podman") is None:
        found = False
    else:
        found = subprocess.run(["podman", "image", "exists", name], check=False).returncode == 0
    if not found:
        message = f"no image {name}: run `make image` (or `make image-test`, which needs it)"
        if os.environ.get(REQUIRE_ROOT_ENV) == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return name


def podman(*args: str) -> str:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"podman {' '.join(args)}: {proc.stderr.strip()}"
    return proc.stdout.strip()


def inspect(image: str) -> dict[str, Any]:
    (found,) = json.loads(podman("image", "inspect", image))
    return dict(found)


@dataclass(frozen=True)
class Mount:
    """One mount of the container: host `source` at `target` inside, bind or a file system."""

    target: str
    source: str
    read_only: bool
    fstype: str | None = None  # None: a recursive bind of `source`

    def commands(self, root: Path) -> list[str]:
        where = shlex.quote(f"{root}{self.target}")
        if self.fstype is None:
            lines = [f"mount --rbind {shlex.quote(self.source)} {where}"]
            if self.read_only:
                lines.append(f"mount -o remount,bind,ro {where}")
            return lines
        options = "ro" if self.read_only else "rw"
        return [f"mount -t {self.fstype} -o {options} {shlex.quote(self.source)} {where}"]


def _container(helper: bool) -> dict[str, Any]:
    docs = render("base")
    return helper_container(docs) if helper else container(docs)


def daemonset_mounts(host_paths: Mapping[str, str], *, helper: bool = False) -> list[Mount]:
    """The agent container's (or the bpf-load init container's) volume mounts from the
    rendered base DaemonSet; `host_paths` replaces a volume's host path by its name (a test's
    kubelet socket directory, say). emptyDir volumes are fresh tmpfs mounts."""
    docs = render("base")
    volumes = {v["name"]: v for v in daemonset(docs)["spec"]["template"]["spec"]["volumes"]}
    mounts = []
    for m in _container(helper)["volumeMounts"]:
        volume = volumes[m["name"]]
        read_only = bool(m.get("readOnly", False))
        if "emptyDir" in volume:
            mounts.append(Mount(m["mountPath"], "tmpfs", read_only, fstype="tmpfs"))
        else:
            source = host_paths.get(m["name"], volume["hostPath"]["path"])
            mounts.append(Mount(m["mountPath"], source, read_only))
    return mounts


def daemonset_args_env(
    field_values: Mapping[str, str], *, helper: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The container's arguments and environment, `fieldRef`s filled from `field_values`
    (keyed by field path, e.g. spec.nodeName)."""
    c = _container(helper)
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = field_values[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return list(c["args"]), env


def daemonset_capabilities(*, helper: bool = False) -> list[str]:
    caps = _container(helper)["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"], caps
    return [str(c).lower() for c in caps["add"]]


class ImageRoot:
    """A container of `image` whose file system is mounted here, for `run` to chroot into.
    Removed on `close` (a context manager)."""

    def __init__(self, image: str, name: str) -> None:
        self.image = image
        self.config = inspect(image)["Config"]
        subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False)
        self.container = podman("create", "--name", name, image)
        self.root = Path(podman("mount", self.container))

    def __enter__(self) -> ImageRoot:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        subprocess.run(["podman", "umount", self.container], capture_output=True, check=False)
        subprocess.run(
            ["podman", "rm", "--force", self.container], capture_output=True, check=False
        )

    def image_env(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.config.get("Env") or [])

    def chroot(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """A plain command in the image's file system (no mounts): `gpuscope --version`."""
        env = self.image_env()
        command = ["chroot", str(self.root), "/usr/bin/env", "-i"]
        command += [f"{k}={v}" for k, v in env.items()]
        return subprocess.run(
            [*command, *argv], capture_output=True, text=True, timeout=60, check=False
        )

    def _mount_point(self, target: str, *, file: bool) -> None:
        """Made in the container's writable layer, as a runtime does, before it goes read-only."""
        path = self.root / target.lstrip("/")
        if file:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(exist_ok=True)
        else:
            path.mkdir(parents=True, exist_ok=True)

    def spawn(
        self,
        mounts: Sequence[Mount],
        argv: Sequence[str],
        env: Mapping[str, str],
        capabilities: Sequence[str],
        log_path: Path,
    ) -> subprocess.Popen[str]:
        """Starts `argv` (the image's entrypoint and arguments) in the mounted container."""
        runtime = [
            Mount("/proc", "proc", False, fstype="proc"),  # hostPID: the host's PID namespace
            Mount("/sys", "sysfs", True, fstype="sysfs"),
            Mount("/dev", "/dev", False),
        ]
        ordered = sorted([*runtime, *mounts], key=lambda m: m.target.count("/"))
        for m in ordered:
            self._mount_point(m.target, file=Path(m.source).is_file())
        root = shlex.quote(str(self.root))
        script = ["set -e", f"mount --bind {root} {root}", f"mount -o remount,bind,ro {root}"]
        for m in ordered:
            script += m.commands(self.root)
        full_env = {**self.image_env(), **env}
        bounding = ",".join(["-all", *(f"+{c}" for c in capabilities)])
        exec_line = [
            "exec", "chroot", str(self.root), "/usr/bin/env", "-i",
            *(f"{k}={v}" for k, v in full_env.items()),
            "setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", "--ambient-caps=-all",
            "--no-new-privs", "--", *argv,
        ]  # fmt: skip
        script.append(shlex.join(exec_line))
        with log_path.open("w") as log:
            return subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "bash", "-c", "\n".join(script)],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )

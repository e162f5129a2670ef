"""A small Kubernetes-node network lab on the real kernel, for the eBPF tests.

* `Pods` creates kubelet-style cgroup v2 hierarchies (systemd + containerd layout, or the
  cgroupfs layout) under a test prefix of the real cgroup v2 mount, and runs processes
  inside them (the child writes its own pid into cgroup.procs before exec, so no byte is
  sent from the wrong cgroup).
* `NetnsPair` joins two network namespaces with a veth pair on 198.18.0.0/30 (RFC 2544's
  benchmarking range), optionally dropping a share of packets with nftables.
Everything is removed on close.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gpuscope.agent.k8s.cgroups import detect_cgroup_v2_root

NETGEN = Path(__file__).parent / "netgen.py"
PREFIX = "gpuscope-test"


def cgroup_v2_root() -> Path:
    root = detect_cgroup_v2_root(Path("/sys/fs/cgroup"))
    if root is None:
        raise RuntimeError("no cgroup v2 hierarchy on this machine")
    return root


@dataclass
class Pod:
    uid: str
    container_id: str
    path: Path  # the container's cgroup directory


@dataclass
class Pods:
    root: Path = field(default_factory=cgroup_v2_root)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    created: list[Path] = field(default_factory=list)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def add(self, *, driver: str = "systemd", qos: str = "burstable") -> Pod:
        uid = str(uuid.uuid4())
        cid = uuid.uuid4().hex + uuid.uuid4().hex
        base = self.root / f"{PREFIX}-{self.tag}"
        if driver == "systemd":
            qos_part = "" if qos == "guaranteed" else f"-{qos}"
            levels = [
                "kubepods.slice",
                *([f"kubepods{qos_part}.slice"] if qos_part else []),
                f"kubepods{qos_part}-pod{uid.replace('-', '_')}.slice",
                f"cri-containerd-{cid}.scope",
            ]
        else:
            levels = ["kubepods", *([qos] if qos != "guaranteed" else []), f"pod{uid}", cid]
        path = base.joinpath(*levels)
        path.mkdir(parents=True, exist_ok=True)
        self.created.append(base)
        return Pod(uid=uid, container_id=cid, path=path)

    def add_container(self, pod: Pod) -> Pod:
        """Another container of the same pod (a sibling cgroup, same runtime naming)."""
        cid = uuid.uuid4().hex + uuid.uuid4().hex
        name = pod.path.name.replace(pod.container_id, cid)
        path = pod.path.with_name(name)
        path.mkdir()
        return Pod(uid=pod.uid, container_id=cid, path=path)

    def run(
        self, pod: Pod | None, args: list[str], *, netns: str | None = None
    ) -> subprocess.Popen[str]:
        """Start `python netgen.py ARGS` in the pod's cgroup (and network namespace)."""
        argv = [sys.executable, str(NETGEN), *args]
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]
        procs_file = str(pod.path / "cgroup.procs") if pod else None

        def enter() -> None:
            if procs_file:
                with open(procs_file, "w") as f:
                    f.write(str(os.getpid()))

        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=enter
        )
        self.procs.append(proc)
        return proc

    def remove(self, pod: Pod) -> None:
        """Remove the pod's cgroup and its container's (their processes must have exited)."""
        _rmtree_cgroup(pod.path.parent)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for base in dict.fromkeys(self.created):
            _rmtree_cgroup(base)


def _rmtree_cgroup(top: Path) -> None:
    """cgroupfs directories are removed with rmdir, children first."""
    if not top.exists():
        return
    for dirpath, _dirnames, _files in sorted(
        os.walk(top), key=lambda entry: entry[0].count("/"), reverse=True
    ):
        for _ in range(50):
            try:
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)  # a process is still leaving


def wait_ready(proc: subprocess.Popen[str], timeout: float = 10.0) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        raise AssertionError(
            f"generator not ready: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        )


def finish(proc: subprocess.Popen[str], timeout: float = 120.0) -> str:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"generator failed ({proc.returncode}): {err}")
    return out.strip()


def sh(*args: str, check: bool = True) -> str:
    result = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


@dataclass
class NetnsPair:
    """Two namespaces, `a` (198.18.0.1) and `b` (198.18.0.2), joined by a veth pair."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    def __post_init__(self) -> None:
        self.a, self.b = f"gs{self.tag}a", f"gs{self.tag}b"
        sh("ip", "netns", "add", self.a)
        sh("ip", "netns", "add", self.b)
        sh("ip", "link", "add", f"v{self.tag}a", "netns", self.a, "type", "veth",
           "peer", "name", f"v{self.tag}b", "netns", self.b)  # fmt: skip
        for ns, dev, addr in ((self.a, f"v{self.tag}a", "198.18.0.1/30"),
                              (self.b, f"v{self.tag}b", "198.18.0.2/30")):  # fmt: skip
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def segment_per_packet(self) -> None:
        """Make every packet on the veth pair one TCP segment.

        The kernel's RetransSegs counts segments; tcp:tcp_retransmit_skb fires once per skb,
        which with segmentation offload can carry many segments.
        """
        for ns, dev in ((self.a, f"v{self.tag}a"), (self.b, f"v{self.tag}b")):
            # TCP always builds GSO packets; capping them at one segment is what works.
            sh("ip", "-n", ns, "link", "set", "dev", dev, "gso_max_segs", "1")

    def drop_inbound(self, ns: str, one_in: int, port: int) -> None:
        """Drop about 1/one_in of TCP packets to `port` arriving in namespace `ns`."""
        rules = (
            "table inet gslab {\n chain input {\n  type filter hook input priority 0;\n"
            f"  tcp dport {port} numgen random mod {one_in} 0 drop\n }}\n}}\n"
        )
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, text=True,
                       check=True)  # fmt: skip

    def retrans_segs(self, ns: str) -> int:
        """The kernel's own count (Tcp: RetransSegs in /proc/net/snmp) in namespace `ns`."""
        snmp = sh("ip", "netns", "exec", ns, "cat", "/proc/net/snmp")
        header, values = (line.split() for line in snmp.splitlines() if line.startswith("Tcp:"))
        return int(values[header.index("RetransSegs")])

    def close(self) -> None:
        sh("ip", "netns", "del", self.a, check=False)
        sh("ip", "netns", "del", self.b, check=False)


def have(tool: str) -> bool:
    return shutil.which(tool) is not None

"""How the agent gets a family's pinned maps: open the pins of its program hash, or run
the helper (`gpuscope bpf-load`) as a child process first when there are none.

In Kubernetes the helper has run already, as the DaemonSet's init container; a plain
`gpuscope` outside Kubernetes, or an agent whose pins were removed, loads them itself. The
helper's failure reaches the agent as its one line.
"""

from __future__ import annotations

import errno
import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuscope.agent.bpf import syscall
from gpuscope.agent.bpf.family import ProbeFamily, program_hash
from gpuscope.agent.bpf.maps import PinnedFamily
from gpuscope.agent.bpf.pins import MANIFEST, ManifestError, published
from gpuscope.agent.runtime.sources import SourceUnavailable

log = logging.getLogger("gpuscope.bpf")

HELPER_PREFIX = "gpuscope bpf-load: "
READ_REFUSED = (
    "missing capabilities CAP_BPF (or CAP_SYS_ADMIN) to read the pinned eBPF maps "
    "(Linux before 6.5, with kernel.unprivileged_bpf_disabled set)"
)
HELPER_TIMEOUT = 180.0  # a cold compile on a busy 2-core node takes a few seconds


def helper_command(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "gpuscope", "bpf-load", *args]


def run_helper(args: Sequence[str], timeout: float = HELPER_TIMEOUT) -> str:
    """Run `gpuscope bpf-load ARGS` and wait; its summary line, or SourceUnavailable with
    its one-line cause."""
    try:
        done = subprocess.run(
            helper_command(args),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SourceUnavailable(f"the bpf-load helper did not finish in {timeout:g} s") from None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    said = [line[len(HELPER_PREFIX) :] for line in lines if line.startswith(HELPER_PREFIX)]
    if done.returncode != 0:
        cause = said[-1] if said else (lines[-1] if lines else f"exit status {done.returncode}")
        raise SourceUnavailable(f"bpf-load helper: {cause}")
    return said[-1] if said else "done"


def open_family(
    family: ProbeFamily,
    pin_root: Path,
    *,
    helper_args: Sequence[str] | None,
) -> PinnedFamily:
    """The family's pinned maps, open. `helper_args` None: never run the helper (the pins
    must be there)."""
    directory = published(pin_root, family.name, program_hash(family))
    if not (directory / MANIFEST).exists():
        if helper_args is None:
            raise SourceUnavailable(f"no pinned probes at {directory}: run gpuscope bpf-load")
        log.info("no pinned %s probes at %s: running the bpf-load helper", family.name, directory)
        log.info("bpf-load helper: %s", run_helper(helper_args))
    try:
        return PinnedFamily.open(directory)
    except syscall.BpfError as exc:
        if exc.errno == errno.EPERM:
            # Linux 6.5 lets anyone who may open the pins use them; before, bpf(2) is closed
            # to processes without CAP_BPF while kernel.unprivileged_bpf_disabled is set.
            raise SourceUnavailable(READ_REFUSED) from exc
        raise SourceUnavailable(f"pinned probes at {directory}: {exc}") from exc
    except (ManifestError, FileNotFoundError) as exc:
        raise SourceUnavailable(f"pinned probes at {directory}: {exc}") from exc

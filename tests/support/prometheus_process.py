"""Debian's Prometheus on loopback, started from a configuration and waited for: one way to
run it for the e2e tests and the fleet benchmark (each builds its own scrape configuration
and keeps its own client); and Debian's VictoriaMetrics, the fleet benchmark's second
store."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.common import free_port


class PrometheusFailed(RuntimeError):
    """Prometheus (or VictoriaMetrics) is missing, exited, or did not become ready; the message
    ends with its log."""


def launch_prometheus(
    folder: Path,
    config: Mapping[str, Any],
    *,
    ready_timeout: float = 20.0,
    preexec_fn: Callable[[], None] | None = None,
) -> tuple[str, subprocess.Popen[str], Path]:
    """(base URL, process, log file) of a Prometheus running `config` from `folder`, once
    /-/ready answers 200. A Prometheus that fails to get there is killed."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusFailed("prometheus is not installed (scripts/install-deps.sh installs it)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prometheus.yml").write_text(yaml.safe_dump(dict(config)))
    port = free_port()
    argv = [
        binary,
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    return _launch("prometheus", argv, port, folder / "prometheus.log", "/-/ready",
                   ready_timeout, preexec_fn)  # fmt: skip


def launch_victoria_metrics(
    folder: Path,
    *,
    ready_timeout: float = 60.0,
    preexec_fn: Callable[[], None] | None = None,
) -> tuple[str, subprocess.Popen[str], Path]:
    """(base URL, process, log file) of Debian's VictoriaMetrics single node storing under
    `folder`, once /health answers 200: it takes Prometheus remote write at /api/v1/write and
    answers the same HTTP query API."""
    binary = shutil.which("victoria-metrics")
    if binary is None:
        raise PrometheusFailed(
            "victoria-metrics is not installed (scripts/install-deps.sh installs it)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        binary,
        f"-storageDataPath={folder / 'data'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=1d",
        "-loggerLevel=WARN",
    ]
    return _launch("victoria-metrics", argv, port, folder / "victoria-metrics.log", "/health",
                   ready_timeout, preexec_fn)  # fmt: skip


def _launch(
    name: str,
    argv: list[str],
    port: int,
    log: Path,
    ready_path: str,
    ready_timeout: float,
    preexec_fn: Callable[[], None] | None,
) -> tuple[str, subprocess.Popen[str], Path]:
    """Start `argv`, its output to `log`, and wait until http://127.0.0.1:<port><ready_path>
    answers 200; kill it if it does not."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, text=True, preexec_fn=preexec_fn
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PrometheusFailed(f"{name} exited {proc.returncode}:\n{_tail(log)}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url + ready_path, timeout=2) as resp,
        ):
            if resp.status == 200:
                return url, proc, log
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise PrometheusFailed(f"{name} not ready after {ready_timeout:g} s:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text()[-4000:] if log.exists() else ""

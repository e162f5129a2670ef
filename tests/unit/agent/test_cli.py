"""The command line: flags, GPUSCOPE_* variables, and one-line errors with non-zero exits."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

import gpuscope
from gpuscope.agent.app.config import ConfigError, parse
from gpuscope.agent.gpu.collector import GPU
from tests.support import GPUSCOPE, REPO


def run(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUSCOPE, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_defaults() -> None:
    c = parse([], env={"NODE_NAME": "gpu-node-7"})
    assert c.agent.listen == ("", 19400)  # not 9400: dcgm-exporter's (README, "Its own port")
    assert c.of(GPU).sample_interval == 1.0
    assert c.collectors == ("gpu", "amd", "net", "nic", "rdma", "kubelet", "pods")
    assert c.agent.node_name == "gpu-node-7"
    assert (c.agent.log_format, c.agent.log_level) == ("text", "info")
    assert (c.agent.procfs, c.agent.sysfs) == (Path("/proc"), Path("/sys"))
    assert c.of(GPU).idle_threshold == 0.0
    assert c.of(GPU).nvlink_per_link is False


def test_environment_variables_and_flags_override_them() -> None:
    env = {
        "GPUSCOPE_LISTEN": "127.0.0.1:9500",
        "GPUSCOPE_SAMPLE_INTERVAL": "0.5",
        "GPUSCOPE_LOG_FORMAT": "json",
        "GPUSCOPE_SYSFS": "/host/sys",
        "GPUSCOPE_NVLINK_PER_LINK": "true",
        "NODE_NAME": "from-downward-api",
    }
    c = parse(["--sample-interval", "2", "--node-name", "explicit"], env=env)
    assert c.agent.listen == ("127.0.0.1", 9500)
    assert c.of(GPU).sample_interval == 2.0
    assert c.agent.log_format == "json"
    assert c.agent.sysfs == Path("/host/sys")
    assert c.of(GPU).nvlink_per_link is True
    assert c.agent.node_name == "explicit"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "nowhere"], "--listen: expected [HOST]:PORT, got 'nowhere'"),
        (["--listen", ":http"], "--listen: port must be a number, got 'http'"),
        (["--listen", ":70000"], "--listen: port must be 0-65535, got 70000"),
        (["--sample-interval", "fast"], "--sample-interval: expected a number, got 'fast'"),
        (["--sample-interval", "0"], "--sample-interval: expected 0.05 to 60 seconds, got 0"),
        (["--idle-threshold", "5"], "--idle-threshold: expected a ratio from 0 to below 1, got 5"),
        (
            ["--collectors", "gpu,dcgm"],
            "--collectors: unknown collector 'dcgm' "
            "(available: gpu, amd, net, nic, rdma, kubelet, pods, dra)",
        ),
        (["--log-format", "xml"], "--log-format: expected json or text, got 'xml'"),
        (["--nvlink-per-link", "maybe"], "--nvlink-per-link: expected true or false, got 'maybe'"),
        (["--collect-deadline", "nan"], "--collect-deadline: expected a finite number, got 'nan'"),
        (["--collect-deadline", "0"], "--collect-deadline: expected 0.1 to 120 seconds, got 0"),
        (
            ["--collection-max-age", "inf"],
            "--collection-max-age: expected a finite number, got 'inf'",
        ),
        (["--metrics-detail", "all"], "--metrics-detail: expected default or full, got 'all'"),
        (
            ["--metrics-include", "gpuscope_(gpu"],
            "--metrics-include: not an RE2 regular expression: missing ): gpuscope_(gpu",
        ),
        # A map the kernel cannot allocate is refused here, not at load ("Argument list too
        # long"); at these bounds the preallocated maps already cost hundreds of MB.
        (
            ["--bpf-max-cgroups", "100000000000"],
            "--bpf-max-cgroups: expected 1 to 1048576 cgroups, got 100000000000",
        ),
        (["--bpf-max-sockets", "0"], "--bpf-max-sockets: expected 1 to 4194304 sockets, got 0"),
        # argv that is not UTF-8 reaches Python as surrogate escapes (os.fsdecode)
        (["--node-name", "gpu\udcff-7"], "--node-name: not valid UTF-8: 'gpu\\xff-7'"),
    ],
)
def test_bad_values_are_one_clear_line(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(args, env={})
    assert str(err.value) == message


def test_bad_flag_exits_2_with_one_line() -> None:
    result = run("--sample-interval", "-1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "gpuscope: --sample-interval: expected 0.05 to 60 seconds, got -1"
    ]


def test_bad_environment_value_exits_2() -> None:
    result = subprocess.run(
        [*GPUSCOPE],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"GPUSCOPE_LOG_LEVEL": "chatty", "PATH": "/usr/bin:/bin"},
        timeout=20,
        check=False,
    )
    assert result.returncode == 2
    assert "--log-level: expected debug, info, warning or error, got 'chatty'" in result.stderr


def test_node_name_from_the_environment_that_is_not_utf8_exits_2() -> None:
    result = subprocess.run(
        [*GPUSCOPE],
        cwd=REPO,
        capture_output=True,
        env={b"NODE_NAME": b"node-\xff", b"PATH": b"/usr/bin:/bin"},  # type: ignore[dict-item]
        timeout=20,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.decode().strip().splitlines() == [
        "gpuscope: --node-name: not valid UTF-8: 'node-\\xff'"
    ]


def test_port_already_in_use_exits_1_with_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run("--listen", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"gpuscope: cannot listen on 127.0.0.1:{port}: address already in use"
    ]


def test_unknown_flag_is_a_usage_error() -> None:
    result = run("--gpu-only")
    assert result.returncode == 2
    assert "unrecognized arguments: --gpu-only" in result.stderr


# --- commands ----------------------------------------------------------------------------


def no_driver(tmp_path: Path) -> dict[str, str]:
    """An environment without NVML (nor the fake's), and an empty /sys: labels from nothing."""
    env = os.environ | {"LD_LIBRARY_PATH": "/nonexistent", "GPUSCOPE_SYSFS": str(tmp_path)}
    env.pop("FAKENVML_STATE", None)
    return env


def run_in(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUSCOPE, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=20,
        check=False,
    )  # fmt: skip


def test_help_lists_the_labels_command() -> None:
    result = run("--help")
    assert result.returncode == 0
    (line,) = [ln for ln in result.stdout.splitlines() if ln.split()[:1] == ["labels"]]
    assert "node labels" in line
    assert "--collectors" in result.stdout  # and still the agent's own flags


def test_labels_help_is_the_commands_own() -> None:
    result = run("labels", "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: gpuscope labels ")
    for flag in ("--output {table,json}", "--remove", "--node-name", "--sysfs", "--label-prefix"):
        assert flag in result.stdout
    assert "--collectors" not in result.stdout and "--listen" not in result.stdout


@pytest.mark.parametrize("form", [["--output=json"], ["--output", "json"]])
def test_labels_output_takes_both_forms(form: list[str], tmp_path: Path) -> None:
    result = run_in(no_driver(tmp_path), "labels", *form)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "labels": {"gpuscope.io/gpu.present": "false"},
        "annotations": {},
    }


def test_labels_reads_the_agents_variables(tmp_path: Path) -> None:
    """Inside the agent's pod, `gpuscope labels` sees the agent's GPUSCOPE_* settings."""
    env = no_driver(tmp_path) | {"GPUSCOPE_LABEL_PREFIX": "example.com"}
    result = run_in(env, "labels", "--output=json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["labels"] == {"example.com/gpu.present": "false"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["labels", "--output=xml"], "argument --output: invalid choice: 'xml'"),
        (["labels", "--listen", ":1"], "unrecognized arguments: --listen :1"),
        (["labels", "--label-prefix", "Bad!"], "gpuscope labels: --label-prefix: "),
        (["--log-level", "debug", "labels"], "gpuscope: the command comes first"),
        (["lables"], "invalid choice: 'lables'"),
    ],
)
def test_command_usage_errors_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    result = run_in(no_driver(tmp_path), *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_version_is_the_packages() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout == f"gpuscope {gpuscope.__version__}\n"

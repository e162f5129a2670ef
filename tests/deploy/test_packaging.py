"""The installed distribution: one import name, `gpuscope`, and a console script that runs
from a virtual environment holding only the wheel (not the checkout)."""

from __future__ import annotations

import email.parser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

import gpuscope
from tests.support import AgentProcess, free_port

REPO = Path(__file__).resolve().parents[2]
PIP = (sys.executable, "-m", "pip")
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "agent", "exporters", "gpuscope")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build from a copy of the package sources, so setuptools' build/ stays out of the
    checkout (whose build/ holds the fake NVML) and no stale file can slip in."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(
                path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [*PIP, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("gpuscope-*.whl")
    return built


def test_wheel_installs_exactly_one_import_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"gpuscope"}
    assert "gpuscope/agent/app/cli.py" in names
    assert "gpuscope/exporters/prometheus/exporter.py" in names
    # Every module of the checkout is in the wheel (the links were followed, not dropped).
    for tree in ("agent", "exporters"):
        for py in (REPO / tree).rglob("*.py"):
            assert f"gpuscope/{py.relative_to(REPO).as_posix()}" in names, py


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment holding only the wheel (not the checkout)."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [*PIP, "--python", str(python), "install", "-q", "--no-deps", "--no-cache-dir", str(wheel)],
        check=True,
        capture_output=True,
    )
    # The runtime dependencies come from the test venv's site-packages as a plain path entry:
    # its .pth files (the editable install of the checkout among them) are not processed.
    purelib = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_console_script_runs_from_a_venv_with_only_the_wheel(venv: Path, tmp_path: Path) -> None:
    python = venv / "bin" / "python"
    run = subprocess.run(
        [str(venv / "bin" / "gpuscope"), "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert re.fullmatch(r"gpuscope \d+\.\d+\.\d+\n", run.stdout)
    where = subprocess.check_output(
        [str(python), "-c", "import gpuscope.agent.app.cli as m; print(m.__file__)"],
        cwd=tmp_path,
        text=True,
    )
    assert Path(where.strip()).is_relative_to(venv), where
    help_text = subprocess.run(
        [str(venv / "bin" / "gpuscope"), "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert help_text.returncode == 0 and "--collectors" in help_text.stdout
    assert "check" in help_text.stdout and "labels" in help_text.stdout  # the commands


def test_the_first_contact_suite_is_a_command_of_the_installed_wheel(
    venv: Path, tmp_path: Path
) -> None:
    """`kubectl exec ds/gpuscope -- gpuscope check` runs what the image installed."""
    run = subprocess.run(
        [str(venv / "bin" / "gpuscope"), "check", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: gpuscope check")
    assert "--provoke-xid" in run.stdout and "util_samples" in run.stdout


def test_one_version_everywhere(wheel: Path, venv: Path, tmp_path: Path) -> None:
    """gpuscope/__init__.py is the one source: the wheel's metadata, `gpuscope --version` and
    gpuscope_build_info{version} of the installed agent all say what it says."""
    with zipfile.ZipFile(wheel) as whl:
        (metadata,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        headers = email.parser.Parser().parsestr(whl.read(metadata).decode())
        licenses = [n for n in whl.namelist() if ".dist-info/" in n and n.endswith("/LICENSE")]
        assert licenses, "the wheel carries the license text"
    assert headers["Version"] == gpuscope.__version__
    assert wheel.name.startswith(f"gpuscope-{gpuscope.__version__}-")

    script = str(venv / "bin" / "gpuscope")
    shown = subprocess.run([script, "--version"], capture_output=True, text=True, check=True)
    assert shown.stdout == f"gpuscope {gpuscope.__version__}\n"

    port, log_path = free_port(), tmp_path / "agent.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCOPE_", "FAKENVML"))}
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [script, f"--listen=127.0.0.1:{port}", "--collectors=nic", f"--sysfs={tmp_path}",
             "--labels-mode=none"],
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    agent = AgentProcess(proc=proc, port=port, log_path=log_path)
    try:
        agent.wait_ready()
        (labels,) = agent.scrape().series("gpuscope_build_info")
    finally:
        agent.stop()
    assert dict(labels)["version"] == gpuscope.__version__


def test_sources_import_only_through_the_gpuscope_name() -> None:
    """In a checkout `agent` is importable too (the repository root is on sys.path); a module
    imported under both names would exist twice, with two sets of classes and globals."""
    pattern = re.compile(r"^\s*(from|import)\s+(agent|exporters)(\.|\s|$)", re.M)
    offenders = []
    for tree in ("agent", "exporters", "tests", "scripts", "bench"):
        for path in (REPO / tree).rglob("*.py"):
            if pattern.search(path.read_text()):
                offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"import through gpuscope.agent / gpuscope.exporters: {offenders}"


# The SHA-256 of https://www.apache.org/licenses/LICENSE-2.0.txt (Debian ships the same bytes
# as /usr/share/common-licenses/Apache-2.0).
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_license_is_the_apache_text_the_metadata_declares() -> None:
    assert hashlib.sha256((REPO / "LICENSE").read_bytes()).hexdigest() == APACHE_2_0_SHA256
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    dockerfile = (REPO / "daemonset" / "Dockerfile").read_text()
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in dockerfile


def test_changelog_has_the_current_version() -> None:
    """A release bumps gpuscope.__version__ and names its section in CHANGELOG.md (Keep a
    Changelog): the version a user runs is the one whose changes they can read."""
    text = (REPO / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert versions[0] == ("Unreleased", "")
    released = [v for v, _date in versions[1:]]
    assert gpuscope.__version__ in released, released
    assert all(date for _v, date in versions[1:]), "every released version has its date"

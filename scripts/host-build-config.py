#!/usr/bin/env python3
"""Writes what an image build needs of this machine's package settings into OUT
(scripts/build-image.sh mounts it read-only under /run/host-build for the RUN steps).

    host-build-config.py OUT

- `pip.conf`: the index settings pip itself would use here (its configuration files in pip's
  order, then `PIP_*` variables), with the certificate bundle copied beside it as
  `ca-certificates.crt` and the setting pointed at `/run/host-build/ca-certificates.crt`.
  Settings that name this machine's files (find-links, constraints, file:// indexes) are left
  out: the build cannot see them.
- `apt-proxy.conf`: apt's HTTP(S) proxy, where this machine has one.

Only the standard library: it runs before any virtual environment exists.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

MOUNTED = "/run/host-build"
# The pip settings that say how to reach an index; everything else stays on this machine.
KEPT = ("index-url", "extra-index-url", "trusted-host", "cert", "timeout", "default-timeout",
        "proxy", "retries")  # fmt: skip


def pip_config_files() -> list[Path]:
    """pip's configuration files, lowest priority first (pip's own order)."""
    home = Path.home()
    xdg = [
        Path(d) / "pip" / "pip.conf"
        for d in os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    ]
    files = [
        *xdg,
        Path("/etc/pip.conf"),
        home / ".pip" / "pip.conf",
        home / ".config" / "pip" / "pip.conf",
    ]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(Path(os.environ["PIP_CONFIG_FILE"]))
    return files


def pip_settings() -> dict[str, str]:
    settings: dict[str, str] = {}
    for path in pip_config_files():
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path)
        except (OSError, configparser.Error) as exc:
            print(f"host-build-config: {path} left out: {exc}", file=sys.stderr)
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                settings.update({k: v for k, v in parser.items(section) if k in KEPT})
    for key in KEPT:
        value = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if value:
            settings[key] = value
    return settings


def remote_only(urls: str) -> str:
    return " ".join(u for u in urls.split() if not u.startswith("file:"))


def write_pip(out: Path) -> None:
    settings = pip_settings()
    for key in ("index-url", "extra-index-url"):
        if key in settings:
            settings[key] = remote_only(settings[key])
            if not settings[key]:
                del settings[key]
    cert = settings.pop("cert", None)
    if cert and Path(cert).is_file():
        shutil.copyfile(cert, out / "ca-certificates.crt")
        settings["cert"] = f"{MOUNTED}/ca-certificates.crt"
    if settings:
        lines = ["[global]", *(f"{k} = {v}" for k, v in sorted(settings.items()))]
        (out / "pip.conf").write_text("\n".join(lines) + "\n")


def write_apt_proxy(out: Path) -> None:
    if shutil.which("apt-config") is None:
        return
    lines = []
    for scheme in ("http", "https"):
        value = subprocess.run(
            ["apt-config", "shell", "P", f"Acquire::{scheme}::Proxy"],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        if value.startswith("P="):
            proxy = value[2:].strip("'\"")
            if proxy and proxy.lower() not in ("direct", "false"):
                lines.append(f'Acquire::{scheme}::Proxy "{proxy}";')
    if lines:
        (out / "apt-proxy.conf").write_text("\n".join(lines) + "\n")


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: host-build-config.py OUT", file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    write_pip(out)
    write_apt_proxy(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

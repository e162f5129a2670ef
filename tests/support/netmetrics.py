"""Helpers for the nic and rdma tests: rendering records and checking them with promtool."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from gpuscope.agent.app.exposition import catalog
from gpuscope.exporters.prometheus.detail import EVERYTHING, MetricSelection
from gpuscope.exporters.prometheus.families import Families
from tests.support.promtext import Exposition


def render(
    renderer: Callable[[Any, Families], None],
    records: object,
    selection: MetricSelection = EVERYTHING,
) -> str:
    """The records' exposition; every series unless `selection` (a detail level) says less."""
    out = Families(catalog(), selection)
    renderer(records, out)
    return out.render_text().decode()


def scrape(
    renderer: Callable[[Any, Families], None],
    records: object,
    selection: MetricSelection = EVERYTHING,
) -> Exposition:
    return Exposition(render(renderer, records, selection))


def promtool_check(text: str) -> None:
    """`promtool check metrics` must accept the text and have nothing to say about it."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/install-deps.sh installs Debian's prometheus"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and not output, output

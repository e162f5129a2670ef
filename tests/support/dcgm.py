"""What the DCGM compatibility tests share: dcgm-exporter's default counter list (the fixture
tests/rules/dcgm-exporter/default-counters.csv, a copy of its etc/default-counters.csv), the
two variants of the agent's --dcgm-compat and the holder labels each puts on its series.

The counter list is read, not written out in the tests, so that the migration guide's table,
the agent's catalog and the end-to-end check follow dcgm-exporter's list when the fixture is
updated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.common import REPO

DEFAULT_COUNTERS_CSV = REPO / "tests" / "rules" / "dcgm-exporter" / "default-counters.csv"
MIGRATION_DOC = REPO / "docs" / "migrating-from-dcgm-exporter.md"

# dcgm-exporter's labels of a GPU on every compatibility series: Hostname (its releases up to
# 4.5.3-4.8.2) and hostname (its main branch since) both, on the same series.
DEVICE_LABELS = frozenset(
    {"gpu", "UUID", "device", "modelName", "Hostname", "hostname", "pci_bus_id"}
    | {"DCGM_FI_DRIVER_VERSION"}
)
HOSTNAME_LABELS = ("Hostname", "hostname")
# The labels of the container holding the GPU: dcgm-exporter's own, and what Prometheus
# stores them as when the scrape has honorLabels: false (the exported_* variant).
HOLDER_LABELS = ("namespace", "pod", "container")
EXPORTED_HOLDER_LABELS = ("exported_namespace", "exported_pod", "exported_container")
# --dcgm-compat's values -> the holder labels of their series.
VARIANTS: dict[str, tuple[str, ...]] = {
    "on": HOLDER_LABELS,
    "exported-labels": EXPORTED_HOLDER_LABELS,
}

# Counters of dcgm-exporter's list that gpuscope has no source for: not served (the guide's
# rows say "none"; the end-to-end check finds no series).
NO_GPUSCOPE_SOURCE = {
    "DCGM_FI_DEV_ENC_UTIL": "gpuscope does not read the video encoder",
    "DCGM_FI_DEV_DEC_UTIL": "gpuscope does not read the video decoder",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "gpuscope does not read vGPU licensing",
}

# Units as the migration guide writes them, where it does not copy the CSV's words.
_UNIT_NAMES = {"C": "°C", "bytes per second": "B/s"}


@dataclass(frozen=True, slots=True)
class DcgmCounter:
    """One uncommented line of dcgm-exporter's counter list."""

    name: str
    type: str  # gauge, counter, or label (a field dcgm-exporter puts on the other series)
    help: str

    @property
    def unit(self) -> str | None:
        """The unit the help text names: "(in MHz)", "... in bytes per second.", "Ratio of"
        (DCGM's profiling ratios, 0-1); None where it names none (counts, states, XIDs)."""
        m = re.search(r"\(in ([^)]+)\)", self.help) or re.search(
            r"\bin (bytes per second)\b", self.help
        )
        if m:
            return _UNIT_NAMES.get(m.group(1), m.group(1))
        return "ratio" if self.help.startswith("Ratio of") else None

    @property
    def type_and_unit(self) -> str:
        """The migration guide's "dcgm type, unit" cell for this counter."""
        return f"{self.type}, {self.unit}" if self.unit else self.type


def default_counters(path: Path = DEFAULT_COUNTERS_CSV) -> list[DcgmCounter]:
    """The counters of the list, in its order, as dcgm-exporter reads it: a line starting with
    `#` is a comment, the others are `field, type, help` (the help may hold commas)."""
    counters = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, kind, help_text = (part.strip() for part in line.split(",", 2))
        counters.append(DcgmCounter(name, kind, help_text))
    return counters


def metric_counters() -> list[DcgmCounter]:
    """The counters dcgm-exporter serves as series (not the label fields)."""
    return [c for c in default_counters() if c.type != "label"]


def served_names() -> list[str]:
    """The DCGM_FI_* names the agent serves with --dcgm-compat, in its catalog's order."""
    from gpuscope.exporters.prometheus.catalog_dcgm import FIELDS

    return [f.name for f in FIELDS]


def guide_table(heading: str) -> list[list[str]]:
    """The cells of each row of the first table under the migration guide's `heading` (a
    `##` or `###` title), its header and separator rows left out, in the guide's order."""
    lines = MIGRATION_DOC.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if re.fullmatch(rf"#+ {re.escape(heading)}", line))
    rows: list[list[str]] = []
    for line in lines[at + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif rows:
            break
    return rows[2:]


def first_cell_name(row: list[str]) -> str:
    """`DCGM_FI_DEV_SM_CLOCK` of a row whose first cell is that name in backticks."""
    return row[0].strip("`")

"""Write docs/metrics.md for the collectors gpuscope has:
`python -m gpuscope.agent.app.metrics_doc --write` (without `--write`: print it).

The text comes from exporters/prometheus/docs.py; the list of collectors and their summaries
from the registry, which only the app knows. A test fails when the file differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpuscope.agent.app.exposition import catalog
from gpuscope.agent.app.registry import COLLECTORS
from gpuscope.exporters.prometheus.docs import CollectorDoc, render_markdown
from gpuscope.exporters.prometheus.render import metrics_of

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def markdown() -> str:
    """docs/metrics.md as the code has it now."""
    collectors = [CollectorDoc(c.name, c.summary, metrics_of(c)) for c in COLLECTORS]
    return render_markdown(catalog(), collectors)


def main(argv: list[str]) -> int:
    text = markdown()
    if "--write" in argv:
        DOC_PATH.write_text(text)
        print(f"wrote {DOC_PATH}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Options of node-label publishing (agent/labels_loop.py), kept apart so that parsing the
command line does not import the labels machinery."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuscope.agent.options import flag, one_of


def _prefix(_flag: str, text: str) -> str:
    return text if not text or text.endswith("/") else text + "/"


@dataclass(frozen=True, slots=True)
class LabelsOptions:
    labels_mode: str = flag(
        "node",
        "node, nodefeature, file or none",
        parse=one_of("node", "nodefeature", "file", "none"),
    )
    labels_interval: float = flag(
        60.0,
        "seconds between node label recomputations",
        check=lambda v: None if v >= 1 else f"expected at least 1 second, got {v:g}",
    )
    label_prefix: str = flag(
        "gpuscope.io/", "prefix of every label and annotation the agent writes", parse=_prefix
    )
    labels_dir: Path = flag(
        Path("/etc/kubernetes/node-feature-discovery/features.d"),
        "NFD features.d directory for --labels-mode file",
    )
    namespace: str = flag(
        "gpuscope",
        "where NodeFeature objects go (the agent's namespace)",
        fallback=lambda env: env.get("POD_NAMESPACE") or None,
        shown="$POD_NAMESPACE, else gpuscope",
    )

"""Options of node-label publishing (agent/labels/loop.py), kept apart so that parsing the
command line does not import the labels machinery."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuscope.agent.runtime.options import ConfigError, flag, one_of
from gpuscope.exporters.labels.validation import prefix_problem


def label_prefix(flag_name: str, text: str) -> str:
    """`example.com` or `example.com/` (a DNS subdomain, every key starts with it), or empty.
    Refused here, not at the API: a bad prefix would make every key invalid."""
    prefix = text.removesuffix("/")
    if not prefix:
        return ""
    problem = prefix_problem(prefix)
    if problem is not None:
        raise ConfigError(f"{flag_name}: {problem}, got {text!r}")
    return prefix + "/"


def _at_least(minimum: float, what: str) -> Callable[[float], str | None]:
    return lambda v: None if v >= minimum else f"expected at least {minimum:g} {what}, got {v:g}"


@dataclass(frozen=True, slots=True)
class LabelsOptions:
    """The node labels' flags: how and where they are published (`--labels-mode`), under which
    prefix, how often they are recomputed, and how long absent GPUs keep them."""

    labels_mode: str = flag(
        "node",
        "node, nodefeature, file or none",
        parse=one_of("node", "nodefeature", "file", "none"),
    )
    labels_interval: float = flag(
        60.0,
        "seconds between node label recomputations",
        check=_at_least(1, "second"),
    )
    labels_absence_grace: float = flag(
        600.0,
        "seconds the GPUs must be confirmed absent (none found, or no driver) before their "
        "node labels are withdrawn; other GPU faults keep them, with gpu.healthy 0",
        check=_at_least(0, "seconds"),
    )
    label_prefix: str = flag(
        "gpuscope.io/", "prefix of every label and annotation the agent writes", parse=label_prefix
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

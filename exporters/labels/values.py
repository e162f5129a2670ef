"""Making any string a valid Kubernetes label value (and label name segment).

A label value is at most 63 characters of `[A-Za-z0-9._-]`, beginning and ending with an
alphanumeric character. NVML product names ("NVIDIA H100 80GB HBM3") need sanitizing the
way GPU Feature Discovery does (spaces to `-`, other characters dropped); a value that is
still too long keeps a readable prefix and ends in a short hash of the whole, so two long
names never collide and the same name always gives the same value (`agent/bounded.py`, the
rule the pods collector applies to workload names too).
"""

from __future__ import annotations

import re

from gpuscope.agent.bounded import bounded

MAX_LENGTH = 63
_INVALID = re.compile(r"[^A-Za-z0-9._-]")
_EDGES = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def sanitize(text: str) -> str:
    """GFD's rule: spaces become `-`, anything outside `[A-Za-z0-9._-]` is removed."""
    return _INVALID.sub("", text.strip().replace(" ", "-"))


def label_value(text: str, max_length: int = MAX_LENGTH) -> str:
    """A valid label value for `text` (possibly empty), deterministic and collision-resistant.

    `max_length` is smaller when the result becomes part of a label *name* segment, which
    shares the same 63 characters with what precedes it.
    """
    value = _EDGES.sub("", sanitize(text))
    return bounded(value, max_length, digest_of=text, tidy=lambda prefix: _EDGES.sub("", prefix))


def is_valid_value(value: str) -> bool:
    return len(value) <= MAX_LENGTH and (
        value == "" or re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", value) is not None
    )


def version(text: str) -> tuple[str, str] | None:
    """(major, minor) of a version such as "550.54.15" or "12.4", each without leading
    zeros, as label values (`Gt`/`Lt` compare integers); None if it does not parse."""
    parts = text.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return str(int(parts[0])), str(int(parts[1]))

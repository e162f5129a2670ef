"""Kubernetes' rules for label and annotation keys and label values, checked before publishing.

The API server rejects a whole patch (422) for one bad key or value, so one GPU whose name
sanitizes badly would otherwise keep every label off the Node. The label builders aim to
produce only valid keys and values; this is the last check before a write, and whatever
fails it is dropped alone, with a reason for the log, while the rest are published.

The rules are those of `k8s.io/apimachinery/pkg/util/validation`: a qualified name is an
optional DNS-1123 subdomain prefix (at most 253 characters) and `/`, then a name of at most
63 characters of `[A-Za-z0-9._-]` that starts and ends with an alphanumeric character; a
label value is empty or follows the name's rule. Annotation values are free text, bounded
(with every other annotation on the object) to 256 KiB.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_NAME = 63
MAX_PREFIX = 253
MAX_VALUE = 63
MAX_ANNOTATIONS_BYTES = 256 * 1024

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def prefix_problem(prefix: str) -> str | None:
    """Why `prefix` (without its `/`) cannot start a key, or None if it can."""
    if len(prefix) > MAX_PREFIX:
        return f"prefix longer than {MAX_PREFIX} characters"
    if not _SUBDOMAIN.fullmatch(prefix):
        return "prefix is not a lowercase DNS subdomain (e.g. example.com)"
    return None


def key_problem(key: str) -> str | None:
    """Why `key` is not a valid label or annotation key, or None if it is."""
    prefix, slash, name = key.rpartition("/")
    if slash:
        if "/" in prefix:
            return "more than one '/'"
        problem = prefix_problem(prefix)
        if problem is not None:
            return problem
    if not name:
        return "empty name"
    if len(name) > MAX_NAME:
        return f"name longer than {MAX_NAME} characters"
    if not _NAME.fullmatch(name):
        return "name is not [A-Za-z0-9._-] starting and ending alphanumeric"
    return None


def value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value, or None if it is (empty is valid)."""
    if len(value) > MAX_VALUE:
        return f"value longer than {MAX_VALUE} characters"
    if value and not _NAME.fullmatch(value):
        return "value is not [A-Za-z0-9._-] starting and ending alphanumeric"
    return None


@dataclass(frozen=True, slots=True)
class Validated:
    """What may be published, and what was dropped: key -> why."""

    labels: dict[str, str]
    annotations: dict[str, str]
    dropped: dict[str, str] = field(default_factory=dict)


def validate(labels: Mapping[str, str], annotations: Mapping[str, str]) -> Validated:
    """Split labels and annotations into the valid ones and the dropped ones (with reasons)."""
    kept_labels: dict[str, str] = {}
    kept_annotations: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for key, value in labels.items():
        problem = key_problem(key) or value_problem(value)
        if problem is None:
            kept_labels[key] = value
        else:
            dropped[key] = problem
    size = 0
    for key, value in annotations.items():
        problem = key_problem(key)  # a valid key is ASCII
        length = len(key) + len(value.encode(errors="surrogatepass"))
        if problem is None and size + length > MAX_ANNOTATIONS_BYTES:
            problem = f"annotations would exceed {MAX_ANNOTATIONS_BYTES} bytes"
        if problem is None:
            kept_annotations[key] = value
            size += length
        else:
            dropped[key] = problem
    return Validated(kept_labels, kept_annotations, dropped)

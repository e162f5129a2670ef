"""Bounding strings that come from outside the agent before they become label values.

Anything a user can write (a pod annotation, an owner's name, a GPU product name) may end up
as a label value: on Prometheus series, where one 200 KB annotation multiplies into every
series of a pod and every scrape, or on the Node object, where the API limits a value to 63
characters. A value over its bound keeps a readable prefix and ends in a short hash of the
whole, so it stays recognisable, two long values never collide and the same value always
gives the same result. Shared by the sources (agent/k8s) and the exporters (exporters/labels),
which must not import each other.
"""

from __future__ import annotations

from collections.abc import Callable

# Prometheus label values taken from pod metadata (workload kind, name and replica). Longer
# than any name Kubernetes itself validates for a label value (63) or a DNS label, so real
# names pass untouched; short enough that a hostile annotation costs a series at most a
# couple of hundred bytes.
PROMETHEUS_LABEL_MAX = 128
HASH_LENGTH = 8


def bounded(
    text: str,
    max_length: int = PROMETHEUS_LABEL_MAX,
    *,
    digest_of: str | None = None,
    tidy: Callable[[str], str] | None = None,
) -> str:
    """`text` itself when it fits in `max_length` characters, else `<prefix>-<hash>`.

    The hash (the first 8 hex digits of SHA-256) is of `digest_of` when given, the original
    a caller sanitized into `text`, so two originals that sanitize alike still differ. `tidy`
    cleans the cut prefix (a Kubernetes label value must not end in `-`, say). The result is
    never longer than `max_length`, which must leave room for the hash.
    """
    if len(text) <= max_length:
        return text
    if max_length < HASH_LENGTH + 2:
        raise ValueError(f"max_length {max_length} leaves no room for a prefix and the hash")
    import hashlib  # here: it loads OpenSSL's libcrypto, and most values are short enough

    whole = text if digest_of is None else digest_of
    digest = hashlib.sha256(whole.encode("utf-8", "surrogateescape")).hexdigest()[:HASH_LENGTH]
    prefix = text[: max_length - HASH_LENGTH - 1]
    if tidy is not None:
        prefix = tidy(prefix)
    return f"{prefix}-{digest}"

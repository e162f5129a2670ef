"""Metric-name patterns (`--metrics-include`, `--metrics-exclude`): RE2 syntax, fully
anchored, as Prometheus's own relabelling regexes are.

Python's `re` backtracks: a pattern such as `([a-z_]+)*Q` takes exponential time on a long
metric name, and a match holds the interpreter, so one scrape froze the whole agent,
`/healthz` included, and the liveness probe restarted it after every first scrape. RE2
matches in time linear in the name, whatever the pattern, and refuses what it cannot do
that way (backreferences, lookaround), which is refused at start with one line. Its
syntax is the one a Prometheus user already writes for `metric_relabel_configs`.

`google-re2` (import name `re2`) is imported when a pattern is compiled, so code that
never filters (the first-contact `gpuscope check`) runs without it.
"""

from __future__ import annotations

from typing import Any, Protocol


class NamePattern(Protocol):
    """A compiled pattern; `fullmatch` returns a match object or None."""

    def fullmatch(self, text: str) -> Any: ...


class PatternError(ValueError):
    """A pattern RE2 does not take; the message is one line."""


def compile_name_pattern(text: str) -> NamePattern:
    """`text` compiled by RE2 (the caller anchors it by calling `fullmatch`)."""
    import re2  # type: ignore[import-untyped]

    options = re2.Options()
    options.log_errors = False  # the error is ours to say, in one line, not absl's on stderr
    try:
        return re2.compile(text, options=options)  # type: ignore[no-any-return]
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "backslashreplace")
        raise PatternError(f"not an RE2 regular expression: {reason}") from None


def pattern_problem(text: str) -> str | None:
    """None if RE2 takes `text`, else why not (one line)."""
    try:
        compile_name_pattern(text)
    except PatternError as exc:
        return str(exc)
    return None

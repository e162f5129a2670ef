"""The pods collector's watch bounds are flags: defaults that fit a real API server's
bookmark gap, and bad values refused with one line that names the flag."""

from __future__ import annotations

import pytest

from gpuscope.agent.app.config import ConfigError, parse
from gpuscope.agent.k8s.collector import PODS


def test_defaults_outlast_the_bookmark_gap() -> None:
    options = parse([], {}).of(PODS)
    # Real API servers send a bookmark on a quiet watch about once a minute.
    assert 60 < options.pods_watch_read_timeout < options.pods_stale_after
    assert (options.pods_watch_read_timeout, options.pods_stale_after) == (75.0, 90.0)


def test_flags_and_variables_set_them() -> None:
    options = parse(["--pods-stale-after", "120"], {"GPUSCOPE_PODS_WATCH_READ_TIMEOUT": "100"}).of(
        PODS
    )
    assert (options.pods_watch_read_timeout, options.pods_stale_after) == (100.0, 120.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pods-stale-after", "nan"], "--pods-stale-after: expected a finite number, got 'nan'"),
        (["--pods-stale-after", "inf"], "--pods-stale-after: expected a finite number, got 'inf'"),
        (["--pods-stale-after", "0"], "--pods-stale-after: expected 10 to 3600 seconds, got 0"),
        (
            ["--pods-watch-read-timeout", "-5"],
            "--pods-watch-read-timeout: expected 10 to 3600 seconds, got -5",
        ),
        (
            ["--pods-watch-read-timeout", "soon"],
            "--pods-watch-read-timeout: expected a number, got 'soon'",
        ),
    ],
)
def test_bad_values_are_one_clear_line(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(args, {})
    assert str(err.value) == message

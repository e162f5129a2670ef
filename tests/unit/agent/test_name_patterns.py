"""--metrics-include / --metrics-exclude are RE2 patterns, fully anchored, as Prometheus's
relabelling regexes are: linear time whatever the pattern, and what RE2 cannot do refused
at start in one line."""

from __future__ import annotations

import time

import pytest

from gpuscope.agent.app.config import ConfigError, parse
from gpuscope.agent.name_patterns import PatternError, compile_name_pattern
from gpuscope.exporters.prometheus.detail import MetricSelection
from gpuscope.exporters.prometheus.spec import MetricSpec

# A long metric-like name on which a backtracking engine takes exponential time for the
# patterns below (Python's `re` runs for hours on it); RE2 answers in microseconds.
LONG_NAME = "gpuscope_gpu_nvlink_link_" + "errors_" * 12 + "total"


def spec(name: str) -> MetricSpec:
    return MetricSpec(name, "gauge", "A test family.", (), "gpu", at_default="none")


@pytest.mark.parametrize("pattern", [r"([a-z_]+)*Q", r"(\w+)*!", r"(a|a)*b", r"((x*)*)*y"])
def test_a_pattern_that_backtracks_exponentially_matches_in_linear_time(pattern: str) -> None:
    compiled = compile_name_pattern(pattern)
    began = time.perf_counter()
    for _ in range(100):
        assert compiled.fullmatch(LONG_NAME) is None
    # 100 matches: about a millisecond with RE2; a backtracking engine would not return.
    assert time.perf_counter() - began < 2.0


def test_patterns_are_fully_anchored_on_the_metric_name() -> None:
    selection = MetricSelection.from_flags("default", include="gpuscope_gpu_power")
    assert selection.mode(spec("gpuscope_gpu_power")) == "full"
    # Neither a longer name nor a name containing it: a full match, as Prometheus's.
    assert selection.mode(spec("gpuscope_gpu_power_watts")) == "off"
    assert selection.mode(spec("x_gpuscope_gpu_power")) == "off"
    also = MetricSelection.from_flags("default", include="gpu_.*|gpuscope_a", exclude="gpuscope_b")
    assert also.mode(spec("gpuscope_gpu_x")) == "off"  # `gpu_.*` does not match inside
    assert also.mode(spec("gpuscope_a")) == "full"


def test_exclude_wins_and_the_health_series_cannot_be_excluded() -> None:
    selection = MetricSelection.from_flags(
        "full", include="gpuscope_.*", exclude="gpuscope_(gpu_.*|collector_success)"
    )
    assert selection.mode(spec("gpuscope_gpu_temperature_celsius")) == "off"
    assert selection.mode(spec("gpuscope_nic_up")) == "full"
    assert selection.mode(spec("gpuscope_collector_success")) == "full"


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(gpuscope)_\1", r"invalid escape sequence: \1"),  # backreference
        (r"gpuscope_(?!nic).*", "invalid perl operator: (?!"),  # lookahead
        (r"(?<=gpu)_.*", "invalid perl operator: (?<="),  # lookbehind
        ("gpuscope_(gpu", "missing ): gpuscope_(gpu"),
        ("a{1001}", "invalid repetition size: {1001}"),
    ],
)
def test_what_re2_cannot_match_in_linear_time_is_one_line_at_start(
    pattern: str, reason: str
) -> None:
    with pytest.raises(PatternError) as err:
        compile_name_pattern(pattern)
    assert str(err.value) == f"not an RE2 regular expression: {reason}"
    for flag_name in ("--metrics-include", "--metrics-exclude"):
        with pytest.raises(ConfigError) as bad:
            parse([flag_name, pattern], env={})
        assert str(bad.value) == f"{flag_name}: not an RE2 regular expression: {reason}"
        assert "\n" not in str(bad.value)


def test_the_syntax_prometheus_users_write_is_taken() -> None:
    # Classes, alternation, non-greedy, named groups, Perl classes, flags: RE2 takes them all.
    for pattern in (
        r"gpuscope_(gpu|mig)_sm_occupancy_ratio",
        r"gpuscope_rdma_port_(congestion|errors)_total",
        r"(?i)GPUSCOPE_NIC_.+?",
        r"(?P<family>gpuscope_[a-z]+)_\w+",
        r"gpuscope_[[:alpha:]_]+",
    ):
        assert parse(["--metrics-include", pattern], env={}).agent.metrics_include == pattern

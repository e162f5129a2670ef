"""The collector registry is the one place a collector is declared: the parser, the
environment variables, the Config, the renderers, docs/metrics.md and the README's flag
table all follow from it, and drift fails here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuscope.agent.app.agent import build_sources
from gpuscope.agent.app.config import (
    FLAG_TABLE_BEGIN,
    FLAG_TABLE_END,
    all_flags,
    flag_table,
    parse,
)
from gpuscope.agent.app.exposition import catalog
from gpuscope.agent.app.registry import BY_NAME, COLLECTORS, DEFAULT_COLLECTORS, accelerators
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.runtime.accelerators import ACCELERATOR
from gpuscope.agent.runtime.options import ConfigError
from gpuscope.exporters.prometheus.render import renderer_of

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_flag_table_is_the_declared_flags() -> None:
    """After adding or changing a flag: GPUSCOPE_UPDATE_GOLDEN=1 (make golden-update)."""
    text = README.read_text()
    begin, end = text.index(FLAG_TABLE_BEGIN), text.index(FLAG_TABLE_END) + len(FLAG_TABLE_END)
    expected = flag_table().rstrip("\n")
    if os.environ.get("GPUSCOPE_UPDATE_GOLDEN") == "1":
        README.write_text(text[:begin] + expected + text[end:])
        text = README.read_text()
        begin, end = text.index(FLAG_TABLE_BEGIN), text.index(FLAG_TABLE_END) + len(FLAG_TABLE_END)
    assert text[begin:end] == expected, "README flag table is stale: run make golden-update"


def test_every_flag_is_unique_documented_and_has_its_variable() -> None:
    flags = [f for _title, group in all_flags() for f in group]
    names = [f.name for f in flags]
    assert len(names) == len(set(names))
    for f in flags:
        assert f.meta.help and not f.meta.help.endswith("."), f.name
        assert f.env == "GPUSCOPE_" + f.name[2:].replace("-", "_").upper()


@pytest.mark.parametrize("collector", COLLECTORS, ids=lambda c: c.name)
def test_each_collector_renders_only_metrics_it_declares(collector) -> None:  # type: ignore[no-untyped-def]
    renderer = renderer_of(collector)
    if renderer is None:
        return  # kubelet, pods: rendered by the attribution stage
    assert renderer.collector is collector
    assert renderer.metrics, collector.name
    own = {m for m in renderer.metrics if m.source == collector.name}
    assert own, collector.name
    # An accelerator collector also renders the families every vendor shares, declared
    # once by another accelerator collector (same declaration, same meaning).
    shared = set(renderer.metrics) - own
    if shared:
        assert collector.role == ACCELERATOR, collector.name
        others = {c.name: renderer_of(c) for c in accelerators(BY_NAME) if c is not collector}
        for m in shared:
            declarer = others.get(m.source)
            assert declarer is not None and m in declarer.metrics, (collector.name, m.name)
    assert set(renderer.metrics) <= set(catalog().metrics)


@pytest.mark.parametrize("collector", COLLECTORS, ids=lambda c: c.name)
def test_each_built_source_answers_to_its_collectors_name(collector) -> None:  # type: ignore[no-untyped-def]
    """Collections are keyed by the source's name and read through the declaration."""
    config = parse(["--collectors", collector.name], env={})
    (source,) = build_sources(config, ManualClock(0.0), background=False)
    try:
        assert source.name == collector.name
    finally:
        source.stop()


def test_every_declared_variable_sets_its_option() -> None:
    """Each flag's GPUSCOPE_* variable reaches the Config, collector options included."""
    config = parse([], env={"GPUSCOPE_BPF_MAX_CGROUPS": "77", "GPUSCOPE_LABELS_INTERVAL": "5"})
    net = next(c for c in COLLECTORS if c.name == "net")
    assert config.of(net).bpf_max_cgroups == 77
    assert config.labels.labels_interval == 5.0
    assert config.collectors == DEFAULT_COLLECTORS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--collectors", ""], "--collectors: expected at least one collector"),
        (["--sample-interval", "nan"], "--sample-interval: expected a finite number, got 'nan'"),
        (["--labels-interval", "inf"], "--labels-interval: expected a finite number, got 'inf'"),
        (["--net-prune-grace", "nan"], "--net-prune-grace: expected a finite number, got 'nan'"),
    ],
)
def test_no_collectors_and_non_finite_numbers_are_refused(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(args, env={})
    assert str(err.value) == message

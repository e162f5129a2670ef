"""Bounding outside strings before they become label values: readable, deterministic and
collision-resistant, never longer than asked."""

from __future__ import annotations

import pytest

from gpuscope.agent.bounded import HASH_LENGTH, PROMETHEUS_LABEL_MAX, bounded


def test_short_values_are_kept_as_they_are() -> None:
    assert bounded("") == ""
    assert bounded("bert-large") == "bert-large"
    assert bounded("é" * PROMETHEUS_LABEL_MAX) == "é" * PROMETHEUS_LABEL_MAX  # characters


def test_long_values_keep_a_prefix_and_end_in_a_hash_of_the_whole() -> None:
    a, b = bounded("job-" + "a" * 1000), bounded("job-" + "a" * 999 + "b")
    assert len(a) == len(b) == PROMETHEUS_LABEL_MAX
    assert a.startswith("job-aaaa") and a[-HASH_LENGTH - 1] == "-"
    assert a != b  # same prefix, different whole
    assert bounded("job-" + "a" * 1000) == a  # deterministic across calls (and processes)


def test_the_hash_can_be_of_the_original_and_the_prefix_tidied() -> None:
    one = bounded("x" * 20 + "--" + "y" * 20, 30, digest_of="original one")
    two = bounded("x" * 20 + "--" + "y" * 20, 30, digest_of="original two")
    assert one != two and len(one) == 30
    # The cut falls after "x" * 20 + "-": tidied, the prefix does not end in a dash.
    tidy = bounded("x" * 20 + "--" + "y" * 20, 30, tidy=lambda p: p.rstrip("-"))
    assert tidy.startswith("x" * 20 + "-") and "--" not in tidy and len(tidy) == 29


def test_text_that_is_not_valid_unicode_is_still_bounded() -> None:
    bad = "name-\udcff" * 100  # what os.fsdecode makes of a stray byte
    assert len(bounded(bad)) == PROMETHEUS_LABEL_MAX


def test_a_bound_with_no_room_for_the_hash_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        bounded("x" * 50, HASH_LENGTH + 1)

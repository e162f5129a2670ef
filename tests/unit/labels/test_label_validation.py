"""Label keys and values checked against Kubernetes' rules before a write: a bad one is left
out with its reason, the rest go through; keys built from GPU names are always valid."""

from __future__ import annotations

import pytest

from gpuscope.agent.app.config import ConfigError, parse
from gpuscope.exporters.labels.gpu import model_key_name
from gpuscope.exporters.labels.validation import key_problem, validate, value_problem
from gpuscope.exporters.labels.values import label_value

P = "gpuscope.io/"

VALID_KEYS = [
    f"{P}gpu.count",
    f"{P}gpu.model.NVIDIA-H100-80GB-HBM3",
    "kubernetes.io/hostname",
    "no-prefix",
    f"{P}{'a' * 63}",
    f"{'a' * 63}.{'b' * 63}.{'c' * 63}.{'d' * 61}/x",  # a 253-character prefix
]
INVALID_KEYS = [
    f"{P}gpu.model.",  # what one unusable GPU name gave before: 422 for the whole patch
    f"{P}gpu.model-",
    f"{P}.hidden",
    f"{P}",
    f"{P}{'a' * 64}",
    "Example.COM/x",  # prefixes are lowercase DNS subdomains
    "under_score.io/x",
    "a/b/c",
    "/x",
    f"{'a' * 63}.{'b' * 63}.{'c' * 63}.{'d' * 62}/x",  # 254
    "gpuscope.io/gpu model",
    "gpuscope.io/gpu.modèle",
]


@pytest.mark.parametrize("key", VALID_KEYS)
def test_valid_keys_pass(key: str) -> None:
    assert key_problem(key) is None


@pytest.mark.parametrize("key", INVALID_KEYS)
def test_invalid_keys_are_named(key: str) -> None:
    assert key_problem(key)


@pytest.mark.parametrize("value", ["", "8", "NVIDIA-H100-80GB-HBM3", "a.b_c-d", "x" * 63])
def test_valid_values_pass(value: str) -> None:
    assert value_problem(value) is None


@pytest.mark.parametrize("value", ["x" * 64, "ends-", "ends.", "-starts", "a b", "naïve", "a/b"])
def test_invalid_values_are_named(value: str) -> None:
    assert value_problem(value)


def test_a_bad_key_or_value_is_dropped_and_the_rest_kept() -> None:
    checked = validate(
        {f"{P}gpu.count": "8", f"{P}gpu.model.": "1", f"{P}gpu.product": "H100-"},
        {f"{P}topology": "{}", "bad key": "x"},
    )
    assert checked.labels == {f"{P}gpu.count": "8"}
    assert checked.annotations == {f"{P}topology": "{}"}
    assert set(checked.dropped) == {f"{P}gpu.model.", f"{P}gpu.product", "bad key"}


def test_annotations_over_the_api_limit_are_dropped() -> None:
    checked = validate({}, {f"{P}a": "x" * 200_000, f"{P}b": "y" * 100_000, f"{P}c": "z"})
    assert set(checked.annotations) == {f"{P}a", f"{P}c"}
    assert "262144 bytes" in checked.dropped[f"{P}b"]


NAMES = [
    "NVIDIA H100 80GB HBM3.",
    "NVIDIA H100 80GB HBM3-",
    "NVIDIA H100 80GB HBM3 _.-",
    "日本語のみ",
    "...",
    "™",
    "A" * 200,
    "A" * 52 + ".-" + "B" * 10,
]


@pytest.mark.parametrize("name", NAMES)
def test_product_names_ending_badly_give_valid_values_and_keys(name: str) -> None:
    assert value_problem(label_value(name)) is None
    key = f"{P}{model_key_name(name)}"
    assert key_problem(key) is None, key
    assert model_key_name(name) == model_key_name(name)  # stable from round to round


def test_a_trailing_dot_or_dash_is_trimmed_not_kept() -> None:
    assert label_value("NVIDIA H100 80GB HBM3.") == "NVIDIA-H100-80GB-HBM3"
    assert model_key_name("NVIDIA H100 80GB HBM3-") == "gpu.model.NVIDIA-H100-80GB-HBM3"


def test_names_with_nothing_usable_still_get_distinct_keys() -> None:
    assert model_key_name("日本語") != model_key_name("中文")
    assert model_key_name("日本語").startswith("gpu.model.unknown-")


@pytest.mark.parametrize("prefix", ["Example.com", "a_b.io", "-x.io", "x" * 254])
def test_a_label_prefix_that_cannot_start_a_key_is_refused_at_start(prefix: str) -> None:
    with pytest.raises(ConfigError, match=r"^--label-prefix: "):
        parse([f"--label-prefix={prefix}"], env={})


def test_label_prefix_gets_its_slash() -> None:
    assert parse(["--label-prefix", "example.com"], env={}).labels.label_prefix == "example.com/"
    assert parse(["--label-prefix", ""], env={}).labels.label_prefix == ""


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-1", "ten"])
def test_absence_grace_must_be_a_finite_non_negative_number(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--labels-absence-grace: "):
        parse([f"--labels-absence-grace={text}"], env={})

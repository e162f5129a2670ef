"""Reading Prometheus exposition text in tests: samples keyed by name and labels."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]


class Exposition:
    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, Labels], float] = {}
        self.types: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}

    def series(self, name: str, **match: str) -> dict[Labels, float]:
        want = set(match.items())
        return {
            labels: v for (n, labels), v in self.samples.items() if n == name and want <= labels
        }

    def value(self, name: str, **match: str) -> float:
        found = self.series(name, **match)
        if len(found) != 1:
            raise AssertionError(f"{name}{match}: expected one series, found {len(found)}")
        return next(iter(found.values()))

    def get(self, name: str, **match: str) -> float | None:
        found = self.series(name, **match)
        return next(iter(found.values())) if len(found) == 1 else None

    def by_label(self, name: str, label: str, **match: str) -> Mapping[str, float]:
        return {dict(labels)[label]: v for labels, v in self.series(name, **match).items()}

    def rows(self, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
        """Every matching series as (labels as a dict, value), in exposition order."""
        return [(dict(labels), v) for labels, v in self.series(name, **match).items()]

"""Declared options: each part of the agent declares its flags once, as the fields of a
frozen dataclass, and everything else is derived from those fields.

A field made with `flag(default, help, ...)` becomes `--field-name` on the command line and
`GPUSCOPE_FIELD_NAME` in the environment (flags win over variables, variables over the
default); its help text, the default shown in `--help` and the README's flag table come from
the same declaration. The field's type annotation chooses the parser (`bool`, `int`,
`float`, `str`, `Path`, `Path | None`, `tuple[str, ...]`); `parse` replaces it and `check`
adds a range or a choice. Bad values raise `ConfigError` with one line that names the flag.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

_KEY = "gpuscope.flag"


class ConfigError(ValueError):
    """A flag or variable with a bad value; the message is the one line a user sees."""


Parse = Callable[[str, str], Any]  # (flag, text) -> value; raises ConfigError
Check = Callable[[Any], str | None]  # value -> "expected ..., got ..." or None


@dataclass(frozen=True, slots=True)
class FlagMeta:
    """What `flag()` keeps in a field's metadata: its help text and how its value is parsed,
    checked, defaulted from the environment and shown."""

    help: str
    parse: Parse | None = None
    check: Check | None = None
    # A default computed from the environment (NODE_NAME from the downward API, say).
    fallback: Callable[[Mapping[str, str]], str | None] | None = None
    shown: str | None = None  # the default as --help and the README say it


def flag(
    default: Any,
    help: str,  # noqa: A002 - the argparse word
    *,
    parse: Parse | None = None,
    check: Check | None = None,
    fallback: Callable[[Mapping[str, str]], str | None] | None = None,
    shown: str | None = None,
) -> Any:
    """A dataclass field that is also a command-line flag (see the module docstring)."""
    meta = FlagMeta(help, parse, check, fallback, shown)
    return dataclasses.field(default=default, metadata={_KEY: meta})


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag as the parser, the docs and the README see it."""

    owner: str  # the collector or part that declares it
    attr: str
    kind: Any  # the resolved annotation
    default: Any
    meta: FlagMeta

    @property
    def name(self) -> str:
        return "--" + self.attr.replace("_", "-")

    @property
    def env(self) -> str:
        return "GPUSCOPE_" + self.attr.upper()

    @property
    def is_bool(self) -> bool:
        return self.kind is bool

    @property
    def default_text(self) -> str:
        if self.meta.shown is not None:
            return self.meta.shown
        return _format(self.default)

    def value(self, given: str | None, env: Mapping[str, str]) -> Any:
        """The typed, checked value from the flag's text, its variable, or its default."""
        text = given if given is not None else env.get(self.env)
        if text is None and self.meta.fallback is not None:
            text = self.meta.fallback(env)
        if text is None:
            value = self.default
        else:
            value = (self.meta.parse or _parser(self.kind))(self.name, text)
        if self.meta.check is not None:
            problem = self.meta.check(value)
            if problem is not None:
                raise ConfigError(f"{self.name}: {problem}")
        return value


@cache
def flags_of(options: type, owner: str) -> tuple[Flag, ...]:
    """The flags an options dataclass declares, in field order."""
    hints = typing.get_type_hints(options)
    out = []
    for f in dataclasses.fields(options):
        meta = f.metadata.get(_KEY)
        if meta is None:
            raise TypeError(f"{options.__name__}.{f.name} is not declared with flag()")
        out.append(Flag(owner, f.name, hints[f.name], f.default, meta))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class NoOptions:
    """For parts that have no flags of their own."""


# --- parsers by type ----------------------------------------------------------------------


def _parser(kind: Any) -> Parse:
    if kind is bool:
        return boolean
    if kind is int:
        return whole
    if kind is float:
        return number
    if kind is str:
        return lambda _flag, text: text
    if kind is Path:
        return lambda _flag, text: Path(text)
    if kind == (Path | None):
        return lambda _flag, text: Path(text) if text else None
    if kind == tuple[str, ...]:
        return lambda _flag, text: names(text)
    raise TypeError(f"no parser for options of type {kind!r}: declare parse=")


def number(flag_name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{flag_name}: expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{flag_name}: expected a finite number, got {text!r}")
    return value


def whole(flag_name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{flag_name}: expected a whole number, got {text!r}") from None


def boolean(flag_name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{flag_name}: expected true or false, got {text!r}")


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list, stripped, without empty items or repeats, in order."""
    return tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def one_of(*choices: str) -> Parse:
    """A case-insensitive choice: `expected json or text, got 'xml'`."""
    wanted = _either(choices)

    def parse(flag_name: str, text: str) -> str:
        lowered = text.lower()
        if lowered not in choices:
            raise ConfigError(f"{flag_name}: expected {wanted}, got {text!r}")
        return lowered

    return parse


def _either(words: Sequence[str]) -> str:
    return ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if value is None:
        return ""
    return str(value)

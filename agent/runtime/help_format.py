"""argparse's help formatter, asking the terminal its width once instead of per flag.

`ArgumentParser.add_argument` builds a `HelpFormatter` for every flag only to check its
metavar, and each `HelpFormatter()` calls `shutil.get_terminal_size()`: one import of
`shutil` (which loads `bz2` and `lzma` with it) and a terminal query per flag, about 3 ms of
every agent start for a width nothing reads unless `--help` or a usage error is printed
(issue #24). `HelpFormatter` here asks once, the way shutil does: `COLUMNS`, else the
terminal on standard output, else 80.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import cache


@cache
def terminal_columns() -> int:
    """What `shutil.get_terminal_size().columns` answers, without importing shutil."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


class HelpFormatter(argparse.HelpFormatter):
    """`argparse.HelpFormatter` with the terminal's width asked for once per process."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = terminal_columns() - 2  # argparse's own default
        super().__init__(prog, indent_increment, max_help_position, width)

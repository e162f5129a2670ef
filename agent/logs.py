"""Logging setup: one line per event, as JSON for log pipelines or as text for people."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

# HTTP client libraries that log every request at INFO (httpx: "HTTP Request: GET ... 200"),
# one line per Kubernetes API call: kept to warnings unless the agent logs at debug.
# lightkube 1.x speaks through httpx2/httpcore2, the older releases through httpx/httpcore.
CHATTY = ("httpx", "httpx2", "httpcore", "httpcore2", "lightkube")

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line. `json` is imported when this formatter is made, not by
    every agent that imports this module (the text format does not need it)."""

    def __init__(self) -> None:
        super().__init__()
        import json

        self._dumps = json.dumps

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return self._dumps(entry, default=str)


def setup(fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet = logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING
    for name in CHATTY:
        logging.getLogger(name).setLevel(quiet)

"""How ``docket worker`` logs: ``--logging-level`` and ``--logging-format``
(``rich``, ``plain`` or ``json``), as pydocket's CLI offers them.

Every format writes to standard output through one handler on the root
logger.  ``json`` writes one JSON object per line: the logger's name, the
time, the level and the message, then the record's ``extra`` fields (the
docket, worker, task and key of a run), and the traceback when there is one.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

__all__ = ["JsonFormatter", "LogFormat", "LogLevel", "configure_logging", "default_log_format"]


class LogLevel(enum.StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


class LogFormat(enum.StrEnum):
    RICH = "rich"
    PLAIN = "plain"
    JSON = "json"


def default_log_format() -> LogFormat:
    """``rich`` on a terminal, ``plain`` when the output goes elsewhere."""
    return LogFormat.RICH if sys.stdout.isatty() else LogFormat.PLAIN


#: the attributes every ``LogRecord`` has; anything else came as ``extra``
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "name": record.name,
            "asctime": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "levelname": record.levelname,
            "message": record.getMessage(),
        }
        for attribute, value in vars(record).items():
            if attribute not in _RECORD_ATTRIBUTES and attribute not in entry:
                entry[attribute] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def _handler(log_format: LogFormat) -> logging.Handler:
    if log_format is LogFormat.JSON:
        handler: logging.Handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(JsonFormatter())
    elif log_format is LogFormat.PLAIN:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(
            logging.Formatter(
                "[%(asctime)s] %(levelname)s - %(name)s - %(message)s",
                datefmt="%Y-%m-%d %H:%M:%S",
            )
        )
    else:
        from rich.logging import RichHandler

        handler = RichHandler()
        handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
    return handler


def configure_logging(level: LogLevel, log_format: LogFormat) -> logging.Handler:
    """Send the root logger's records at ``level`` and above to standard
    output in ``log_format``; returns the handler installed."""
    root = logging.getLogger()
    handler = _handler(log_format)
    root.addHandler(handler)
    root.setLevel(level.value)
    return handler

"""The ``docket`` command line (typer and rich), also run as ``python -m
docket_core``.

``commands`` declares the commands (``worker_command`` the worker's); the
parsing helpers (durations, typed strike values, operators) live in
``parsing``, the log formats in ``logs``, the tables in ``render`` and the
live view of ``watch`` in ``watch``.  Imports go one way: this module uses
``commands``, which uses the others; none imports this module.
"""

from __future__ import annotations

from .commands import app
from .common import DEFAULT_URL, MEMORY_NOTE, MEMORY_WORKER_NOTE
from .parsing import parse_duration, parse_value

__all__ = [
    "DEFAULT_URL",
    "MEMORY_NOTE",
    "MEMORY_WORKER_NOTE",
    "app",
    "main",
    "parse_duration",
    "parse_value",
]


def main(argv: list[str] | None = None) -> int:
    """Run the ``docket`` command with ``argv`` (default: the process's
    arguments); returns the exit status."""
    try:
        app(args=argv, prog_name="docket")
    except SystemExit as stop:
        code = stop.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    return 0

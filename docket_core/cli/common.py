"""What every ``docket`` command shares: the ``--url`` and ``--docket``
options (with pydocket's environment variables and defaults), the note about
``memory://`` dockets, and running a command's body on an open docket with
docket's errors turned into exit statuses (1: the store or the docket
failed; 2: a usage error, as for a bad option).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from ..sansio.errors import DocketError, UsageError
from .parsing import parse_duration

if TYPE_CHECKING:
    from ..docket import Docket

__all__ = [
    "DEFAULT_URL",
    "MEMORY_NOTE",
    "MEMORY_WORKER_NOTE",
    "DocketOption",
    "UrlOption",
    "duration_option",
    "fail",
    "is_memory",
    "note_memory",
    "run_guarded",
    "run_on_docket",
]

T = TypeVar("T")

#: pydocket's default store, for every command
DEFAULT_URL = "redis://localhost:6379/0"

#: the one-line notes a command prints (on standard error) for a memory:// URL
MEMORY_NOTE = (
    "note: a memory:// docket lives inside one process; only this process's docket is visible"
)
MEMORY_WORKER_NOTE = (
    "note: a memory:// docket lives inside one process; only tasks added in this process will run"
)

UrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        help="The store holding the docket: redis://, rediss://, valkey://, memory://...",
        envvar="DOCKET_URL",
    ),
]
DocketOption = Annotated[
    str,
    typer.Option("--docket", help="The name of the docket", envvar="DOCKET_NAME"),
]


def is_memory(url: str) -> bool:
    return url.strip().lower().startswith("memory://")


def note_memory(url: str, note: str = MEMORY_NOTE) -> None:
    """Say once, on standard error, that a memory:// docket is this process's alone."""
    if is_memory(url):
        print(note, file=sys.stderr)


def duration_option(value: Any) -> timedelta:
    """typer's parser for duration options (``30s``, ``250ms``, ``01:30``...)."""
    try:
        return parse_duration(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``Error: message`` on standard error and exit with ``code``."""
    print(f"Error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def run_on_docket(url: str, name: str, body: Callable[[Docket], Awaitable[T]]) -> T:
    """Open docket ``name`` at ``url``, run ``body`` on it and return its
    result; docket's errors end the command (exit 2 for a usage error, 1
    for anything else docket raises, such as an unreachable store)."""
    import anyio

    from ..docket import Docket

    note_memory(url)

    async def run() -> T:
        async with Docket(name=name, url=url) as docket:
            return await body(docket)

    return run_guarded(lambda: anyio.run(run))


def run_guarded(call: Callable[[], T]) -> T:
    """``call()``, with docket's errors turned into exit statuses."""
    try:
        return call()
    except UsageError as error:
        fail(str(error), 2)
    except DocketError as error:
        fail(str(error), 1)

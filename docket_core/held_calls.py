"""Calls held behind a pickup's claim (``HeldCalls``, mixed into every store).

An idle worker's pickup starts a fresh delivery's run with its claim
(``lifecycle``: ``START_EARLY``).  Writing the claim is a socket write, and
on a machine whose other CPU sleeps it costs a good part of the pickup (the
write wakes the server): so the reader hands the run over first and lets it
begin, and only then writes the claim (``BatchSending._flush``).

A run must still never reach the store ahead of its claim: a run that reads
its own key sees it running, and one that replaces its own key replaces a
running key, not the message it was handed.  So while the reader holds a
claim back (``hold_calls``), every call on the store waits for it: the
reader lets them go (``release_calls``) in the step that writes the claim,
before that step first yields, so a call that waited writes after it.  Only
the worker's own docket's store is held: a run's calls through another
``Docket`` object on the same server are not, and may reach the server
before its claim.

Every store class takes this mixin: its coroutine methods that reach the
store (``GATED``, the ``StorageAdapter`` ones) wait while calls are held,
whichever class in its hierarchy defines them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

__all__ = ["GATED", "HeldCalls"]

#: the store methods that wait while calls are held
GATED = frozenset(
    {
        "record_partitions",
        "forget_leaving",
        "close_partition",
        "execute",
        "execute_in_order",
        "execute_apart",
        "read",
        "pending",
        "depths",
        "get_record",
        "get_progress",
        "report_progress",
        "add_strike",
        "strikes",
        "snapshot",
        "workers",
        "clear",
        "dead_letters",
        "replay_dead_letters",
        "drop_dead_letters",
    }
)


def _gated(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def gated(self: HeldCalls, *args: Any, **kwargs: Any) -> Any:
        while self._held is not None:
            await self._held.wait()
        return await method(self, *args, **kwargs)

    gated.__held_gate__ = True  # type: ignore[attr-defined]
    return gated


class HeldCalls:
    """Lets the worker's reader hold every call on this store back until its
    pickup's claim is written (module docstring)."""

    #: set while calls are held: the event their release sets
    _held: anyio.Event | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in GATED & cls.__dict__.keys():
            method = cls.__dict__[name]
            if inspect.iscoroutinefunction(method) and not hasattr(method, "__held_gate__"):
                setattr(cls, name, _gated(method))

    def hold_calls(self) -> None:
        """Hold every call on this store back until ``release_calls``."""
        if self._held is None:
            self._held = anyio.Event()

    def release_calls(self) -> None:
        """Let the held calls go (they write after the caller's next write,
        if it makes one before it yields); nothing if none are held."""
        held, self._held = self._held, None
        if held is not None:
            held.set()

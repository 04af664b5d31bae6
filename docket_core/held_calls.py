"""Calls held behind a pickup's claim (``HeldCalls``, mixed into every store).

An idle worker's pickup starts a fresh delivery's run with its claim
(``lifecycle``: ``START_EARLY``).  Writing the claim is a socket write, and
on a machine whose other CPU sleeps it costs a good part of the pickup (the
write wakes the server): so the reader hands the run over first and lets it
begin, and only then writes the claim (``BatchSending._flush``).

A run must still never reach the store ahead of its claim: a run that reads
its own key sees it running, and one that replaces its own key replaces a
running key, not the message it was handed.  So while the reader holds a
claim back (``hold_calls``), every call on the store waits for it.  The
reader then lets its claim's call through (``pass_next_call``, just before
it makes that call): the calls held go once it is written.  Where the
store's client writes a call before it first yields (memory, GLIDE), that is
at its first yield, so a call that waited writes after it.  Where it may
yield first (redis-py: a call that finds no connection at hand takes one
from the pool, connecting it, a sentinel's asking for the primary first),
the held calls would then go out on another connection, ahead of the claim:
such a store says ``tells_writes`` and calls ``written`` once a call's
commands are on the wire, and the held calls go then (or once the claim's
call returns, if it fails first).  Only the worker's own docket's store is
held: a run's calls through another ``Docket`` object on the same server
are not, and may reach the server before its claim.

Every store class takes this mixin: its coroutine methods that reach the
store (``GATED``, the ``StorageAdapter`` ones) wait while calls are held,
whichever class in its hierarchy defines them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import anyio

__all__ = ["GATED", "HeldCalls", "written"]

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


#: the store whose held calls the current task's call lets go once it is
#: written (``HeldCalls.pass_next_call``): set for that call, and the calls it
#: makes (on the store itself, or on the stores beneath it)
_passing: ContextVar[HeldCalls | None] = ContextVar("docket_held_calls_passing", default=None)


def written() -> None:
    """A store's client wrote a call's commands (an adapter that
    ``tells_writes`` calls this after each write): if the call is the one
    that calls are held behind (``HeldCalls.pass_next_call``), let them go."""
    store = _passing.get()
    if store is not None:
        store.release_calls()


def _gated(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def gated(self: HeldCalls, *args: Any, **kwargs: Any) -> Any:
        if self._held is not None:
            if self._pass_next or _passing.get() is self:
                # the call the held ones wait for (made before its caller
                # yields), or one it makes: it goes, and they go once it is
                # written, or has returned
                self._pass_next = False
                held, token = self._held, _passing.set(self)
                try:
                    return await method(self, *args, **kwargs)
                finally:
                    _passing.reset(token)
                    if self._held is held:
                        self.release_calls()
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
    #: whether the next call goes while calls are held (``pass_next_call``)
    _pass_next: bool = False
    #: whether the store's client tells when a call is written (``written``);
    #: if not, it writes a call before it first yields
    tells_writes: bool = False

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

    def pass_next_call(self) -> None:
        """Let the caller's next call on this store (made before it yields)
        go, and the held calls once it is written: where the store
        ``tells_writes``, when it says so (``written``) or the call returns;
        otherwise now (they go at its first yield, when it has written).
        Nothing if none are held."""
        if self._held is None:
            return
        if self.tells_writes:
            self._pass_next = True
        else:
            self.release_calls()

    def release_calls(self) -> None:
        """Let the held calls go now; nothing if none are held."""
        held, self._held = self._held, None
        self._pass_next = False
        if held is not None:
            held.set()

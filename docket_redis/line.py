"""One connection that a worker's batches share, in order (``Line``).

A worker may keep two batches of store effects out at once where the store
runs and answers them in the order they were sent
(``StorageAdapter.keeps_order``, ``RedisStore.execute_in_order``).  Two calls
on two pooled connections have no such order: the server may read the second
connection first.  A ``Line`` puts them on one connection: each call writes
its commands at once (before it first yields, once the line is open: the
runtime makes its calls in order, ``Worker._send``), then reads its replies
once the calls before it have read theirs.  Redis runs the commands of one connection in
the order they came, so the batches run, and are answered, in the order of
the calls.

The store closes an idle line (its connection goes back to the kept
ones); a line whose connection closed under it gives way to a new one.  A
call that fails (the connection dropped, a timeout, or it was
cancelled before it read all its replies) breaks the line: its connection is closed,
and every call behind it fails as well (``LineBroken``, a connection error):
what they wrote may or may not have run, and the worker machine sends them
again, in order, answered from the store's memory where they ran.  The next
call opens a new line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
from redis import exceptions as redis_errors

from docket_core.held_calls import written

__all__ = ["Line", "LineBroken"]


class LineBroken(redis_errors.ConnectionError):
    """A call before this one on its line failed: this one's commands may or
    may not have run."""


class Line:
    """Calls in order on one connection (see the module docstring)."""

    def __init__(self) -> None:
        #: the connection, once opened (``opened``); calls wait for it
        self.connection: Any = None
        self._opened = anyio.Event()
        #: why the line broke: its connection is closed, its calls fail
        self.broken: BaseException | None = None
        #: the calls on the line that have not returned
        self.callers = 0
        #: set once the last call so far has read its replies
        self._read: anyio.Event | None = None

    def opened(self, connection: Any) -> None:
        """The line's connection is ready."""
        self.connection = connection
        self._opened.set()

    def fail(self, error: BaseException) -> None:
        """The line could not be opened, or broke: its calls fail."""
        if self.broken is None:
            self.broken = error
        self._opened.set()

    async def call(self, pack: Callable[[Any], Sequence[bytes]], count: int) -> list[Any]:
        """Write the commands (``pack`` packs them for the connection), then
        read their ``count`` replies in turn; a reply that is an error comes
        back as its ``ResponseError``.  Raises ``LineBroken`` when a call before it broke
        the line, and the connection's own error when it breaks it."""
        read_before: anyio.Event | None = None
        read = anyio.Event()
        wrote = False
        self.callers += 1
        try:
            if not self._opened.is_set():
                await self._opened.wait()
            self._check()
            if not self.connection.is_connected:
                # (closed under it: writing would connect anew, and yield)
                self.fail(redis_errors.ConnectionError("the connection closed"))
                self._check()
            # its turn to read is taken as it writes, with no yield between:
            # the replies come in the order the calls wrote, whatever order
            # they came in (one that opened the line writes before those that
            # waited for it).  The write reaches the transport before the
            # call first yields, behind the calls written before it, even
            # one whose write still waits for the transport to drain
            read_before, self._read = self._read, read
            wrote = True
            packed = pack(self.connection)
            await self.connection.send_packed_command(packed, check_health=False)
            written()
            if read_before is not None and not read_before.is_set():
                await read_before.wait()
            self._check()
            replies: list[Any] = []
            for _ in range(count):
                try:
                    replies.append(await self.connection.read_response())
                except redis_errors.ResponseError as error:
                    replies.append(error)  # (the connection is sound: read on)
            return replies
        except BaseException as error:
            if wrote:
                # (its replies, or some, are still to come on the connection:
                # no call behind it may read them as its own)
                self.fail(error)
            raise
        finally:
            self.callers -= 1
            read.set()

    def _check(self) -> None:
        if self.broken is not None:
            raise LineBroken(f"an earlier batch on the connection failed: {self.broken}")

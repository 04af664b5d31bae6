"""``ScriptedStore``: the storage algebra over the shared Lua scripts.

Everything a Redis-protocol adapter does is written here once, on top of a
handful of client primitives (run script calls in one round trip, a blocking
stream read, a hash read, strike stream access, pub/sub).  ``docket_redis`` and
``docket_glide`` only implement those primitives for their client.
"""

from __future__ import annotations

import abc
import json
import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import cloudpickle

from ..adapter import Event, ReadResult
from ..sansio.effects import StoreEffect
from ..sansio.inputs import Outcome
from ..sansio.strikes import StrikeInstruction, StrikeList
from ..sansio.values import (
    ExecutionRecord,
    ProgressRecord,
    StoreSnapshot,
    WorkerRecord,
)
from .protocol import (
    PROMOTE_LIMIT,
    Layout,
    ScriptCall,
    calls_for,
    number,
    outcomes_for,
    parse_progress,
    parse_progress_reply,
    parse_read,
    parse_record,
    parse_snapshot,
    parse_stream_entries,
    progress_call,
    text,
    wake_ids,
)

#: how often a process looks for strikes made by other processes
STRIKE_REFRESH_SECONDS = 1.0
#: the longest a server may overrun a blocked read's timeout (1 / hz, hz=10)
SERVER_TICK = 0.1

#: server replies that mean "not now" rather than "never", as redis-py and
#: GLIDE word them (GLIDE says "BusyLoadingError: Redis is loading ..."); a
#: store out of memory refuses writes until memory frees, so it is one too
_TRANSIENT_REPLIES = (
    "loading",
    "busy",
    "tryagain",
    "masterdown",
    "clusterdown",
    "readonly",
    "oom ",
)


def transient(message: str) -> bool:
    """Whether a server error reply is worth retrying (a restart, a failover,
    a full memory)."""
    lowered = message.lower()
    return any(word in lowered for word in _TRANSIENT_REPLIES)


class ScriptedStore(abc.ABC):
    """A ``StorageAdapter`` for Redis-protocol servers, minus the client."""

    def __init__(self, *, name: str) -> None:
        self.name = name
        self.layout = Layout(name)
        self._strikes = StrikeList()
        self._strikes_seen = "0-0"
        self._strikes_checked = 0.0
        #: worker -> where its last scan for stale deliveries stopped
        self._autoclaim_cursor: dict[str, str] = {}

    # -- client primitives (the adapters implement these) -------------------------

    @abc.abstractmethod
    async def run_calls(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run the calls in order in one round trip; return their replies.
        Raise ``StoreError`` when the server is unreachable or fails."""

    @abc.abstractmethod
    async def read_blocking(
        self, worker: str, count: int, block_ms: int
    ) -> list[tuple[Any, list[Any]]]:
        """``XREADGROUP GROUP docket-workers worker COUNT count BLOCK block_ms
        STREAMS <stream> >``: the entries as ``(id, [f, v, ...])``, or ``[]``."""

    @abc.abstractmethod
    async def acknowledge(self, ids: Sequence[str]) -> None:
        """``XACK`` and ``XDEL`` these stream entries."""

    @abc.abstractmethod
    async def hash_fields(self, key: str) -> list[Any]:
        """``HGETALL key`` as a flat ``[f, v, ...]`` list."""

    @abc.abstractmethod
    async def strike_entries(self, after: str) -> list[tuple[str, bytes]]:
        """Entries of the strike stream after ``after``: ``(id, data)``."""

    @abc.abstractmethod
    async def append_strike(self, data: bytes) -> str:
        """Append to the strike stream; returns the entry id."""

    @abc.abstractmethod
    def listen(self, channel: str) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """Subscribe to ``channel``; yields message payloads until exited."""

    # -- the storage algebra ---------------------------------------------------------

    async def execute(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        if not effects:
            return []
        calls = calls_for(self.layout, effects)
        replies = await self.run_calls([call for call, _ in calls])
        return outcomes_for(effects, calls, replies)

    async def read(
        self,
        *,
        worker: str,
        count: int,
        now: float,
        redelivery_timeout: float,
        block: float,
        recover: bool = False,
    ) -> ReadResult:
        call = self.layout.call(
            "read",
            worker,
            str(count),
            number(now),
            str(int(redelivery_timeout * 1000)),
            PROMOTE_LIMIT,
            "1" if recover else "0",
            self._autoclaim_cursor.get(worker, "0-0"),
        )
        started = time.monotonic()
        (reply,) = await self.run_calls([call])
        result = parse_read(reply)
        if len(reply) > 2:
            self._autoclaim_cursor[worker] = text(reply[2])
        if result.deliveries or block <= 0:
            return result
        # A blocked read ends early when a message arrives, but its timeout is
        # only noticed on the server's clock tick (every 100 ms at the default
        # hz).  When the wait ends at a due time, block on the server only up
        # to a tick before it and wait out the rest here, so it is punctual.
        # never wait past the soonest due time (the caller's block may have
        # been computed before this read found a sooner one)
        due_in = math.inf if result.next_due is None else result.next_due - now
        wait = min(block, max(due_in, 0.0))
        server_block = wait if due_in > block else wait - SERVER_TICK
        entries: list[Any] = []
        if server_block >= 0.001:
            entries = await self.read_blocking(worker, count, int(server_block * 1000))
        if not entries:
            remaining = wait - (time.monotonic() - started)
            if due_in <= block and remaining > 0:
                await anyio.sleep(remaining)
            return ReadResult(deliveries=(), next_due=result.next_due)
        wakes = wake_ids(entries)
        if wakes:
            await self.acknowledge(wakes)
        return ReadResult(deliveries=tuple(parse_stream_entries(entries)), next_due=result.next_due)

    async def pending(self) -> int:
        (reply,) = await self.run_calls([self.layout.call("inspect", "pending", "0")])
        return int(reply)

    async def get_record(self, key: str) -> ExecutionRecord | None:
        return parse_record(key, await self.hash_fields(self.layout.run_key(key)))

    async def get_progress(self, key: str) -> ProgressRecord | None:
        return parse_progress(await self.hash_fields(self.layout.progress_key(key)))

    async def report_progress(
        self,
        key: str,
        *,
        now: float,
        generation: int | None = None,
        current: int | None = None,
        increment: int | None = None,
        total: int | None = None,
        message: str | None = None,
        clear_message: bool = False,
    ) -> ProgressRecord:
        call = progress_call(
            self.layout,
            key,
            now=now,
            generation=generation,
            current=current,
            increment=increment,
            total=total,
            message=message,
            clear_message=clear_message,
        )
        (reply,) = await self.run_calls([call])
        return parse_progress_reply(reply)

    @asynccontextmanager
    async def subscribe(self, key: str) -> AsyncIterator[AsyncIterator[Event]]:
        async with self.listen(self.layout.events_channel(key)) as messages:

            async def events() -> AsyncIterator[Event]:
                async for data in messages:
                    event: Event = json.loads(data)
                    yield event

            yield events()

    @asynccontextmanager
    async def cancellations(self) -> AsyncIterator[AsyncIterator[tuple[str, int]]]:
        async with self.listen(self.layout.cancel_channel) as messages:

            async def keys() -> AsyncIterator[tuple[str, int]]:
                async for data in messages:
                    signal = json.loads(data)
                    yield signal["key"], int(signal["generation"])

            yield keys()

    async def add_strike(self, instruction: StrikeInstruction) -> None:
        await self._refresh_strikes(force=True)
        self._strikes_seen = await self.append_strike(cloudpickle.dumps(instruction))
        self._strikes.apply(instruction)

    async def strikes(self) -> StrikeList:
        await self._refresh_strikes()
        return self._strikes

    async def _refresh_strikes(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._strikes_checked < STRIKE_REFRESH_SECONDS:
            return
        self._strikes_checked = now
        for entry_id, data in await self.strike_entries(self._strikes_seen):
            try:
                instruction = cloudpickle.loads(data)
            except Exception:
                instruction = None
            if isinstance(instruction, StrikeInstruction):
                self._strikes.apply(instruction)
            self._strikes_seen = entry_id

    async def snapshot(self, now: float) -> StoreSnapshot:
        (reply,) = await self.run_calls([self.layout.call("inspect", "snapshot", "1000")])
        return parse_snapshot(reply, now)

    async def workers(self, now: float, horizon: float) -> list[WorkerRecord]:
        snapshot = await self.snapshot(now)
        return [w for w in snapshot.workers if w.last_seen > now - horizon]

    async def clear(self, now: float, ttl: float) -> int:
        (reply,) = await self.run_calls([self.layout.call("clear", number(now), number(ttl))])
        return int(reply)

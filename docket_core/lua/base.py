"""``ScriptedStore``: the storage algebra over the shared Lua scripts.

Everything a Redis-protocol adapter does is written here once, on top of a
handful of client primitives (run script calls in one round trip, a blocking
stream read, a hash read, strike stream access, pub/sub).  ``docket_redis`` and
``docket_glide`` only implement those primitives for their client.
"""

from __future__ import annotations

import abc
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeGuard

import anyio
import attrs

from ..adapter import ClosingStep, Depths, ReadResult, StoreEvent
from ..held_calls import HeldCalls
from ..sansio.decisions import is_live
from ..sansio.effects import StoreEffect
from ..sansio.errors import StoreError, StoreUnavailable
from ..sansio.inputs import Outcome
from ..sansio.layout_change import CountRecorded
from ..sansio.strikes import StrikeInstruction, StrikeList
from ..sansio.values import (
    DeadLetter,
    ExecutionRecord,
    ProgressRecord,
    StoreSnapshot,
    WorkerRecord,
)
from ..serialization import MalformedStrike, Signing, dumps_strike, parse_strike
from .acl import acl_refusal
from .entries import (
    parse_cancellation,
    parse_count,
    parse_dead_letters,
    parse_depths,
    parse_event,
    parse_layout,
    parse_progress,
    parse_progress_reply,
    parse_read,
    parse_record,
    parse_snapshot,
    parse_stream_entries,
    text,
    wake_ids,
)
from .fanout import Fanout, Subscriber
from .protocol import (
    PROMOTE_LIMIT,
    Layout,
    ScriptCall,
    calls_for,
    number,
    outcomes_for,
    progress_call,
)

#: how many messages of each kind a snapshot lists (its counts are all of them)
SNAPSHOT_LIMIT = 1000
#: how many messages one call of the clear script cancels at most (a few ms)
CLEAR_CHUNK = "1000"
logger = logging.getLogger("docket.strikes")

#: how often a process looks for strikes made by other processes
STRIKE_REFRESH_SECONDS = 1.0
#: the longest a server may overrun a blocked read's timeout (1 / hz, hz=10)
SERVER_TICK = 0.1

#: server replies that mean "not now" rather than "never": their error codes
#: (a restart, a failover, a full memory, a script running long; GLIDE words
#: them "OOM: ...", "- ReadOnly: ...", "BusyLoadingError: Redis is loading"),
#: and the messages redis-py keeps once it has turned the code into a class
#: (``OutOfMemoryError``: "command not allowed when used memory > ...")
_TRANSIENT = re.compile(
    r"\b(loading|busy|tryagain|masterdown|clusterdown|readonly|oom|noreplicas|unblocked"
    r"|moved|ask)\b"
    r"|non local key|is loading the dataset|busy running a script"
    r"|command not allowed when used memory"
    r"|read only replica|link with master is down|not enough good replicas",
    re.IGNORECASE,
)


def transient(message: str) -> bool:
    """Whether a server error reply is worth retrying (a restart, a failover,
    a full memory): the store refuses now, and will take it later."""
    return _TRANSIENT.search(message) is not None


def reply_error(message: str, what: str, server: str) -> StoreError:
    """The error for the server's error reply to ``what`` (both clients word
    it alike): an ACL refusal naming the command, a "not now" reply as
    ``StoreUnavailable`` (worth retrying), any other as a refusal."""
    refusal = acl_refusal(message, what)
    if refusal is not None:
        return StoreError(refusal)
    if transient(message):
        return StoreUnavailable(f"{server} is not ready: {message}")
    return StoreError(f"{server} refused {what}: {message}")


def _created(reply: Any) -> bool:
    """Whether the read script's ``reply`` says it made the consumer group."""
    try:
        return len(reply) > 3 and int(reply[3]) == 1
    except (TypeError, ValueError):
        return False  # (a reply ``parse_read`` refuses)


class ScriptedStore(HeldCalls, abc.ABC):
    """A ``StorageAdapter`` for Redis-protocol servers, minus the client."""

    #: (``StorageAdapter.sends_at_once``: an adapter whose client may yield
    #: before it writes says False)
    sends_at_once = True
    #: (``StorageAdapter.keeps_order``: an adapter whose ``run_calls_in_order``
    #: keeps order says True)
    keeps_order = False

    def __init__(self, *, name: str, partitions: int = 1) -> None:
        self.name = name
        #: (``partitions``: the count of the layout this store is a partition
        #: of, which its adds name: ``Layout.partitions``)
        self.layout = Layout(name, partitions)
        self._strikes = StrikeList()
        self._strikes_seen = "0-0"
        self._strikes_checked = 0.0

    # -- client primitives (the adapters implement these) -------------------------

    @abc.abstractmethod
    async def run_calls(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run the calls in order in one round trip; return their replies.
        Raise ``StoreError`` when the server is unreachable or fails.  On a
        cluster, whose pipelines run their nodes side by side, one round trip
        per run of consecutive calls in one slot (``protocol.same_slot_groups``),
        each after the one before has answered."""

    async def run_calls_in_order(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """``run_calls`` behind the calls of ``run_calls_in_order`` made
        before it, on one connection, where the store ``keeps_order``."""
        return await self.run_calls(calls)

    @abc.abstractmethod
    async def run_calls_apart(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run the calls in one round trip where the client allows (on a
        cluster too: one pipeline to all their nodes at once); return their
        replies.  Calls of one hash tag run in order; calls of different tags
        have no order between them (``execute_apart`` sends these).  Errors
        as ``run_calls``."""

    def same_client(self, other: ScriptedStore) -> bool:
        """Whether ``other`` sends its calls through this store's client (a
        ``sibling``): ``execute_apart`` may then send them.  No by default."""
        return False

    @abc.abstractmethod
    async def read_blocking(
        self, worker: str, count: int, block_ms: int
    ) -> dict[str, list[tuple[Any, list[Any]]]] | None:
        """``XREADGROUP GROUP docket-workers worker COUNT count BLOCK block_ms
        STREAMS <stream> <wake stream> > >``: stream name -> its entries as
        ``(id, [f, v, ...])`` (``{}`` when the time ran out), or ``None`` when
        a stream has no consumer group (the next read script creates it)."""

    #: ``run_read`` sends the read script and a plain read of the new
    #: entries in one round trip (else the script reads them itself)
    reads_in_one_trip = False

    async def run_read(
        self, call: ScriptCall, worker: str, count: int
    ) -> tuple[Any, dict[str, list[tuple[Any, list[Any]]]] | None]:
        """The read script's ``call`` and, right behind it on the same
        connection in the same round trip, ``XREADGROUP GROUP docket-workers
        worker COUNT count STREAMS <stream> >``: the script's reply (its
        error raised as ``run_calls`` raises it), and the new entries by
        stream as ``read_blocking`` gives them (``None`` when the stream has
        no consumer group: the script makes it).  Where ``reads_in_one_trip``."""
        raise NotImplementedError(f"{type(self).__name__} reads in two steps")

    @abc.abstractmethod
    async def acknowledge(self, stream: str, ids: Sequence[str]) -> None:
        """``XACK`` and ``XDEL`` these entries of ``stream``, as one transaction."""

    @abc.abstractmethod
    async def hash_fields(self, key: str) -> list[Any]:
        """``HGETALL key`` as a flat ``[f, v, ...]`` list."""

    @abc.abstractmethod
    async def strike_entries(self, after: str) -> list[tuple[str, list[Any]]]:
        """Entries of the strike stream after ``after``: ``(id, [f, v, ...])``,
        fields as the server holds them (``parse_strike`` reads them)."""

    @abc.abstractmethod
    async def append_strike(self, data: bytes) -> str:
        """Append to the strike stream; returns the entry id."""

    @abc.abstractmethod
    async def subscriber(self) -> Subscriber:
        """A new client connection in subscriber mode (``fanout.Subscriber``);
        every listener of this store shares one."""

    #: the one pub/sub connection every listener of this store shares
    _fanout: Fanout | None = None
    #: the store whose connection this one's listeners share instead: a
    #: sibling's (``sibling``) is the store it came from, on the same client,
    #: so the partitions of a docket hold one subscriber, not one each
    _listens_with: ScriptedStore | None = None

    def listen(self, channel: str) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """Subscribe to ``channel``; yields message payloads until exited."""
        owner = self._listens_with or self
        if owner._fanout is None:
            owner._fanout = Fanout(owner.subscriber)
        return owner._fanout.listen(channel)

    def shares_listeners_with(self, owner: ScriptedStore) -> None:
        """Listen through ``owner``'s subscriber (a store on its client, which
        ``owner`` outlives: its ``close`` ends the listeners of both)."""
        self._listens_with = owner._listens_with or owner

    async def close_listeners(self) -> None:
        """Close the shared subscriber (adapters call it on ``close``); a
        store that listens through another's leaves it to that one."""
        if self._fanout is not None:
            await self._fanout.aclose()
            self._fanout = None

    # -- the storage algebra ---------------------------------------------------------

    async def execute(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        return await self._carry_out(effects, self.run_calls)

    async def execute_in_order(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        return await self._carry_out(effects, self.run_calls_in_order)

    async def _carry_out(
        self,
        effects: Sequence[StoreEffect],
        run: Callable[[Sequence[ScriptCall]], Awaitable[list[Any]]],
    ) -> list[Outcome]:
        if not effects:
            return []
        # (the calls may name several namespaces, a scoped limit's chain: an
        # adapter on a cluster sends them group after group, ``run_calls``)
        calls = calls_for(self.layout, effects)
        replies = await run([call for call, _ in calls])
        return outcomes_for(effects, calls, replies)

    def runs_apart_with(self, store: object) -> TypeGuard[ScriptedStore]:
        """Whether ``execute_apart`` may carry out ``store.execute``: a store
        on this store's client."""
        return isinstance(store, ScriptedStore) and self.same_client(store)

    async def execute_apart(
        self, batches: Sequence[tuple[ScriptedStore, Sequence[StoreEffect]]]
    ) -> list[list[Outcome]]:
        """``store.execute(effects)`` for each batch, with no order between
        the batches, on this store's client (each store ``runs_apart_with``
        it): the calls of every batch that runs in one namespace go in one
        ``run_calls_apart`` (one round trip where the client allows), and a
        batch whose calls span namespaces (a chain that needs its order
        across slots) goes alone through its ``run_calls``, side by side.
        The first error is raised as it is (resends are safe)."""
        plans = [calls_for(store.layout, effects) for store, effects in batches]
        replies: list[list[Any]] = [[] for _ in plans]
        together: list[int] = []
        alone: list[int] = []
        for index, plan in enumerate(plans):
            if plan:
                tag = plan[0][0].tag
                one_tag = all(call.tag == tag for call, _ in plan)
                (together if one_tag else alone).append(index)

        async def joint() -> None:
            calls = [call for index in together for call, _ in plans[index]]
            answered = await self.run_calls_apart(calls)
            start = 0
            for index in together:
                end = start + len(plans[index])
                replies[index] = answered[start:end]
                start = end

        async def single(index: int) -> None:
            store = batches[index][0]
            replies[index] = await store.run_calls([call for call, _ in plans[index]])

        if not alone:
            if together:
                await joint()
        else:
            errors: list[Exception] = []

            async def run(job: Callable[..., Awaitable[None]], *args: int) -> None:
                try:
                    await job(*args)
                except Exception as error:
                    errors.append(error)

            async with anyio.create_task_group() as group:
                for index in alone:
                    group.start_soon(run, single, index)
                if together:  # (here: its calls go out before the first yield)
                    await run(joint)
            if errors:
                raise errors[0]
        return [
            outcomes_for(effects, plan, reply)
            for (_, effects), plan, reply in zip(batches, plans, replies, strict=True)
        ]

    async def read(
        self,
        *,
        worker: str,
        count: int,
        now: float,
        redelivery_timeout: float,
        block: float,
        recover: bool = False,
        stale_scan_every: float = 0.0,
    ) -> ReadResult:
        # the new entries are read apart from the script, in its round trip
        # (but for a recovery, which reads what this worker holds first)
        # (``COUNT 0`` would read the whole queue: a read of nothing reads in the script)
        apart = self.reads_in_one_trip and not recover and count > 0

        def read_call(apart: bool) -> ScriptCall:
            return self.layout.call(
                "read",
                worker,
                str(count),
                number(now),
                str(int(redelivery_timeout * 1000)),
                PROMOTE_LIMIT,
                "1" if recover else "0",
                str(int(stale_scan_every * 1000)),
                "1" if self._repair_wake_group else "0",
                "1" if apart else "0",
            )

        started = time.monotonic()
        beside: dict[str, list[tuple[Any, list[Any]]]] | None = None
        created = False
        if apart:
            reply, beside = await self.run_read(read_call(True), worker, count)
            if beside is None:  # (no consumer group: the whole script makes it)
                apart = False
                # (or this one made it already, by its scan, once the read
                # behind it had failed: a restart lost the scripts and the stream)
                created = _created(reply)
        if not apart:
            (reply,) = await self.run_calls([read_call(False)])
        result = parse_read(reply)
        if beside is not None:
            result = await self._with_fresh(result, beside.get(self.layout.stream, []))
        if recover:  # (what this worker held already: leases as old as that read)
            result = attrs.evolve(result, fresh=False)
        if (created or _created(reply)) and self._read_before:
            # not the first read of a new docket: what this process read from
            # before had vanished (a FLUSHALL, a restart without persistence)
            logging.getLogger("docket.worker").warning(
                "docket %s: its queue stream or consumer group had vanished (a FLUSHALL, a "
                "server restarted without persistence?); recreated them (worker %s)",
                self.name,
                worker,
            )
        self._read_before = True
        self._repair_wake_group = False
        if result.deliveries or result.malformed or block <= 0:
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
        streams: dict[str, list[tuple[Any, list[Any]]]] | None = {}
        if server_block >= 0.001:
            streams = await self.read_blocking(worker, count, int(server_block * 1000))
        if streams is None:
            # the wake stream lost its group (or the queue its own): the next
            # read script makes them again, so return now instead of blocking
            self._repair_wake_group = True
            return ReadResult(deliveries=(), next_due=result.next_due)
        entries = streams.get(self.layout.stream, [])
        woken = [text(entry_id) for entry_id, _ in streams.get(self.layout.wake_stream, [])]
        if woken:
            await self.acknowledge(self.layout.wake_stream, woken)
        if not entries:
            remaining = wait - (time.monotonic() - started)
            if not woken and due_in <= block and remaining > 0:
                await anyio.sleep(remaining)
            return ReadResult(deliveries=(), next_due=result.next_due)
        fresh = await self._new_entries(entries)
        return attrs.evolve(fresh, next_due=result.next_due)

    async def _new_entries(self, entries: list[tuple[Any, list[Any]]]) -> ReadResult:
        """The entries of a plain read of the queue, parsed, and the wake-ups
        an older docket put in the queue among them acknowledged."""
        stale_wakes = wake_ids(entries)
        if stale_wakes:
            await self.acknowledge(self.layout.stream, stale_wakes)
        return parse_stream_entries(entries)

    async def _with_fresh(
        self, result: ReadResult, entries: list[tuple[Any, list[Any]]]
    ) -> ReadResult:
        """The script's ``result`` and the new ``entries`` read beside it."""
        if not entries:
            return result
        fresh = await self._new_entries(entries)
        return ReadResult(
            deliveries=result.deliveries + fresh.deliveries,
            next_due=result.next_due,
            malformed=result.malformed + fresh.malformed,
        )

    #: a read of this store succeeded in this process (so the consumer group
    #: existed once: a read that must create it again reports it)
    _read_before = False
    #: a blocked read met a stream without its consumer group: the next read
    #: script makes the wake stream's group again
    _repair_wake_group = False

    async def _look(self, script: str, *args: str) -> Any:
        """The reply of one call of ``script`` that only reads (no replica
        waits for it)."""
        (reply,) = await self.run_calls([self.layout.call(script, *args, durable=False)])
        return reply

    async def pending(self) -> int:
        reply = await self._look("inspect", "pending", "0")
        return parse_count(reply, "a pending count")

    async def record_partitions(
        self, expected: int, new: int, epoch: int | None = None
    ) -> CountRecorded:
        if expected < 1 or new < 1 or (epoch is not None and epoch < 0):
            raise ValueError(f"partition counts are at least 1, not {expected} and {new}")
        # (the check a Docket makes on entering, the same count expected and
        # recorded, writes nothing)
        at = () if epoch is None else (str(epoch),)
        call = self.layout.call(
            "layout", "record", str(expected), str(new), *at, durable=expected != new
        )
        (reply,) = await self.run_calls([call])
        return parse_layout(reply)

    async def forget_leaving(self, old: int, epoch: int | None = None) -> None:
        if old < 1 or (epoch is not None and epoch < 0):
            raise ValueError(f"partition counts are at least 1, not {old}")
        # (a forget that a failover loses only makes the next opener seal
        # again: not durable)
        at = () if epoch is None else (str(epoch),)
        await self.run_calls([self.layout.call("layout", "forget", str(old), *at, durable=False)])

    async def close_partition(
        self, op: ClosingStep, count: int, epoch: int, lease: float, now: float, owner: str = ""
    ) -> bool:
        # (the lease runs on the server's clock: ``now`` is the memory store's)
        # the ``unseal`` a Docket makes on entering is not durable: it gives
        # a seal to its count only where a change away was undone since, and
        # a seal a failover brings back only refuses adds, with its error,
        # until the next opener gives it again (no task is lost)
        call = self.layout.call(
            "close",
            op,
            str(count),
            str(epoch),
            str(max(1, round(lease * 1000))),
            owner,
            durable=op != "unseal",
        )
        (reply,) = await self.run_calls([call])
        return parse_count(reply, "a closing step") == 1

    async def depths(self, now: float) -> Depths:
        reply = await self._look("inspect", "depths", number(now))
        return parse_depths(reply)

    async def get_record(self, key: str) -> ExecutionRecord | None:
        return parse_record(key, await self.hash_fields(self.layout.run_key(key)))

    async def get_progress(self, key: str) -> ProgressRecord | None:
        return parse_progress(await self._look("inspect", "progress", key))

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
    async def subscribe(self, key: str) -> AsyncIterator[AsyncIterator[StoreEvent]]:
        async with self.listen(self.layout.events_channel(key)) as messages:

            async def events() -> AsyncIterator[StoreEvent]:
                async for data in messages:
                    event = parse_event(data)
                    if event is not None:
                        yield event

            yield events()

    @asynccontextmanager
    async def cancellations(self) -> AsyncIterator[AsyncIterator[tuple[str, int]]]:
        async with self.listen(self.layout.cancel_channel) as messages:

            async def keys() -> AsyncIterator[tuple[str, int]]:
                async for data in messages:
                    signal = parse_cancellation(data)
                    if signal is not None:
                        yield signal

            yield keys()

    #: the docket's signing keys (``Docket`` sets them): strikes are signed
    #: with them, and entries they do not verify are skipped
    signing: Signing | None = None
    #: strike entries skipped as malformed or badly signed
    malformed_strikes: int = 0

    async def add_strike(self, instruction: StrikeInstruction) -> None:
        await self._refresh_strikes(force=True)
        data = dumps_strike(instruction, self.signing)
        self._strikes_seen = await self.append_strike(data)
        self._strikes.apply(instruction)

    async def strikes(self) -> StrikeList:
        await self._refresh_strikes()
        return self._strikes

    async def _refresh_strikes(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._strikes_checked < STRIKE_REFRESH_SECONDS:
            return
        self._strikes_checked = now
        for entry_id, fields in await self.strike_entries(self._strikes_seen):
            parsed = parse_strike(fields, self.signing)
            if isinstance(parsed, MalformedStrike):
                self.malformed_strikes += 1
                logger.warning(
                    "docket %s skips strike entry %s: %s", self.name, entry_id, parsed.reason
                )
            else:
                self._strikes.apply(parsed)
            self._strikes_seen = entry_id

    async def snapshot(self, now: float, limit: int = SNAPSHOT_LIMIT) -> StoreSnapshot:
        reply = await self._look("inspect", "snapshot", str(limit))
        return parse_snapshot(reply, now)

    async def workers(self, now: float, horizon: float) -> list[WorkerRecord]:
        snapshot = await self.snapshot(now, limit=1)  # the workers are all there
        return [w for w in snapshot.workers if is_live(w.last_seen, now, horizon)]

    async def clear(self, now: float, ttl: float) -> int:
        cleared, cursor = 0, "-"
        while True:
            call = self.layout.call("clear", number(now), number(ttl), CLEAR_CHUNK, cursor)
            ((count, done, cursor),) = await self.run_calls([call])
            cleared += int(count)
            if int(done) == 1:
                return cleared
            cursor = text(cursor)

    async def dead_letters(self, limit: int = SNAPSHOT_LIMIT) -> tuple[int, list[DeadLetter]]:
        reply = await self._look("dead", "list", str(limit), self._count)
        return parse_dead_letters(reply)

    @property
    def _count(self) -> str:
        """The partition count this store's adds name (``refuse_closed``)."""
        return str(self.layout.partitions)

    async def replay_dead_letters(self, entry_ids: Sequence[str] | None) -> int:
        if entry_ids is not None:
            if not entry_ids:
                return 0
            call = self.layout.call("dead", "replay", "0", self._count, *entry_ids)
            (reply,) = await self.run_calls([call])
            return int(reply)
        replayed = 0
        while True:  # all of them, a chunk a call
            call = self.layout.call("dead", "replay", CLEAR_CHUNK, self._count, "*")
            (reply,) = await self.run_calls([call])
            replayed += int(reply)
            if int(reply) < int(CLEAR_CHUNK):
                return replayed

    async def drop_dead_letters(self, entry_ids: Sequence[str] | None) -> int:
        ids = ["*"] if entry_ids is None else list(entry_ids)
        if not ids:
            return 0
        (reply,) = await self.run_calls([self.layout.call("dead", "drop", "0", self._count, *ids)])
        return int(reply)

"""The redis-py (asyncio) client primitives under ``ScriptedStore``.

One store speaks to one server (``redis.asyncio.Redis``), a cluster
(``RedisCluster``) or a sentinel-managed primary (``Sentinel.master_for``);
``urls`` builds the client from the docket URL.  What differs:

- Cluster: every call declares ``{P}:q`` and ``{P}:fence`` (``Layout.call``),
  so redis-py routes it and the server refuses it (TRYAGAIN) while its slot
  moves.  A batch goes out as consecutive same-slot pipelines, one after the
  other; calls with no order between their slots (``run_calls_apart``) go
  in one pipeline.  ``XACK``+``XDEL`` go in a plain pipeline: redis-py
  8.1's cluster ``MULTI`` queues each command through a thread running its
  own event loop, which re-initializes the client there after a connection
  error.
- Sentinel: every round trip that may write ends with ``WAIT``; fewer
  replicas than asked is a lost reply, and any lost reply drops the pool's
  connections so the next one asks the sentinels for the primary.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import anyio
import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from docket_core.held_calls import written
from docket_core.lua import SCRIPTS
from docket_core.lua.base import ScriptedStore, reply_error
from docket_core.lua.entries import stream_entries, stream_reply, text
from docket_core.lua.protocol import GROUP, ScriptCall
from docket_core.sansio.errors import StoreError, StoreUnavailable

from .line import Line
from .subscriber import FAILURES, Subscriber
from .urls import MAX_CONNECTIONS, POOL_TIMEOUT, WAIT_TIMEOUT_MS, client_for_url


def _hiredis_packer() -> Callable[[tuple[Any, ...]], bytes] | None:
    try:
        from hiredis import pack_command
    except ImportError:  # (redis-py's own packer then)
        return None
    return pack_command


_pack_command = _hiredis_packer()

__all__ = ["MAX_CONNECTIONS", "POOL_TIMEOUT", "RedisStore"]

_SHAS = {name: hashlib.sha1(source.encode()).hexdigest() for name, source in SCRIPTS.items()}

_FAILURES = FAILURES
#: a cluster in motion (a failover, a slot moving, a node unreachable):
#: ``ClusterDownError`` and ``MasterDownError`` are ``ClusterError``s,
#: ``MovedError`` an ``AskError``; redis-py retried them before raising
_CLUSTER_IN_MOTION = (
    redis_errors.ClusterError,
    redis_errors.SlotNotCoveredError,
    redis_errors.TryAgainError,
    redis_errors.AskError,
)

#: how long a cluster call is sent again while its slot moves (GLIDE waits
#: out TRYAGAIN by itself, up to its request timeout), before the store
#: reports it unavailable (and the worker backs off)
MOVE_PATIENCE = 2.0
#: the idle connections a client's script calls keep out of its pool
CALLERS_KEPT = 4


#: the errors ``_store_error`` translates
_TRANSLATED = (
    *_FAILURES,
    *_CLUSTER_IN_MOTION,
    redis_errors.ResponseError,
    redis_errors.RedisClusterException,
)


def _store_error(error: Exception, what: str) -> StoreError:
    """A lost connection, a "not now" reply (loading, failover) or a cluster
    in motion is ``StoreUnavailable``; any other error is ``StoreError``."""
    if isinstance(error, _FAILURES):
        return StoreUnavailable(f"Redis unavailable: {error}")
    if isinstance(error, _CLUSTER_IN_MOTION):
        return StoreUnavailable(f"the Redis cluster is changing: {error}")
    if isinstance(error, redis_errors.ResponseError):
        return reply_error(str(error), what, "Redis")
    # a client-side refusal (a command across slots, no node for a command)
    return StoreError(f"redis-py refused {what}: {error}")


@contextmanager
def _store_errors(what: str = "a command") -> Iterator[None]:
    """``_store_error`` for the errors of the block."""
    try:
        yield
    except _TRANSLATED as error:
        raise _store_error(error, what) from error


def _packed(connection: Any, commands: Sequence[tuple[Any, ...]]) -> Any:
    """``connection.pack_commands(commands)``: the same bytes, made by
    hiredis in one call a command (redis-py calls its encoder once an
    argument, several microseconds a script call) when the connection
    encodes text as redis-py does by default (UTF-8, strict).  A command
    whose name holds a space (redis-py splits it) or an argument hiredis
    does not take goes through redis-py's packer."""
    encoder = connection.encoder
    utf8 = (encoder.encoding, encoder.encoding_errors) == ("utf-8", "strict")
    if _pack_command is not None and utf8:
        try:
            if not any(" " in command[0] for command in commands):
                return [_pack_command(command) for command in commands]
        except TypeError:  # (a bytes name, or an argument hiredis does not take)
            pass
    return connection.pack_commands(commands)


def _script_commands(calls: Sequence[ScriptCall]) -> list[tuple[Any, ...]]:
    """The ``EVALSHA`` command of each call."""
    return [("EVALSHA", _SHAS[call.name], len(call.keys), *call.keys, *call.args) for call in calls]


def _raise_first(replies: Sequence[Any]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


async def _send_group(cluster: RedisCluster, group: Sequence[ScriptCall]) -> list[Any]:
    """The calls in one cluster pipeline: one round trip to each of their
    nodes, the nodes side by side (in order within a node)."""
    if len(group) == 1:
        call = group[0]
        reply: Any = await cluster.evalsha(_SHAS[call.name], len(call.keys), *call.keys, *call.args)
        return [reply]
    pipe = cluster.pipeline()
    for call in group:
        # (``pipe.evalsha`` is blocked on a cluster pipeline; the command is not)
        pipe.execute_command("EVALSHA", _SHAS[call.name], len(call.keys), *call.keys, *call.args)
    replies: list[Any] = await pipe.execute(raise_on_error=False)
    _raise_first(replies)
    return replies


_Result = TypeVar("_Result")


async def _patiently(send: Callable[..., Awaitable[_Result]], *args: Any) -> _Result:
    """``send(*args)``, sent again while the cluster is in motion (a slot moving:
    TRYAGAIN; a failover), for up to ``MOVE_PATIENCE`` seconds.  redis-py
    gives up on TRYAGAIN after a few hundred ms; a refused command did not
    run, and any store call may be resent anyway (memos)."""
    deadline = time.monotonic() + MOVE_PATIENCE
    delay = 0.02
    while True:
        try:
            return await send(*args)
        except _CLUSTER_IN_MOTION:
            if time.monotonic() + delay > deadline:
                raise
            await anyio.sleep(delay)
            delay = min(2 * delay, 0.25)


class RedisStore(ScriptedStore):
    """A docket on Redis or Valkey through redis-py.

    ``RedisStore.from_url(url, name=...)`` with any URL form of ``urls``
    (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
    ``rediss+cluster://``, ``redis+sentinel://``), or
    ``RedisStore(client, name=...)`` with a ``redis.asyncio.Redis`` or
    ``RedisCluster`` the application already has (its pool is used as it is;
    blocking reads need ``socket_timeout=None`` or a timeout above the
    worker's check interval).  ``wait_replicas`` (sentinel URLs: 1) makes each
    round trip that may write end with ``WAIT wait_replicas wait_timeout_ms``.
    """

    #: (``HeldCalls.tells_writes``) a call that finds no connection at hand
    #: takes one from the pool, connecting it, before it writes: the calls a
    #: worker holds behind its claim go once the claim is written (``written``)
    tells_writes = True

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        *,
        name: str,
        owned: bool = False,
        wait_replicas: int = 0,
        wait_timeout_ms: int = WAIT_TIMEOUT_MS,
        max_commands: int | None = None,
        partitions: int = 1,
    ) -> None:
        super().__init__(name=name, partitions=partitions)
        self.client = client
        self._owned = owned
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self._max_commands = max_commands
        self._commands: anyio.Semaphore | None = None
        self._callers = []
        self._cluster = client if isinstance(client, RedisCluster) else None
        #: a cluster pipeline writes from tasks of its own, a loop turn later
        self.sends_at_once = self._cluster is None
        self._sentinel = isinstance(
            getattr(client, "connection_pool", None), SentinelConnectionPool
        )
        #: one server, whose scripts need no replica's acknowledgement: a
        #: worker's batches may share one connection (``execute_in_order``)
        self.keeps_order = self._cluster is None and not self._sentinel and not wait_replicas
        #: one server, no ``WAIT``: a read's new entries come with its script
        self.reads_in_one_trip = self._cluster is None and not wait_replicas
        self._line: Line | None = None

    @classmethod
    def from_url(cls, url: str, *, name: str) -> RedisStore:
        """The client of the URL's form (``urls``): for one server a bounded
        pool, where past ``MAX_CONNECTIONS`` commands wait (up to
        ``POOL_TIMEOUT``) for a connection instead of failing; the URL's
        ``?max_connections=...&timeout=...`` override both.  ``rediss://``
        takes redis-py's ``ssl_*`` options and GLIDE's ``tls_*`` spellings."""
        built = client_for_url(url)
        return cls(
            built.client,
            name=name,
            owned=True,
            wait_replicas=built.wait_replicas,
            wait_timeout_ms=built.wait_timeout_ms,
            max_commands=built.max_commands,
        )

    async def open(self) -> None:
        if self._max_commands is not None:
            self._commands = anyio.Semaphore(self._max_commands)
        try:
            with _store_errors("PING (connecting)"):
                if self._cluster is not None:
                    try:
                        await self._cluster.initialize()
                    except redis_errors.RedisClusterException as error:
                        # (no seed reachable, or the slots not all covered)
                        raise redis_errors.ConnectionError(str(error)) from error
                await self.client.ping()
        except StoreUnavailable as error:
            raise StoreUnavailable(f"cannot reach Redis: {error.__cause__}") from error.__cause__

    def sibling(self, name: str, partitions: int = 1) -> RedisStore:
        """Docket ``name`` on this store's client (not owned: closing it
        leaves the client open), sharing its command turns and its subscriber."""
        sibling = RedisStore(
            self.client,
            name=name,
            partitions=partitions,
            wait_replicas=self.wait_replicas,
            wait_timeout_ms=self.wait_timeout_ms,
        )
        sibling._commands = self._commands
        sibling._callers = self._callers
        sibling.signing = self.signing
        sibling.shares_listeners_with(self)
        return sibling

    async def close(self) -> None:
        await self.close_listeners()
        while self._readers:  # (held by no read now: back to the pool)
            await self._pool().release(self._readers.pop())
        while self._callers:  # (the siblings' too: idle, they go back to the pool)
            await self._pool().release(self._callers.pop())
        line, self._line = self._line, None
        if line is not None and line.connection is not None:
            await self._put_back(line.connection, closed=bool(line.callers))
        if self._owned:
            await self.client.aclose()
            if self._sentinel:  # and its connections to the sentinels
                await self.client.connection_pool.sentinel_manager.aclose()  # type: ignore[union-attr]

    @asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """Hold one of the store's command turns (clusters and sentinels,
        whose pools fail when full, instead of waiting)."""
        if self._commands is None:
            yield
            return
        async with self._commands:
            yield

    # -- primitives ---------------------------------------------------------------

    async def run_calls(self, calls: Sequence[ScriptCall]) -> list[Any]:
        # the hot path (every add, every flush of a worker's effects): no
        # context manager's frames when there are no turns to take
        if self._commands is None:
            return await self._run_calls(calls)
        return await self._in_turn(calls, False)

    async def run_calls_in_order(self, calls: Sequence[ScriptCall]) -> list[Any]:
        if not self.keeps_order:
            return await self.run_calls(calls)
        if self._commands is None:
            return await self._run_calls(calls, in_order=True)
        return await self._in_turn(calls, False, in_order=True)

    async def run_calls_apart(self, calls: Sequence[ScriptCall]) -> list[Any]:
        # (one server: the ordered pipeline of ``run_calls``)
        if self._commands is None:
            return await self._run_calls(calls, apart=True)
        return await self._in_turn(calls, True)

    async def _in_turn(
        self, calls: Sequence[ScriptCall], apart: bool, in_order: bool = False
    ) -> list[Any]:
        """``_run_calls`` in one of the command turns: a free turn taken
        without yielding (``Semaphore.acquire`` gives the loop a turn even
        then), so the calls go out before anything started beside them runs."""
        commands = self._commands
        assert commands is not None
        try:
            commands.acquire_nowait()
        except anyio.WouldBlock:
            await commands.acquire()
        try:
            return await self._run_calls(calls, apart=apart, in_order=in_order)
        finally:
            commands.release()

    def same_client(self, other: ScriptedStore) -> bool:
        return isinstance(other, RedisStore) and other.client is self.client

    async def run_read(
        self, call: ScriptCall, worker: str, count: int
    ) -> tuple[Any, dict[str, list[tuple[Any, list[Any]]]] | None]:
        stream = self.layout.stream
        command = ("XREADGROUP", "GROUP", GROUP, worker, "COUNT", count, "STREAMS", stream, ">")
        fresh: list[Any] = []

        async def send(calls: Sequence[ScriptCall]) -> list[Any]:
            if fresh:
                # (the script again, after a NOSCRIPT: its read ran the first
                # time, and the entries it handed out are in ``fresh``)
                return await self._evalsha(calls)
            replies = await self._send_on_own_connection([*_script_commands(calls), command])
            fresh.append(replies.pop())
            _raise_first(replies)
            return replies

        if self._commands is None:
            (reply,) = await self._run_calls([call], send=send)
        else:
            async with self._commands:
                (reply,) = await self._run_calls([call], send=send)
        entries = fresh[0]
        if isinstance(entries, redis_errors.ResponseError):
            if "NOGROUP" in str(entries):
                return reply, None
            raise _store_error(entries, "XREADGROUP") from entries
        return reply, stream_reply(entries)

    async def _run_calls(
        self,
        calls: Sequence[ScriptCall],
        apart: bool = False,
        in_order: bool = False,
        send: Callable[[Sequence[ScriptCall]], Awaitable[list[Any]]] | None = None,
    ) -> list[Any]:
        if send is None:
            send = self._evalsha_in_order if in_order else self._evalsha
            if apart:
                send = self._evalsha_apart
        try:
            try:
                return await send(calls)
            except redis_errors.ResponseError as error:
                # (NoScriptError, or a NOSCRIPT reply inside a pipeline)
                noscript = isinstance(error, redis_errors.NoScriptError)
                if not noscript and "noscript" not in str(error).lower():
                    raise
                # the server lost its scripts (a restart, a new primary, a
                # slot moved to a node that never ran them): load them (on
                # every primary of a cluster), try again; calls of the
                # batch that ran answer a resend with their outcome
                await self._load_scripts()
                return await send(calls)
        except StoreUnavailable:  # (too few replicas acknowledged a write)
            if self._sentinel or self.wait_replicas:
                await self._forget_primary()
            raise
        except _TRANSLATED as error:
            failure = _store_error(error, "a docket script")
            if isinstance(failure, StoreUnavailable) and (self._sentinel or self.wait_replicas):
                await self._forget_primary()
            raise failure from error

    async def _evalsha_apart(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """``_evalsha`` for calls with no order between their slots: on a
        cluster, one pipeline to all their nodes at once."""
        if self._cluster is None:
            return await self._evalsha(calls)
        return await _patiently(_send_group, self._cluster, calls)

    async def _evalsha(self, calls: Sequence[ScriptCall]) -> list[Any]:
        if self._cluster is not None:
            return await self._evalsha_by_slot(self._cluster, calls)
        wait = self.wait_replicas > 0 and any(call.durable for call in calls)
        commands = _script_commands(calls)
        if wait:
            commands.append(("WAIT", self.wait_replicas, self.wait_timeout_ms))
        replies = await self._send_on_own_connection(commands)
        if not wait:
            _raise_first(replies)
            return replies
        acknowledged = replies.pop()
        _raise_first(replies)
        if isinstance(acknowledged, Exception) or int(acknowledged) < self.wait_replicas:
            # (a replica answers WAIT with an error) the write may be lost
            # with a primary that was failed over: the core resends it
            reached = acknowledged if isinstance(acknowledged, int) else 0
            raise StoreUnavailable(f"the write reached only {reached} replicas")
        return replies

    async def _evalsha_in_order(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """``_evalsha`` on the line (one server, no ``WAIT``)."""
        commands = _script_commands(calls)
        replies = await self._send_on_line(commands)
        _raise_first(replies)
        return replies

    async def _send_on_line(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``commands`` in one round trip on the line (``line.Line``): behind
        the calls on it before, on one connection, which goes back to the
        kept ones once the line is idle.  A call alone on a line that broke under it goes again
        as ``_send_on_own_connection`` would (the connection's retry), since
        nothing behind it depends on it."""
        line = self._line
        if line is None or line.broken is not None:
            line = self._line = Line()
            try:
                line.opened(await self._kept_connection())
            except BaseException as error:
                line.fail(error)
                if self._line is line:
                    self._line = None
                raise
        alone = line.callers == 0
        try:
            return await line.call(lambda connection: _packed(connection, commands), len(commands))
        except (redis_errors.ConnectionError, redis_errors.TimeoutError):
            if not alone or line.callers:
                raise
            return await self._send_on_own_connection(commands)
        finally:
            if not line.callers:
                # (idle: its connection goes back to the kept ones, as a
                # call's own would; a line kept open held a connection out of
                # the pool for the store's life)
                if self._line is line:
                    self._line = None
                connection, line.connection = line.connection, None
                if connection is not None:
                    await self._put_back(connection, closed=line.broken is not None)

    async def _kept_connection(self) -> Any:
        """A connection for script calls: a kept one (checked as the pool
        checks what it hands out), or one of the pool's."""
        callers, pool = self._callers, self._pool()
        if not callers:
            return await pool.get_connection()
        connection = callers.pop()
        try:
            await pool.ensure_connection(connection)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await connection.disconnect(nowait=True)
                await pool.release(connection)
            raise
        return connection

    async def _put_back(self, connection: Any, *, closed: bool) -> None:
        """Keep a connection for the next script calls, or give it back to
        the pool (closed first, when a reply may still come on it)."""
        pool = self._pool()
        with anyio.CancelScope(shield=True):
            if closed:
                await connection.disconnect(nowait=True)
                await pool.release(connection)
            elif len(self._callers) < CALLERS_KEPT:
                self._callers.append(connection)
            else:
                await pool.release(connection)

    async def _evalsha_by_slot(
        self, cluster: RedisCluster, calls: Sequence[ScriptCall]
    ) -> list[Any]:
        """The calls in consecutive same-slot groups, a round trip each, in
        order (a cluster pipeline sends to its nodes in parallel)."""
        replies: list[Any] = []
        start = 0
        while start < len(calls):
            slot = cluster.keyslot(calls[start].keys[0])
            end = start + 1
            while end < len(calls) and cluster.keyslot(calls[end].keys[0]) == slot:
                end += 1
            group = calls[start:end]
            replies += await _patiently(_send_group, cluster, group)
            start = end
        return replies

    async def _forget_primary(self) -> None:
        """Drop every connection of the sentinel pool (blocked reads too): the
        next one asks the sentinels which server is the primary now."""
        try:
            await self.client.connection_pool.disconnect()  # type: ignore[union-attr]
        except Exception:
            pass

    async def _load_scripts(self) -> None:
        for source in SCRIPTS.values():
            await self.client.script_load(source)

    async def _send_on_own_connection(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``commands`` in one round trip (one server, or a sentinel's
        primary), their replies as the server gave them (an error reply as
        its ``ResponseError``), on a connection kept out of the pool between
        calls (``_callers``): redis-py's client spends about 30 µs of CPU a
        call taking a connection from its pool and giving it back, and
        recording both.  A kept connection is checked before use as the pool
        checks one it hands out, and the connection's own retry applies as in
        ``execute_command``: one that fails is closed, and the commands go
        again on a new one (at most ``retry``'s count: none, unless the
        application's client asks for it)."""
        callers, pool = self._callers, self._pool()
        kept = bool(callers)
        connection = callers.pop() if kept else await pool.get_connection()

        async def send() -> list[Any]:
            await connection.send_packed_command(_packed(connection, commands), check_health=False)
            written()
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(await connection.read_response())
                except redis_errors.ResponseError as error:
                    replies.append(error)  # (the connection is sound: read on)
            return replies

        async def failed(error: Exception, failures: int) -> None:
            await connection.disconnect()

        try:
            if kept:  # (checked as the pool checks what it hands out: one the
                # server closed meanwhile, or with unread data, connects anew)
                await pool.ensure_connection(connection)
            replies: list[Any] = await connection.retry.call_with_retry(
                send, failed, with_failure_count=True
            )
        except BaseException:
            # cancelled mid-read, or the connection failed: a reply may still
            # come on it, so it goes back to the pool closed
            with anyio.CancelScope(shield=True):
                await connection.disconnect(nowait=True)
                await pool.release(connection)
            raise
        if len(callers) < CALLERS_KEPT:
            callers.append(connection)
        else:
            await pool.release(connection)
        return replies

    #: the idle connections of script calls, shared by the sibling stores of
    #: one client (``_send_on_own_connection``); at most ``CALLERS_KEPT``,
    #: so that blocking reads and pub/sub still find the pool's others
    _callers: list[Any]

    #: the idle connections of blocking reads (one server, or a sentinel's
    #: primary): a read takes one of its own, as GLIDE's readers do, and
    #: gets the server's reply as it is (no pool turn, no reply conversion)
    _readers: list[Any] | None = None

    def _pool(self) -> Any:
        assert self._cluster is None
        return self.client.connection_pool  # type: ignore[union-attr]

    async def read_blocking(
        self, worker: str, count: int, block_ms: int
    ) -> dict[str, list[tuple[Any, list[Any]]]] | None:
        if self._cluster is None:
            return await self._read_on_own_connection(worker, count, block_ms)
        layout = self.layout

        async def xreadgroup() -> Any:
            # (one slot on a cluster: both streams share the docket's tag)
            return await self.client.xreadgroup(
                GROUP,
                worker,
                {layout.stream: ">", layout.wake_stream: ">"},
                count=count,
                block=block_ms,
            )

        with _store_errors("XREADGROUP"):
            try:
                reply = await (_patiently(xreadgroup) if self._cluster else xreadgroup())
            except redis_errors.ResponseError as error:
                if "NOGROUP" in str(error):
                    return None  # the next read script creates the group
                raise
        return stream_reply(reply)

    async def _read_on_own_connection(
        self, worker: str, count: int, block_ms: int
    ) -> dict[str, list[tuple[Any, list[Any]]]] | None:
        layout = self.layout
        readers = self._readers
        if readers is None:
            readers = self._readers = []
        if readers:
            reader = readers.pop()
        else:
            with _store_errors("XREADGROUP"):
                reader = await self._pool().get_connection()
        try:
            with _store_errors("XREADGROUP"):
                try:
                    await reader.send_command(
                        "XREADGROUP", "GROUP", GROUP, worker, "COUNT", count, "BLOCK", block_ms,
                        "STREAMS", layout.stream, layout.wake_stream, ">", ">",
                    )  # fmt: skip
                    reply = await reader.read_response()
                except redis_errors.ResponseError as error:
                    readers.append(reader)  # (an error reply: the connection is sound)
                    if "NOGROUP" in str(error):
                        return None  # the next read script creates the group
                    raise
        except BaseException:
            if reader not in readers:
                # cancelled mid-read, or the connection failed: a reply may still
                # come on it, so it goes back to the pool closed
                with anyio.CancelScope(shield=True):
                    await reader.disconnect(nowait=True)
                    await self._pool().release(reader)
            raise
        readers.append(reader)
        return stream_reply(reply)

    async def acknowledge(self, stream: str, ids: Sequence[str]) -> None:
        async with self._turn():
            with _store_errors():
                # one transaction: an entry acknowledged but not deleted (the
                # connection lost between the two) would stay in the stream
                # for good; on a cluster, one pipeline to the stream's node
                # (see the module docstring)
                pipe = self.client.pipeline(transaction=self._cluster is None)
                pipe.xack(stream, GROUP, *ids)
                pipe.xdel(stream, *ids)
                await pipe.execute()

    async def hash_fields(self, key: str) -> list[Any]:
        async with self._turn():
            with _store_errors():
                mapping: Any = await self.client.hgetall(key)
        flat: list[Any] = []
        for field, value in mapping.items():
            flat += [field, value]
        return flat

    async def strike_entries(self, after: str) -> list[tuple[str, list[Any]]]:
        async with self._turn():
            with _store_errors():
                entries: Any = await self.client.xrange(self.layout.strikes, min=f"({after}")
        return [(text(entry_id), fields) for entry_id, fields in stream_entries(entries)]

    async def append_strike(self, data: bytes) -> str:
        async with self._turn():
            with _store_errors():
                entry_id: Any = await self.client.xadd(self.layout.strikes, {"i": data})
        return text(entry_id)

    async def subscriber(self) -> Subscriber:
        with _store_errors("SUBSCRIBE"):
            if self._cluster is not None:
                # plain PUBLISH reaches a subscriber on any node: the docket's own
                await self._cluster.initialize()
                node = self._cluster.get_node_from_key(self.layout.stream)
                pubsub: PubSub = self._cluster.pubsub(node=node)
            else:
                pubsub = self.client.pubsub()
            await pubsub.connect()  # type: ignore[no-untyped-call]
        return Subscriber(pubsub)

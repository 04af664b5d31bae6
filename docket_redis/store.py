"""The redis-py (asyncio) client primitives under ``ScriptedStore``."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from docket_core.lua import SCRIPTS
from docket_core.lua.base import ScriptedStore, transient
from docket_core.lua.protocol import GROUP, ScriptCall, text
from docket_core.sansio.errors import StoreError, StoreUnavailable, UsageError

_SHAS = {name: hashlib.sha1(source.encode()).hexdigest() for name, source in SCRIPTS.items()}

_FAILURES = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)


@contextmanager
def _store_errors(what: str = "a command") -> Iterator[None]:
    """A lost connection or a "not now" reply (loading, failover) is
    ``StoreUnavailable``; any other error reply is ``StoreError``."""
    try:
        yield
    except _FAILURES as error:
        raise StoreUnavailable(f"Redis unavailable: {error}") from error
    except redis_errors.ResponseError as error:
        if transient(str(error)):
            raise StoreUnavailable(f"Redis is not ready: {error}") from error
        raise StoreError(f"Redis refused {what}: {error}") from error


class RedisStore(ScriptedStore):
    """A docket on Redis or Valkey through redis-py.

    ``RedisStore.from_url("redis://host:6379/0", name=...)`` (also ``rediss://``
    for TLS and ``unix://``; user and password go in the URL), or
    ``RedisStore(client, name=...)`` with a ``redis.asyncio.Redis`` the
    application already has (its pool is used as it is; blocking reads need
    ``socket_timeout=None`` or a timeout above the worker's check interval).
    """

    def __init__(self, client: aioredis.Redis, *, name: str, owned: bool = False) -> None:
        super().__init__(name=name)
        self.client = client
        self._owned = owned

    @classmethod
    def from_url(cls, url: str, *, name: str) -> RedisStore:
        try:
            # no socket timeout: redis-py 8's 5 s default breaks blocking reads
            client = aioredis.Redis.from_url(url, socket_timeout=None, decode_responses=False)
        except ValueError as error:
            raise UsageError(f"not a usable Redis URL: {url!r} ({error})") from error
        return cls(client, name=name, owned=True)

    async def open(self) -> None:
        try:
            await self.client.ping()
        except _FAILURES as error:
            raise StoreUnavailable(f"cannot reach Redis: {error}") from error

    async def close(self) -> None:
        if self._owned:
            await self.client.aclose()

    # -- primitives ---------------------------------------------------------------

    async def run_calls(self, calls: Sequence[ScriptCall]) -> list[Any]:
        with _store_errors("a docket script"):
            try:
                return await self._evalsha(calls)
            except redis_errors.ResponseError as error:
                # (NoScriptError, or a NOSCRIPT reply inside a pipeline)
                noscript = isinstance(error, redis_errors.NoScriptError)
                if not noscript and "noscript" not in str(error).lower():
                    raise
                # the server lost its scripts (a restart): load them, try again;
                # calls of the batch that ran answer a resend with their outcome
                await self._load_scripts()
                return await self._evalsha(calls)

    async def _evalsha(self, calls: Sequence[ScriptCall]) -> list[Any]:
        if len(calls) == 1:
            call = calls[0]
            reply: Any = await self.client.evalsha(
                _SHAS[call.name], len(call.keys), *call.keys, *call.args
            )
            return [reply]
        pipe = self.client.pipeline(transaction=False)
        for call in calls:
            pipe.evalsha(_SHAS[call.name], len(call.keys), *call.keys, *call.args)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    async def _load_scripts(self) -> None:
        for source in SCRIPTS.values():
            await self.client.script_load(source)

    async def read_blocking(
        self, worker: str, count: int, block_ms: int
    ) -> list[tuple[Any, list[Any]]]:
        try:
            reply: Any = await self.client.xreadgroup(
                GROUP, worker, {self.layout.stream: ">"}, count=count, block=block_ms
            )
        except _FAILURES as error:
            raise StoreUnavailable(f"Redis unavailable: {error}") from error
        except redis_errors.ResponseError as error:
            if "NOGROUP" in str(error):
                return []  # the next read script creates the group
            raise StoreError(str(error)) from error
        entries: list[tuple[Any, list[Any]]] = []
        streams = reply.items() if isinstance(reply, dict) else (reply or [])
        for _, stream_entries in streams:
            for entry_id, fields in stream_entries:
                flat: list[Any] = []
                for field, value in (fields or {}).items():
                    flat += [field, value]
                entries.append((entry_id, flat))
        return entries

    async def acknowledge(self, ids: Sequence[str]) -> None:
        with _store_errors():
            # one transaction: an entry acknowledged but not deleted (the
            # connection lost between the two) would stay in the stream for good
            pipe = self.client.pipeline(transaction=True)
            pipe.xack(self.layout.stream, GROUP, *ids)
            pipe.xdel(self.layout.stream, *ids)
            await pipe.execute()

    async def hash_fields(self, key: str) -> list[Any]:
        with _store_errors():
            mapping: Any = await self.client.hgetall(key)
        flat: list[Any] = []
        for field, value in mapping.items():
            flat += [field, value]
        return flat

    async def strike_entries(self, after: str) -> list[tuple[str, bytes]]:
        with _store_errors():
            entries: Any = await self.client.xrange(self.layout.strikes, min=f"({after}")
        return [(text(entry_id), fields[b"i"]) for entry_id, fields in entries]

    async def append_strike(self, data: bytes) -> str:
        with _store_errors():
            entry_id = await self.client.xadd(self.layout.strikes, {"i": data})
        return text(entry_id)

    @asynccontextmanager
    async def listen(self, channel: str) -> AsyncIterator[AsyncIterator[bytes]]:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
        except _FAILURES as error:
            raise StoreUnavailable(f"Redis unavailable: {error}") from error

        async def messages() -> AsyncIterator[bytes]:
            while True:
                try:
                    message = await pubsub.get_message(timeout=None)
                except _FAILURES as error:
                    raise StoreUnavailable(f"Redis unavailable: {error}") from error
                if message is not None and message.get("type") == "message":
                    yield message["data"]

        try:
            yield messages()
        finally:
            try:
                await pubsub.unsubscribe()
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            except Exception:
                pass

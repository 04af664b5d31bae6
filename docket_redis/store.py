"""The redis-py (asyncio) client primitives under ``ScriptedStore``."""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.client import PubSub

from docket_core.lua import SCRIPTS
from docket_core.lua.base import ScriptedStore, reply_error
from docket_core.lua.entries import text
from docket_core.lua.protocol import GROUP, ScriptCall
from docket_core.sansio.errors import StoreError, StoreUnavailable, UsageError

_SHAS = {name: hashlib.sha1(source.encode()).hexdigest() for name, source in SCRIPTS.items()}

_FAILURES = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)

#: connections of a pool ``from_url`` makes (a worker takes two or three: its
#: blocking read, its effects, the shared pub/sub connection); commands past
#: it wait up to ``POOL_TIMEOUT`` seconds for one
MAX_CONNECTIONS = 50
POOL_TIMEOUT = 30.0
#: the longest a subscription waits for the server's confirmation
SUBSCRIBE_TIMEOUT = 10.0


@contextmanager
def _store_errors(what: str = "a command") -> Iterator[None]:
    """A lost connection or a "not now" reply (loading, failover) is
    ``StoreUnavailable``; any other error reply is ``StoreError``."""
    try:
        yield
    except _FAILURES as error:
        raise StoreUnavailable(f"Redis unavailable: {error}") from error
    except redis_errors.ResponseError as error:
        raise reply_error(str(error), what, "Redis") from error


#: GLIDE's spellings of redis-py's TLS options (``docket_glide.store.TLS_OPTIONS``)
_TLS_SPELLINGS = {
    "tls_ca_certs": "ssl_ca_certs",
    "tls_certfile": "ssl_certfile",
    "tls_keyfile": "ssl_keyfile",
}
_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def _redis_py_url(url: str) -> str:
    """``url`` with GLIDE's TLS spellings (``tls_ca_certs``, ``tls_insecure=true``
    ...) turned into redis-py's, and its TLS files checked for readability."""
    parsed = urlsplit(url)
    options = parse_qsl(parsed.query, keep_blank_values=True)
    for option, value in options:
        if option in _TLS_FILES + tuple(_TLS_SPELLINGS) and not os.access(value, os.R_OK):
            raise UsageError(f"cannot read {option}={value}")
    if not any(option in _TLS_SPELLINGS or option == "tls_insecure" for option, _ in options):
        return url
    translated: list[tuple[str, str]] = []
    for option, value in options:
        if option == "tls_insecure":
            if value.lower() not in ("true", "1", "yes", "on", "false", "0", "no", "off"):
                raise UsageError(f"tls_insecure takes true or false, not {value!r}")
            if value.lower() in ("true", "1", "yes", "on"):
                translated += [("ssl_cert_reqs", "none"), ("ssl_check_hostname", "false")]
        else:
            translated.append((_TLS_SPELLINGS.get(option, option), value))
    return urlunsplit(parsed._replace(query=urlencode(translated)))


def _unknown_options(pool: aioredis.ConnectionPool) -> str:
    """What is wrong with URL options no connection of ``pool`` takes ("" if
    none; redis-py itself would only fail on connecting)."""
    accepted: set[str] = set()
    for klass in pool.connection_class.__mro__[:-1]:
        init = vars(klass).get("__init__")
        if init is not None:
            accepted |= set(inspect.signature(init).parameters)
    unknown = sorted(set(pool.connection_kwargs) - accepted)
    if not unknown:
        return ""
    tls = any(option.startswith("ssl_") for option in unknown)
    return f"unknown option(s) in the Redis URL: {', '.join(map(repr, unknown))}" + (
        " (TLS options need rediss://)" if tls else ""
    )


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
        """A bounded pool: past ``MAX_CONNECTIONS`` commands wait (up to
        ``POOL_TIMEOUT``) for a connection instead of failing; the URL's
        ``?max_connections=...&timeout=...`` override both.  ``rediss://``
        takes redis-py's ``ssl_*`` options and GLIDE's ``tls_*`` spellings."""
        try:
            # no socket timeout: redis-py 8's 5 s default breaks blocking reads
            pool = aioredis.BlockingConnectionPool.from_url(
                _redis_py_url(url),
                max_connections=MAX_CONNECTIONS,
                timeout=POOL_TIMEOUT,
                socket_timeout=None,
                decode_responses=False,
            )
        except ValueError as error:
            raise UsageError(f"not a usable Redis URL: {url!r} ({error})") from error
        unknown = _unknown_options(pool)
        if unknown:
            raise UsageError(unknown)
        return cls(aioredis.Redis.from_pool(pool), name=name, owned=True)

    async def open(self) -> None:
        try:
            with _store_errors("PING (connecting)"):
                await self.client.ping()
        except StoreUnavailable as error:
            raise StoreUnavailable(f"cannot reach Redis: {error.__cause__}") from error.__cause__

    async def close(self) -> None:
        await self.close_listeners()
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
    ) -> dict[str, list[tuple[Any, list[Any]]]] | None:
        layout = self.layout
        try:
            reply: Any = await self.client.xreadgroup(
                GROUP,
                worker,
                {layout.stream: ">", layout.wake_stream: ">"},
                count=count,
                block=block_ms,
            )
        except _FAILURES as error:
            raise StoreUnavailable(f"Redis unavailable: {error}") from error
        except redis_errors.ResponseError as error:
            if "NOGROUP" in str(error):
                return None  # the next read script creates the group
            raise StoreError(str(error)) from error
        read: dict[str, list[tuple[Any, list[Any]]]] = {}
        streams = reply.items() if isinstance(reply, dict) else (reply or [])
        for stream, stream_entries in streams:
            entries = read.setdefault(text(stream), [])
            for entry_id, fields in stream_entries:
                flat: list[Any] = []
                for field, value in (fields or {}).items():
                    flat += [field, value]
                entries.append((entry_id, flat))
        return read

    async def acknowledge(self, stream: str, ids: Sequence[str]) -> None:
        with _store_errors():
            # one transaction: an entry acknowledged but not deleted (the
            # connection lost between the two) would stay in the stream for good
            pipe = self.client.pipeline(transaction=True)
            pipe.xack(stream, GROUP, *ids)
            pipe.xdel(stream, *ids)
            await pipe.execute()

    async def hash_fields(self, key: str) -> list[Any]:
        with _store_errors():
            mapping: Any = await self.client.hgetall(key)
        flat: list[Any] = []
        for field, value in mapping.items():
            flat += [field, value]
        return flat

    async def strike_entries(self, after: str) -> list[tuple[str, list[Any]]]:
        with _store_errors():
            entries: Any = await self.client.xrange(self.layout.strikes, min=f"({after}")
        flat: list[tuple[str, list[Any]]] = []
        for entry_id, fields in entries:
            pairs = fields.items() if isinstance(fields, dict) else ()
            flat.append((text(entry_id), [item for pair in pairs for item in pair]))
        return flat

    async def append_strike(self, data: bytes) -> str:
        with _store_errors():
            entry_id = await self.client.xadd(self.layout.strikes, {"i": data})
        return text(entry_id)

    async def subscriber(self) -> _Subscriber:
        pubsub = self.client.pubsub()
        try:
            await pubsub.connect()  # type: ignore[no-untyped-call]
        except _FAILURES as error:
            raise StoreUnavailable(f"Redis unavailable: {error}") from error
        return _Subscriber(pubsub)


class _Subscriber:
    """A redis-py ``PubSub`` as the ``Fanout``'s subscriber: SUBSCRIBE and
    UNSUBSCRIBE go out in order, and a subscription counts once its
    confirmation arrives through ``receive``."""

    def __init__(self, pubsub: PubSub) -> None:
        self._pubsub = pubsub
        self._sending = anyio.Lock()
        #: channel -> confirmations still to come, and the event they set
        self._unconfirmed: dict[str, tuple[int, anyio.Event]] = {}
        self._broken: StoreError | None = None

    async def subscribe(self, channel: str) -> None:
        async with self._sending:
            count, confirmed = self._unconfirmed.get(channel, (0, anyio.Event()))
            self._unconfirmed[channel] = (count + 1, confirmed)
            try:
                await self._pubsub.subscribe(channel)
            except BaseException as error:
                self._confirm(channel)
                if isinstance(error, _FAILURES):
                    raise StoreUnavailable(f"Redis unavailable: {error}") from error
                raise
        with anyio.move_on_after(SUBSCRIBE_TIMEOUT):
            await confirmed.wait()
        if self._broken is not None:
            raise self._broken
        if not confirmed.is_set():
            raise StoreUnavailable(f"Redis did not confirm a subscription to {channel}")

    async def unsubscribe(self, channel: str) -> None:
        async with self._sending:
            await self._pubsub.unsubscribe(channel)

    def _confirm(self, channel: str) -> None:
        count, confirmed = self._unconfirmed.get(channel, (0, None))
        if confirmed is None:
            return  # a subscription replayed after a reconnection
        if count <= 1:
            del self._unconfirmed[channel]
            confirmed.set()
        else:
            self._unconfirmed[channel] = (count - 1, confirmed)

    async def receive(self) -> tuple[str, bytes]:
        while True:
            try:
                message = await self._pubsub.get_message(timeout=None)
            except _FAILURES as error:
                self._broken = StoreUnavailable(f"Redis unavailable: {error}")
                for _, confirmed in self._unconfirmed.values():
                    confirmed.set()
                raise self._broken from error
            if message is None:
                continue
            kind = message["type"]
            if kind == "message":
                return text(message["channel"]), message["data"]
            if kind == "subscribe":
                self._confirm(text(message["channel"]))

    async def aclose(self) -> None:
        try:
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        except Exception:
            pass

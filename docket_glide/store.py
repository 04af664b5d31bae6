"""The Valkey GLIDE client primitives under ``ScriptedStore``.

GLIDE multiplexes one connection per node, so a blocking ``XREADGROUP`` would
stall every other command of its client: blocking reads get clients of their
own (kept in a small pool), and so does each pub/sub listener (GLIDE delivers
all of a client's subscriptions through one queue).  Numbers go out as
strings, scripts stay alive as module-level ``Script`` objects, server errors
are matched by their message, and clients are created lazily, so a process
that forks before using the docket never inherits one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any
from urllib.parse import unquote, urlparse

from glide import (
    Batch,
    ClosingError,
    GlideClient,
    GlideClientConfiguration,
    NodeAddress,
    RequestError,
    Script,
    ServerCredentials,
)
from glide import ConnectionError as GlideConnectionError
from glide import TimeoutError as GlideTimeoutError

from docket_core.lua import SCRIPTS
from docket_core.lua.base import ScriptedStore, transient
from docket_core.lua.protocol import GROUP, ScriptCall, text
from docket_core.sansio.errors import StoreError, StoreUnavailable, UsageError

#: kept alive for the life of the process: GLIDE reloads scripts from these
_SCRIPTS = {name: Script(source) for name, source in SCRIPTS.items()}  # type: ignore[no-untyped-call]

#: above the slowest script or batch we run; blocking reads get their own timeout
REQUEST_TIMEOUT_MS = 10_000

_FAILURES = (GlideConnectionError, GlideTimeoutError, ClosingError, OSError)


@contextmanager
def _store_errors(what: str = "a command") -> Iterator[None]:
    """A lost connection or a "not now" reply (loading, failover) is
    ``StoreUnavailable``; any other error reply is ``StoreError``."""
    try:
        yield
    except _FAILURES as error:
        raise StoreUnavailable(f"server unavailable: {error}") from error
    except RequestError as error:
        if transient(str(error)):
            raise StoreUnavailable(f"the server is not ready: {error}") from error
        raise StoreError(f"the server refused {what}: {error}") from error

PubSub = GlideClientConfiguration.PubSubSubscriptions
Modes = GlideClientConfiguration.PubSubChannelModes


def configuration_from_url(url: str, **extra: Any) -> GlideClientConfiguration:
    """``glide://[user:password@]host:port[/db]`` (``glides://`` for TLS)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("glide", "glides"):
        raise UsageError(f"not a glide:// or glides:// URL: {url!r}")
    credentials = None
    if parsed.password is not None:
        credentials = ServerCredentials(
            password=unquote(parsed.password),
            username=unquote(parsed.username) if parsed.username else None,
        )
    database = parsed.path.strip("/")
    try:
        database_id = int(database) if database else None
        port = parsed.port or 6379
    except ValueError as error:
        raise UsageError(f"not a usable GLIDE URL: {url!r} ({error})") from error
    return GlideClientConfiguration(
        [NodeAddress(parsed.hostname or "localhost", port)],
        use_tls=parsed.scheme == "glides",
        credentials=credentials,
        database_id=database_id,
        request_timeout=REQUEST_TIMEOUT_MS,
        **extra,
    )


class GlideStore(ScriptedStore):
    """A docket on Valkey or Redis through Valkey GLIDE.

    ``GlideStore.from_url("glide://host:6379/0", name=...)``, or
    ``GlideStore(configuration, name=..., client=existing)`` with a client the
    application already has (it is used for commands and scripts; blocking
    reads and listeners get clients of their own, built from ``configuration``).
    """

    def __init__(
        self,
        configuration: GlideClientConfiguration,
        *,
        name: str,
        client: GlideClient | None = None,
    ) -> None:
        super().__init__(name=name)
        self.configuration = configuration
        self.client = client
        self._owned = client is None
        self._readers: list[GlideClient] = []

    @classmethod
    def from_url(cls, url: str, *, name: str) -> GlideStore:
        return cls(configuration_from_url(url), name=name)

    async def _connect(self, **extra: Any) -> GlideClient:
        config = self.configuration
        try:
            return await GlideClient.create(
                GlideClientConfiguration(
                    config.addresses,
                    use_tls=config.use_tls,
                    credentials=config.credentials,
                    database_id=config.database_id,
                    request_timeout=config.request_timeout,
                    **extra,
                )
            )
        except _FAILURES as error:
            raise StoreUnavailable(f"cannot reach the server through GLIDE: {error}") from error
        except RequestError as error:
            raise StoreUnavailable(f"cannot reach the server through GLIDE: {error}") from error

    async def _main(self) -> GlideClient:
        if self.client is None:
            self.client = await self._connect()
        return self.client

    async def open(self) -> None:
        await self._main()

    async def close(self) -> None:
        for reader in self._readers:
            await reader.close()
        self._readers.clear()
        if self._owned and self.client is not None:
            await self.client.close()
            self.client = None

    # -- primitives ---------------------------------------------------------------

    async def run_calls(self, calls: Sequence[ScriptCall]) -> list[Any]:
        client = await self._main()
        with _store_errors("a docket script"):
            try:
                return await self._run(client, calls)
            except RequestError as error:
                if "noscript" not in str(error).lower():
                    raise
                # the server lost its scripts (a restart): load them, try again;
                # calls of the batch that ran answer a resend with their outcome
                for source in SCRIPTS.values():
                    await client.custom_command(["SCRIPT", "LOAD", source])
                return await self._run(client, calls)

    async def _run(self, client: GlideClient, calls: Sequence[ScriptCall]) -> list[Any]:
        if len(calls) == 1:
            call = calls[0]
            script = _SCRIPTS[call.name]
            return [await client.invoke_script(script, keys=list(call.keys), args=list(call.args))]
        return await self._batch(client, calls)

    async def _batch(self, client: GlideClient, calls: Sequence[ScriptCall]) -> list[Any]:
        batch = Batch(is_atomic=False)
        for call in calls:
            script = _SCRIPTS[call.name]
            batch.custom_command(
                ["EVALSHA", script.get_hash(), str(len(call.keys)), *call.keys, *call.args]
            )
        replies = await client.exec(batch, raise_on_error=True)
        return list(replies or [])

    async def read_blocking(
        self, worker: str, count: int, block_ms: int
    ) -> list[tuple[Any, list[Any]]]:
        reader = self._readers.pop() if self._readers else await self._connect()
        try:
            reply: Any = await reader.custom_command(
                [
                    "XREADGROUP",
                    "GROUP",
                    GROUP,
                    worker,
                    "COUNT",
                    str(count),
                    "BLOCK",
                    str(block_ms),
                    "STREAMS",
                    self.layout.stream,
                    ">",
                ]
            )
        except _FAILURES as error:
            await reader.close()
            raise StoreUnavailable(f"server unavailable: {error}") from error
        except RequestError as error:
            self._readers.append(reader)
            if "NOGROUP" in str(error):
                return []  # the next read script creates the group
            raise StoreError(str(error)) from error
        except BaseException:
            # cancelled mid-read: the connection may still deliver the reply
            await reader.close()
            raise
        self._readers.append(reader)
        return _stream_entries(reply)

    async def acknowledge(self, ids: Sequence[str]) -> None:
        client = await self._main()
        # one transaction: an entry acknowledged but not deleted (the
        # connection lost between the two) would stay in the stream for good
        batch = Batch(is_atomic=True)
        batch.xack(self.layout.stream, GROUP, list(ids))
        batch.xdel(self.layout.stream, list(ids))
        with _store_errors():
            await client.exec(batch, raise_on_error=True)

    async def hash_fields(self, key: str) -> list[Any]:
        client = await self._main()
        with _store_errors():
            mapping = await client.hgetall(key)
        flat: list[Any] = []
        for field, value in mapping.items():
            flat += [field, value]
        return flat

    async def strike_entries(self, after: str) -> list[tuple[str, bytes]]:
        client = await self._main()
        with _store_errors():
            reply: Any = await client.custom_command(
                ["XRANGE", self.layout.strikes, f"({after}", "+"]
            )
        entries = []
        for entry_id, fields in _stream_entries_flat(reply):
            data = dict(zip(fields[::2], fields[1::2], strict=True)).get(b"i")
            if data is not None:
                entries.append((text(entry_id), bytes(data)))
        return entries

    async def append_strike(self, data: bytes) -> str:
        client = await self._main()
        with _store_errors():
            entry_id = await client.custom_command(["XADD", self.layout.strikes, "*", "i", data])
        return text(entry_id)

    @asynccontextmanager
    async def listen(self, channel: str) -> AsyncIterator[AsyncIterator[bytes]]:
        subscriber = await self._connect(
            pubsub_subscriptions=PubSub(
                channels_and_patterns={Modes.Exact: {channel}}, callback=None, context=None
            )
        )

        async def messages() -> AsyncIterator[bytes]:
            while True:
                try:
                    message = await subscriber.get_pubsub_message()
                except _FAILURES as error:
                    raise StoreUnavailable(f"server unavailable: {error}") from error
                data = message.message
                yield data if isinstance(data, bytes) else str(data).encode()

        try:
            yield messages()
        finally:
            await subscriber.close()


def _stream_entries(reply: Any) -> list[tuple[Any, list[Any]]]:
    """XREADGROUP's reply in either RESP2 (lists) or RESP3 (maps) shape."""
    if not reply:
        return []
    streams = reply.items() if isinstance(reply, dict) else [(s[0], s[1]) for s in reply]
    entries: list[tuple[Any, list[Any]]] = []
    for _, stream_entries in streams:
        entries.extend(_stream_entries_flat(stream_entries))
    return entries


def _stream_entries_flat(entries: Any) -> list[tuple[Any, list[Any]]]:
    if isinstance(entries, dict):
        pairs = list(entries.items())
    else:
        pairs = [(e[0], e[1]) for e in entries or []]
    out: list[tuple[Any, list[Any]]] = []
    for entry_id, fields in pairs:
        flat: list[Any] = []
        if isinstance(fields, dict):
            for field, value in fields.items():
                flat += [field, value]
        else:
            for item in fields or []:
                if isinstance(item, list | tuple):
                    flat.extend(item)
                else:
                    flat.append(item)
        out.append((entry_id, flat))
    return out

"""The Valkey GLIDE client primitives under ``ScriptedStore``.

GLIDE multiplexes one connection per node, so a blocking ``XREADGROUP`` would
stall every other command of its client: blocking reads get clients of their
own (kept in a small pool), and pub/sub gets one client whose channels every
listener of the store shares (subscribed and unsubscribed as listeners come
and go, see ``docket_core.lua.fanout``).  Numbers go out as
strings, scripts stay alive as module-level ``Script`` objects, server errors
are matched by their message, and clients are created lazily, so a process
that forks before using the docket never inherits one.

On a cluster (``glide+cluster://``) every client is a ``GlideClusterClient``:
GLIDE routes each call by its keys and follows MOVED and ASK; a fenced
script on a moving slot gets TRYAGAIN, which GLIDE retries until the request
timeout (``StoreUnavailable`` after it, and the core sends again).  Calls
in order go as a batch per run of one slot, one after another; calls with no
order between their slots (``run_calls_apart``) go in one batch.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeAlias

import anyio
from glide import (
    AllPrimaries,
    Batch,
    BatchRetryStrategy,
    ClosingError,
    ClusterBatch,
    ClusterBatchOptions,
    ConfigurationError,
    GlideClient,
    GlideClusterClient,
    GlideClusterClientConfiguration,
    RequestError,
    Script,
)
from glide import ConnectionError as GlideConnectionError
from glide import TimeoutError as GlideTimeoutError

from docket_core.lua import SCRIPTS
from docket_core.lua.acl import acl_refusal
from docket_core.lua.base import ScriptedStore, reply_error
from docket_core.lua.entries import stream_entries, stream_reply, text
from docket_core.lua.protocol import GROUP, ScriptCall
from docket_core.sansio.errors import StoreError, StoreUnavailable, UsageError

from .configuration import (
    REQUEST_TIMEOUT_MS,
    TLS_OPTIONS,
    Configuration,
    configuration_from_url,
)
from .native import NativeScripts

__all__ = [
    "REQUEST_TIMEOUT_MS",
    "TLS_OPTIONS",
    "GlideStore",
    "InFlight",
    "configuration_from_url",
]

#: either kind of GLIDE client: one server, or a cluster
Client: TypeAlias = GlideClient | GlideClusterClient

#: kept alive for the life of the process: GLIDE reloads scripts from these
_SCRIPTS = {name: Script(source) for name, source in SCRIPTS.items()}  # type: ignore[no-untyped-call]

_FAILURES = (GlideConnectionError, GlideTimeoutError, ClosingError, OSError)

#: GLIDE's default ``inflight_requests_limit``
GLIDE_INFLIGHT_LIMIT = 1000


def _store_error(error: Exception, what: str) -> StoreError:
    """A lost connection, a timeout or a "not now" reply (loading, failover;
    on a cluster MOVED, ASK, TRYAGAIN, CLUSTERDOWN) is ``StoreUnavailable``;
    any other error reply is ``StoreError``.  (GLIDE's ``TimeoutError`` and
    ``ConnectionError`` are ``RequestError``s: they are checked first.)"""
    if isinstance(error, RequestError) and not isinstance(error, _FAILURES):
        return reply_error(str(error), what, "the server")
    return StoreUnavailable(f"server unavailable: {error}")


@contextmanager
def _store_errors(what: str = "a command") -> Iterator[None]:
    """``_store_error`` for the errors of the block."""
    try:
        yield
    except (*_FAILURES, RequestError) as error:
        raise _store_error(error, what) from error


class InFlight:
    """At most ``limit`` requests at once: past it, requests wait their turn
    (first come, first served).  A request below the limit costs a counter
    decrement, with no pass of the event loop (an ``anyio.Semaphore``'s
    acquire takes one)."""

    __slots__ = ("_free", "_waiting")

    def __init__(self, limit: int) -> None:
        self._free = limit
        #: the turns of waiting requests, oldest first; a set event is a turn given
        self._waiting: deque[anyio.Event] = deque()

    def take(self) -> bool:
        """Take a free turn now, if there is one and nobody waits for it."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> None:
        if self.take():
            return
        turn = anyio.Event()
        self._waiting.append(turn)
        try:
            await turn.wait()
        except BaseException:
            if turn.is_set():
                self.release()  # given its turn as it was cancelled: pass it on
            else:
                self._waiting.remove(turn)
            raise

    def release(self) -> None:
        if self._waiting:
            self._waiting.popleft().set()
        else:
            self._free += 1


def _connect_error(error: Exception, configuration: Configuration) -> Exception:
    """The docket error for a client GLIDE could not create."""
    refusal = acl_refusal(str(error), "connecting", _user(configuration))
    if refusal is not None:
        if "'INFO'" in refusal:
            refusal += " (GLIDE runs INFO on every connect: the user's ACL must allow +info)"
        return StoreError(refusal)
    if isinstance(error, ConfigurationError):
        return UsageError(f"GLIDE refused the configuration: {error}")
    message = f"cannot reach the server through GLIDE: {error}".rstrip()
    if configuration.use_tls and "timed out" in str(error):
        message += (
            " (over TLS, GLIDE reports a failed handshake as a timeout: check the CA"
            " (tls_ca_certs) and, if the server requires one, the client certificate"
            " (tls_certfile, tls_keyfile))"
        )
    return StoreUnavailable(message)


def _user(configuration: Configuration) -> str | None:
    credentials = configuration.credentials
    return None if credentials is None else credentials.username or "default"


async def _create(configuration: Configuration) -> Client:
    """A new client of the configuration's kind (one server, or a cluster)."""
    if isinstance(configuration, GlideClusterClientConfiguration):
        return await GlideClusterClient.create(configuration)
    return await GlideClient.create(configuration)


async def _refused_on_connect(configuration: Configuration) -> str | None:
    """The ACL refusal of ``SELECT`` or ``CLIENT SETNAME`` that failed a connect:
    GLIDE reports those as a timeout, so a client without them tries them."""
    probes = []
    if configuration.database_id:
        probes.append(["SELECT", str(configuration.database_id)])
    if configuration.client_name:
        probes.append(["CLIENT", "SETNAME", configuration.client_name])
    if not probes:
        return None
    plain = copy.copy(configuration)
    plain.database_id = plain.client_name = plain.pubsub_subscriptions = None
    try:
        client = await _create(plain)
    except (*_FAILURES, RequestError):
        return None
    try:
        for probe in probes:
            try:
                await client.custom_command(probe)
            except RequestError as error:
                refusal = acl_refusal(str(error), "connecting", _user(configuration))
                if refusal is not None:
                    return refusal
    finally:
        await client.close()
    return None


#: a cluster batch retries the commands the server answered "not now"
#: (TRYAGAIN while their slot moves) until the request timeout, as GLIDE
#: does for a single script: every docket script declares a fence, so such
#: a command did not run
_CLUSTER_BATCH = ClusterBatchOptions(retry_strategy=BatchRetryStrategy(retry_server_error=True))


def _same_slot_groups(calls: Sequence[ScriptCall]) -> Iterator[Sequence[ScriptCall]]:
    """Consecutive calls whose first keys share their hash tag (``{...}``):
    a cluster runs each group on one node in order, and the groups one after
    another (a pipeline across nodes has no order)."""
    start = 0
    tag = _tag(calls[0])
    for index in range(1, len(calls)):
        next_tag = _tag(calls[index])
        if next_tag != tag:
            yield calls[start:index]
            start, tag = index, next_tag
    yield calls[start:]


def _tag(call: ScriptCall) -> str:
    key = call.keys[0] if call.keys else ""
    return key.partition("}")[0] if key.startswith("{") else key


class GlideStore(ScriptedStore):
    """A docket on Valkey or Redis through Valkey GLIDE.

    ``GlideStore.from_url("glide://host:6379/0", name=...)`` (or
    ``glide+cluster://h1:p1,h2:p2`` for a cluster), or
    ``GlideStore(configuration, name=..., client=existing)`` with a client the
    application already has (it is used for commands and scripts; blocking
    reads and listeners get clients of their own, built from ``configuration``).
    A ``GlideClusterClientConfiguration`` takes a ``GlideClusterClient``.
    """

    def __init__(
        self,
        configuration: Configuration,
        *,
        name: str,
        client: Client | None = None,
        partitions: int = 1,
    ) -> None:
        super().__init__(name=name, partitions=partitions)
        self.cluster = isinstance(configuration, GlideClusterClientConfiguration)
        if client is not None and isinstance(client, GlideClusterClient) != self.cluster:
            kind = "GlideClusterClient" if self.cluster else "GlideClient"
            raise UsageError(f"this configuration takes a {kind}, not a {type(client).__name__}")
        self.configuration = configuration
        self.client = client
        self._owned = client is None
        #: one server: a read's new entries come with its script
        self.reads_in_one_trip = not self.cluster
        self._readers: list[Client] = []

    @classmethod
    def from_url(cls, url: str, *, name: str) -> GlideStore:
        return cls(configuration_from_url(url), name=name)

    async def _connect(self) -> Client:
        """A client of its own: all of ``configuration`` (TLS, credentials,
        database, timeouts, advanced settings), without its subscriptions
        (the shared subscriber subscribes on a live client)."""
        configuration = copy.copy(self.configuration)
        configuration.pubsub_subscriptions = None
        try:
            return await _create(configuration)
        except (*_FAILURES, RequestError) as error:
            failure = _connect_error(error, configuration)
            if isinstance(failure, StoreUnavailable) and "timed out" in str(error):
                refusal = await _refused_on_connect(configuration)
                failure = failure if refusal is None else StoreError(refusal)
            raise failure from error

    async def _main(self) -> Client:
        if self.client is None:
            self.client = await self._connect()
        return self.client

    async def open(self) -> None:
        await self._main()

    def sibling(self, name: str, partitions: int = 1) -> GlideStore:
        """Docket ``name`` on this open store's main client (not owned:
        closing it leaves the client open), sharing its requests in flight;
        its blocking reads get clients of their own, its listeners share its
        subscriber."""
        if self.client is None:
            raise UsageError(f"open the store of docket {self.name} before its siblings")
        sibling = GlideStore(
            self.configuration, name=name, client=self.client, partitions=partitions
        )
        sibling._inflight = self._limiter()
        sibling.signing = self.signing
        sibling.shares_listeners_with(self)
        return sibling

    async def close(self) -> None:
        await self.close_listeners()
        for reader in self._readers:
            await reader.close()
        self._readers.clear()
        self._native = None
        if self._owned and self.client is not None:
            await self.client.close()
            self.client = None

    # -- primitives ---------------------------------------------------------------

    #: the main client's requests in flight: past half the client's limit (the
    #: rest is the application's, when it shares its client) they wait their
    #: turn, where GLIDE would refuse them past its ``inflight_requests_limit``
    _inflight: InFlight | None = None

    def _limiter(self) -> InFlight:
        if self._inflight is None:
            limit = self.configuration.inflight_requests_limit or GLIDE_INFLIGHT_LIMIT
            self._inflight = InFlight(max(limit // 2, 1))
        return self._inflight

    @asynccontextmanager
    async def _request(self, what: str = "a command") -> AsyncIterator[Client]:
        """The main client, for one request, its errors translated, once it
        is the request's turn (``_inflight``)."""
        inflight = self._limiter()
        await inflight.acquire()
        try:
            client = await self._main()
            with _store_errors(what):
                yield client
        finally:
            inflight.release()

    async def run_calls(self, calls: Sequence[ScriptCall]) -> list[Any]:
        return await self._run_calls(calls, False)

    async def run_calls_apart(self, calls: Sequence[ScriptCall]) -> list[Any]:
        # (one server: the ordered batch of ``run_calls``)
        return await self._run_calls(calls, True)

    def same_client(self, other: ScriptedStore) -> bool:
        client = other.client if isinstance(other, GlideStore) else None
        return client is not None and client is self.client

    async def _run_calls(self, calls: Sequence[ScriptCall], apart: bool) -> list[Any]:
        # the hot path (every add, every flush of a worker's effects): what
        # ``_request`` does, without a context manager's frames
        inflight = self._inflight or self._limiter()
        if not inflight.take():
            await inflight.acquire()
        try:
            client = self.client or await self._main()
            try:
                return await self._run(client, calls, apart)
            except RequestError as error:
                if "noscript" not in str(error).lower() or isinstance(error, _FAILURES):
                    raise
                # the server lost its scripts (a restart; on a cluster, also a
                # new primary): load them, try again; calls of the batch that
                # ran answer a resend with their outcome
                await _load_scripts(client)
                return await self._run(client, calls, apart)
        except (*_FAILURES, RequestError) as error:
            raise _store_error(error, "a docket script") from error
        finally:
            inflight.release()

    async def run_read(
        self, call: ScriptCall, worker: str, count: int
    ) -> tuple[Any, dict[str, list[tuple[Any, list[Any]]]] | None]:
        batch = Batch(is_atomic=False)
        batch.custom_command(
            ["EVALSHA", _SCRIPTS[call.name].get_hash(), str(len(call.keys)), *call.keys, *call.args]
        )
        batch.custom_command(
            ["XREADGROUP", "GROUP", GROUP, worker, "COUNT", str(count),
             "STREAMS", self.layout.stream, ">"]
        )  # fmt: skip
        inflight = self._inflight or self._limiter()
        if not inflight.take():
            await inflight.acquire()
        try:
            client = self.client or await self._main()
            reply, entries = await client.exec(batch, raise_on_error=False) or (None, None)
            if isinstance(reply, RequestError) and "noscript" in str(reply).lower():
                # the server lost its scripts: load them, and run the script
                # again (its read ran: the entries it handed out are here)
                await _load_scripts(client)
                (reply,) = await self._run(client, [call])
        except (*_FAILURES, RequestError) as error:
            raise _store_error(error, "a docket script") from error
        finally:
            inflight.release()
        if isinstance(reply, Exception):
            raise _store_error(reply, "a docket script") from reply
        if isinstance(entries, Exception):
            if "NOGROUP" in str(entries):
                return reply, None
            raise _store_error(entries, "XREADGROUP") from entries
        return reply, stream_reply(entries)

    async def _run(
        self, client: Client, calls: Sequence[ScriptCall], apart: bool = False
    ) -> list[Any]:
        if len(calls) == 1:
            return [await self._invoke(client, calls[0])]
        if isinstance(client, GlideClusterClient):
            if apart:  # (no order between slots: one batch to all their nodes)
                return await _cluster_batch(client, calls)
            return await _run_on_cluster(client, calls, self._invoke)
        return await self._batch(client, calls)

    #: the native script calls of the main client (``native``), or ``None``
    #: when its GLIDE is not the one they were written for; made on the
    #: client's first script call
    _native: tuple[Client, NativeScripts | None] | None = None

    def _invoke(self, client: Client, call: ScriptCall) -> Awaitable[Any]:
        """One script call: through ``NativeScripts`` when the client allows."""
        native = self._native
        if native is None or native[0] is not client:
            native = self._native = (client, NativeScripts.for_client(client, _SCRIPTS))
        if native[1] is not None:
            return native[1].invoke(call)
        script = _SCRIPTS[call.name]
        return client.invoke_script(script, keys=list(call.keys), args=list(call.args))

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
    ) -> dict[str, list[tuple[Any, list[Any]]]] | None:
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
                    self.layout.wake_stream,
                    ">",
                    ">",
                ]
            )
        except _FAILURES as error:
            await reader.close()
            raise StoreUnavailable(f"server unavailable: {error}") from error
        except RequestError as error:
            self._readers.append(reader)
            if "NOGROUP" in str(error):
                return None  # the next read script creates the group
            # on a cluster, TRYAGAIN while the docket's slot moves: not now
            raise _store_error(error, "a blocking read") from error
        except BaseException:
            # cancelled mid-read: the connection may still deliver the reply
            await reader.close()
            raise
        self._readers.append(reader)
        return stream_reply(reply)

    async def acknowledge(self, stream: str, ids: Sequence[str]) -> None:
        # one transaction: an entry acknowledged but not deleted (the
        # connection lost between the two) would stay in the stream for good
        # (one key: on a cluster, one slot)
        async with self._request() as client:
            if isinstance(client, GlideClusterClient):
                on_cluster = ClusterBatch(is_atomic=True)
                on_cluster.xack(stream, GROUP, list(ids))
                on_cluster.xdel(stream, list(ids))
                await client.exec(on_cluster, raise_on_error=True)
            else:
                batch = Batch(is_atomic=True)
                batch.xack(stream, GROUP, list(ids))
                batch.xdel(stream, list(ids))
                await client.exec(batch, raise_on_error=True)

    async def hash_fields(self, key: str) -> list[Any]:
        async with self._request() as client:
            mapping = await client.hgetall(key)
        flat: list[Any] = []
        for field, value in mapping.items():
            flat += [field, value]
        return flat

    async def strike_entries(self, after: str) -> list[tuple[str, list[Any]]]:
        async with self._request() as client:
            reply: Any = await client.custom_command(
                ["XRANGE", self.layout.strikes, f"({after}", "+"]
            )
        return [(text(entry_id), fields) for entry_id, fields in stream_entries(reply)]

    async def append_strike(self, data: bytes) -> str:
        async with self._request() as client:
            entry_id: Any = await client.custom_command(
                ["XADD", self.layout.strikes, "*", "i", data]
            )
        return text(entry_id)

    async def subscriber(self) -> _Subscriber:
        # subscriptions made on the client (GLIDE >= 2.1) are kept across its
        # reconnections, like those of its configuration; on a cluster the
        # client subscribes on one node, which every node's PUBLISH reaches
        return _Subscriber(await self._connect())


async def _run_on_cluster(
    client: GlideClusterClient,
    calls: Sequence[ScriptCall],
    invoke: Callable[[Client, ScriptCall], Awaitable[Any]],
) -> list[Any]:
    """The calls on a cluster: a pipeline per same-slot group (one node
    each), the groups in order; a group of one goes through ``invoke``."""
    replies: list[Any] = []
    for group in _same_slot_groups(calls):
        if len(group) == 1:
            replies.append(await invoke(client, group[0]))
        else:
            replies += await _cluster_batch(client, group)
    return replies


async def _cluster_batch(client: GlideClusterClient, calls: Sequence[ScriptCall]) -> list[Any]:
    """The calls in one non-atomic cluster batch: a pipeline to each of their
    nodes, the nodes side by side (in order within a node)."""
    batch = ClusterBatch(is_atomic=False)
    for call in calls:
        script = _SCRIPTS[call.name]
        batch.custom_command(
            ["EVALSHA", script.get_hash(), str(len(call.keys)), *call.keys, *call.args]
        )
    return list(await client.exec(batch, raise_on_error=True, options=_CLUSTER_BATCH) or [])


async def _load_scripts(client: Client) -> None:
    """``SCRIPT LOAD`` every docket script (on a cluster, on every primary)."""
    for source in SCRIPTS.values():
        if isinstance(client, GlideClusterClient):
            await client.custom_command(["SCRIPT", "LOAD", source], route=AllPrimaries())
        else:
            await client.custom_command(["SCRIPT", "LOAD", source])


class _Subscriber:
    """A GLIDE client in subscriber mode, as the ``Fanout``'s subscriber."""

    def __init__(self, client: Client) -> None:
        self._client = client
        #: subscriptions go out one at a time, so they reach the client's
        #: desired state in the order they were made
        self._sending = anyio.Lock()

    async def subscribe(self, channel: str) -> None:
        async with self._sending:
            with _store_errors("a subscription"):
                await self._client.subscribe({channel}, timeout_ms=REQUEST_TIMEOUT_MS)

    async def unsubscribe(self, channel: str) -> None:
        async with self._sending:
            await self._client.unsubscribe_lazy({channel})

    async def receive(self) -> tuple[str, bytes]:
        try:
            message = await self._client.get_pubsub_message()
        except _FAILURES as error:
            raise StoreUnavailable(f"server unavailable: {error}") from error
        data = message.message
        return text(message.channel), data if isinstance(data, bytes) else str(data).encode()

    async def aclose(self) -> None:
        await self._client.close()

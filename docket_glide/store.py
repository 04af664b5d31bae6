"""The Valkey GLIDE client primitives under ``ScriptedStore``.

GLIDE multiplexes one connection per node, so a blocking ``XREADGROUP`` would
stall every other command of its client: blocking reads get clients of their
own (kept in a small pool), and pub/sub gets one client whose channels every
listener of the store shares (subscribed and unsubscribed as listeners come
and go, see ``docket_core.lua.fanout``).  Numbers go out as
strings, scripts stay alive as module-level ``Script`` objects, server errors
are matched by their message, and clients are created lazily, so a process
that forks before using the docket never inherits one.
"""

from __future__ import annotations

import copy
import inspect
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlparse

import anyio
from glide import (
    AdvancedGlideClientConfiguration,
    Batch,
    ClosingError,
    ConfigurationError,
    GlideClient,
    GlideClientConfiguration,
    NodeAddress,
    RequestError,
    Script,
    ServerCredentials,
    TlsAdvancedConfiguration,
)
from glide import ConnectionError as GlideConnectionError
from glide import TimeoutError as GlideTimeoutError

from docket_core.lua import SCRIPTS
from docket_core.lua.acl import acl_refusal
from docket_core.lua.base import ScriptedStore, reply_error
from docket_core.lua.entries import text
from docket_core.lua.protocol import GROUP, ScriptCall
from docket_core.sansio.errors import StoreError, StoreUnavailable, UsageError

#: kept alive for the life of the process: GLIDE reloads scripts from these
_SCRIPTS = {name: Script(source) for name, source in SCRIPTS.items()}  # type: ignore[no-untyped-call]

#: above the slowest script or batch we run; blocking reads get their own timeout
REQUEST_TIMEOUT_MS = 10_000

_FAILURES = (GlideConnectionError, GlideTimeoutError, ClosingError, OSError)

#: GLIDE's default ``inflight_requests_limit``
GLIDE_INFLIGHT_LIMIT = 1000


def _store_error(error: Exception, what: str) -> StoreError:
    """A lost connection or a "not now" reply (loading, failover) is
    ``StoreUnavailable``; any other error reply is ``StoreError``."""
    if isinstance(error, RequestError):
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

    async def acquire(self) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
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


#: URL query option -> TLS setting; redis-py's spellings work too, so one
#: ``?ssl_ca_certs=...`` URL serves ``rediss://`` and ``glides://``
TLS_OPTIONS = {
    "tls_ca_certs": "ca",
    "ssl_ca_certs": "ca",
    "tls_certfile": "cert",
    "ssl_certfile": "cert",
    "tls_keyfile": "key",
    "ssl_keyfile": "key",
    "tls_insecure": "insecure",
    "ssl_cert_reqs": "cert_reqs",
}
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def configuration_from_url(url: str, **extra: Any) -> GlideClientConfiguration:
    """``glide://[user:password@]host:port[/db]``; ``glides://`` for TLS, with
    ``?tls_ca_certs=ca.pem&tls_certfile=cert.pem&tls_keyfile=key.pem`` and
    ``tls_insecure=true`` (or redis-py's ``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile``, ``ssl_cert_reqs=none``)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("glide", "glides"):
        raise UsageError(f"not a glide:// or glides:// URL: {url!r}")
    tls = _tls_configuration(parsed.query, parsed.scheme == "glides")
    if tls is not None:
        if "advanced_config" in extra:
            raise UsageError("give TLS options in the URL or in advanced_config, not both")
        extra["advanced_config"] = AdvancedGlideClientConfiguration(tls_config=tls)
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


def _tls_configuration(query: str, use_tls: bool) -> TlsAdvancedConfiguration | None:
    """The TLS settings of a URL's query (``TLS_OPTIONS``), read and checked."""
    settings: dict[str, tuple[str, str]] = {}
    unknown = []
    for option, value in parse_qsl(query, keep_blank_values=True):
        setting = TLS_OPTIONS.get(option)
        if setting is None:
            unknown.append(option)
        elif setting in settings:
            raise UsageError(f"{settings[setting][0]!r} and {option!r} set the same thing")
        else:
            settings[setting] = (option, value)
    if unknown:
        raise UsageError(
            f"unknown option(s) in the GLIDE URL: {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(TLS_OPTIONS)})"
        )
    if not settings:
        return None
    if not use_tls:
        options = ", ".join(option for option, _ in settings.values())
        raise UsageError(f"TLS options need a glides:// URL: {options}")
    insecure = _insecure(settings)
    if ("cert" in settings) != ("key" in settings):
        raise UsageError("a client certificate needs both tls_certfile and tls_keyfile")
    certificate: dict[str, bytes] = {}
    if "cert" in settings:
        if "client_cert_pem" not in inspect.signature(TlsAdvancedConfiguration).parameters:
            raise UsageError(
                f"valkey-glide {version('valkey-glide')} cannot present a client "
                "certificate (tls_certfile, tls_keyfile): upgrade valkey-glide"
            )
        certificate = {
            "client_cert_pem": _pem(*settings["cert"]),
            "client_key_pem": _pem(*settings["key"]),
        }
    ca = settings.get("ca")
    return TlsAdvancedConfiguration(
        use_insecure_tls=insecure or None,
        root_pem_cacerts=_pem(*ca) if ca else None,
        **certificate,
    )


def _insecure(settings: dict[str, tuple[str, str]]) -> bool:
    """``tls_insecure=true`` or ``ssl_cert_reqs=none``: no certificate checks."""
    insecure = False
    if "insecure" in settings:
        option, value = settings["insecure"]
        if value.lower() not in _TRUE + _FALSE:
            raise UsageError(f"{option} takes true or false, not {value!r}")
        insecure = value.lower() in _TRUE
    if "cert_reqs" in settings:
        option, value = settings["cert_reqs"]
        reqs = value.lower().removeprefix("cert_")
        if reqs not in ("none", "required"):
            raise UsageError(
                f"{option}={value} has no GLIDE equivalent: GLIDE checks the server's "
                "certificate (required) or not at all (none)"
            )
        insecure = insecure or reqs == "none"
    return insecure


def _pem(option: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read {option}={path}: {error.strerror}") from error
    if not data.strip():
        raise UsageError(f"{option}={path} is empty")
    return data


def _connect_error(error: Exception, configuration: GlideClientConfiguration) -> Exception:
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


def _user(configuration: GlideClientConfiguration) -> str | None:
    credentials = configuration.credentials
    return None if credentials is None else credentials.username or "default"


async def _refused_on_connect(configuration: GlideClientConfiguration) -> str | None:
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
        client = await GlideClient.create(plain)
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

    async def _connect(self) -> GlideClient:
        """A client of its own: all of ``configuration`` (TLS, credentials,
        database, timeouts, advanced settings), without its subscriptions
        (the shared subscriber subscribes on a live client)."""
        configuration = copy.copy(self.configuration)
        configuration.pubsub_subscriptions = None
        try:
            return await GlideClient.create(configuration)
        except (*_FAILURES, RequestError) as error:
            failure = _connect_error(error, configuration)
            if isinstance(failure, StoreUnavailable) and "timed out" in str(error):
                refusal = await _refused_on_connect(configuration)
                failure = failure if refusal is None else StoreError(refusal)
            raise failure from error

    async def _main(self) -> GlideClient:
        if self.client is None:
            self.client = await self._connect()
        return self.client

    async def open(self) -> None:
        await self._main()

    async def close(self) -> None:
        await self.close_listeners()
        for reader in self._readers:
            await reader.close()
        self._readers.clear()
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
    async def _request(self, what: str = "a command") -> AsyncIterator[GlideClient]:
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
        # the hot path (every add, every flush of a worker's effects): what
        # ``_request`` does, without a context manager's frames
        inflight = self._inflight or self._limiter()
        await inflight.acquire()
        try:
            client = self.client or await self._main()
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
        except (*_FAILURES, RequestError) as error:
            raise _store_error(error, "a docket script") from error
        finally:
            inflight.release()

    async def _run(self, client: GlideClient, calls: Sequence[ScriptCall]) -> list[Any]:
        if len(calls) == 1:
            call = calls[0]
            script = _SCRIPTS[call.name]
            return [await client.invoke_script(script, keys=call.keys, args=call.args)]  # type: ignore[arg-type]
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
            raise StoreError(str(error)) from error
        except BaseException:
            # cancelled mid-read: the connection may still deliver the reply
            await reader.close()
            raise
        self._readers.append(reader)
        return _stream_entries(reply)

    async def acknowledge(self, stream: str, ids: Sequence[str]) -> None:
        # one transaction: an entry acknowledged but not deleted (the
        # connection lost between the two) would stay in the stream for good
        batch = Batch(is_atomic=True)
        batch.xack(stream, GROUP, list(ids))
        batch.xdel(stream, list(ids))
        async with self._request() as client:
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
        return [(text(entry_id), fields) for entry_id, fields in _stream_entries_flat(reply)]

    async def append_strike(self, data: bytes) -> str:
        async with self._request() as client:
            entry_id = await client.custom_command(["XADD", self.layout.strikes, "*", "i", data])
        return text(entry_id)

    async def subscriber(self) -> _Subscriber:
        # subscriptions made on the client (GLIDE >= 2.1) are kept across its
        # reconnections, like those of its configuration
        return _Subscriber(await self._connect())


class _Subscriber:
    """A GLIDE client in subscriber mode, as the ``Fanout``'s subscriber."""

    def __init__(self, client: GlideClient) -> None:
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


def _stream_entries(reply: Any) -> dict[str, list[tuple[Any, list[Any]]]]:
    """XREADGROUP's reply in either RESP2 (lists) or RESP3 (maps) shape, by stream."""
    if not reply:
        return {}
    streams = reply.items() if isinstance(reply, dict) else [(s[0], s[1]) for s in reply]
    entries: dict[str, list[tuple[Any, list[Any]]]] = {}
    for stream, stream_entries in streams:
        entries.setdefault(text(stream), []).extend(_stream_entries_flat(stream_entries))
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

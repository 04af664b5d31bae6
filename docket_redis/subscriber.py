"""The subscriber of a Redis store's listeners (``RedisStore.subscriber``):
a redis-py ``PubSub`` behind the ``Fanout`` (``docket_core.lua.fanout``)."""

from __future__ import annotations

import anyio
from redis import exceptions as redis_errors
from redis.asyncio.client import PubSub

from docket_core.lua.entries import text
from docket_core.sansio.errors import StoreError, StoreUnavailable

__all__ = ["FAILURES", "SUBSCRIBE_TIMEOUT", "Subscriber"]

#: what a client raises when its connection fails
FAILURES = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)

#: the longest a subscription waits for the server's confirmation
SUBSCRIBE_TIMEOUT = 10.0


class Subscriber:
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
                if isinstance(error, FAILURES):
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
            except FAILURES as error:
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
            await self._pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
        except Exception:
            pass

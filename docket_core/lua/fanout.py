"""``Fanout``: one pub/sub connection shared by every listener of a store.

A process may wait on many things at once (a thousand ``get_result`` calls,
the worker's cancellation listener): each used to hold a connection of its
own.  A ``Fanout`` holds one ``Subscriber`` (the adapter's connection in
subscriber mode) and one *pump*, a background task that reads its messages and
hands each to the memory streams of the channel's listeners.  A channel is
subscribed when its first listener comes and unsubscribed when its last one
leaves (reference counts), and a listener starts only once the server has
confirmed its subscription, so nothing published after that is missed.

When the connection fails for good, every listener gets the error (a
``StoreUnavailable``) and the next listener opens a new one.  Messages
published while a client reconnects by itself are lost, as with any
pub/sub.

The pump outlives the listener that started it, so it is not a child of any
task group: it runs as an asyncio task or a trio system task, and ``aclose``
ends it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol

import anyio
import attrs
from anyio.streams.memory import MemoryObjectSendStream

from ..sansio.errors import StoreError, StoreUnavailable

#: the longest ``aclose`` waits for the pump to end, and a listener leaving
#: for its unsubscription to go out
CLOSE_TIMEOUT = 5.0


class Subscriber(Protocol):
    """One client connection in subscriber mode (the adapter's part)."""

    async def subscribe(self, channel: str) -> None:
        """Subscribe; return once the server confirmed it."""

    async def unsubscribe(self, channel: str) -> None:
        """Unsubscribe (no need to wait for the confirmation)."""

    async def receive(self) -> tuple[str, bytes]:
        """The next message: ``(channel, payload)``; ``StoreError`` once the
        connection is lost for good."""

    async def aclose(self) -> None:
        """Close the connection."""


_Send = MemoryObjectSendStream[bytes | StoreError]


@attrs.define(eq=False)
class _Channel:
    """One subscribed channel: its listeners' streams, and whether (and how)
    its subscription was confirmed."""

    listeners: set[_Send] = attrs.field(factory=set)
    ready: anyio.Event = attrs.field(factory=anyio.Event)
    error: StoreError | None = None
    #: the first listener gave up before the confirmation: the others retry
    retry: bool = False


class Fanout:
    """The channels a store listens to, multiplexed over one ``Subscriber``."""

    def __init__(self, connect: Callable[[], Awaitable[Subscriber]]) -> None:
        self._connect = connect
        self._subscriber: Subscriber | None = None
        self._channels: dict[str, _Channel] = {}
        self._connecting = anyio.Lock()
        self._pump: anyio.CancelScope | None = None
        self._pump_done: anyio.Event | None = None

    @asynccontextmanager
    async def listen(self, channel: str) -> AsyncIterator[AsyncIterator[bytes]]:
        """The payloads published on ``channel`` from now until exited."""
        subscriber = await self._subscriber_now()
        send, receive = anyio.create_memory_object_stream[bytes | StoreError](math.inf)
        entry: _Channel | None = None
        try:
            entry = await self._join(subscriber, channel, send)

            async def messages() -> AsyncIterator[bytes]:
                async for item in receive:
                    if isinstance(item, StoreError):
                        raise item
                    yield item

            yield messages()
        finally:
            send.close()
            receive.close()
            if entry is not None:
                await self._leave(subscriber, channel, entry, send)

    async def _join(self, subscriber: Subscriber, channel: str, send: _Send) -> _Channel:
        """Add a listener to ``channel`` (subscribing it, for the first one);
        return once the server has confirmed the subscription."""
        while True:
            entry = self._channels.get(channel)
            if entry is None:
                entry = self._channels[channel] = _Channel()
                entry.listeners.add(send)
                try:
                    await subscriber.subscribe(channel)
                except BaseException as error:
                    # the listeners waiting for it subscribe again if this
                    # one only gave up (cancelled), else they fail too
                    entry.error = _unavailable(error)
                    entry.retry = isinstance(error, anyio.get_cancelled_exc_class())
                    entry.ready.set()
                    if self._channels.get(channel) is entry:
                        del self._channels[channel]
                        await _unsubscribe(subscriber, channel)
                    raise
                entry.ready.set()
                return entry
            entry.listeners.add(send)
            try:
                await entry.ready.wait()
            except BaseException:
                await self._leave(subscriber, channel, entry, send)
                raise
            if entry.error is None:
                return entry
            entry.listeners.discard(send)
            if not entry.retry or self._subscriber is not subscriber:
                # (a connection that failed meanwhile is not subscribed on again)
                raise entry.error

    async def _leave(
        self, subscriber: Subscriber, channel: str, entry: _Channel, send: _Send
    ) -> None:
        entry.listeners.discard(send)
        if not entry.listeners and self._channels.get(channel) is entry:
            del self._channels[channel]
            await _unsubscribe(subscriber, channel)

    async def _subscriber_now(self) -> Subscriber:
        subscriber = self._subscriber
        if subscriber is not None:
            return subscriber
        async with self._connecting:
            if self._subscriber is None:
                self._subscriber = await self._connect()
                self._pump = anyio.CancelScope()
                self._pump_done = anyio.Event()
                _spawn(self._run_pump, self._subscriber, self._pump, self._pump_done)
            return self._subscriber

    async def _run_pump(self, subscriber: Subscriber) -> None:
        try:
            while True:
                channel, data = await subscriber.receive()
                entry = self._channels.get(channel)
                if entry is not None:
                    for listener in entry.listeners:
                        try:
                            listener.send_nowait(data)
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            pass  # a listener leaving
        except Exception as error:
            self._fail(subscriber, _unavailable(error))
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
                try:
                    await subscriber.aclose()
                except Exception:
                    pass

    def _fail(self, subscriber: Subscriber, error: StoreError) -> None:
        """The connection is gone: every listener gets ``error``; the next
        listener connects again."""
        if self._subscriber is not subscriber:
            return
        self._subscriber = None
        channels, self._channels = self._channels, {}
        for entry in channels.values():
            entry.error = error
            entry.ready.set()
            for listener in entry.listeners:
                try:
                    listener.send_nowait(error)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass

    async def aclose(self) -> None:
        """End the pump and close the connection; listeners still waiting
        get a ``StoreUnavailable``."""
        async with self._connecting:  # a connection being made is closed too
            subscriber, pump, done = self._subscriber, self._pump, self._pump_done
            if subscriber is None:
                return
            self._fail(subscriber, StoreUnavailable("the docket was closed"))
        if pump is not None and done is not None:
            pump.cancel()
            with anyio.move_on_after(CLOSE_TIMEOUT):
                await done.wait()
        await subscriber.aclose()


async def _unsubscribe(subscriber: Subscriber, channel: str) -> None:
    """Unsubscribe, even from a cancelled listener, for a bounded time."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
        try:
            await subscriber.unsubscribe(channel)
        except Exception:
            pass  # a lost connection unsubscribed it anyway


def _unavailable(error: BaseException) -> StoreError:
    if isinstance(error, StoreError):
        return error
    return StoreUnavailable(f"the subscription failed: {error!r}")


def _spawn(
    run: Callable[[Subscriber], Awaitable[None]],
    subscriber: Subscriber,
    scope: anyio.CancelScope,
    done: anyio.Event,
) -> None:
    """Run ``run(subscriber)`` in the background, outside any task group (a
    trio system task, or an asyncio task), until ``scope`` is cancelled."""

    async def host() -> None:
        try:
            with scope:
                await run(subscriber)
        finally:
            done.set()

    trio = sys.modules.get("trio")
    if trio is not None and trio.lowlevel.in_trio_run():
        trio.lowlevel.spawn_system_task(host)
    else:
        import asyncio

        task = asyncio.get_running_loop().create_task(host())
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)


#: the pumps running as asyncio tasks (the loop keeps only weak references)
_TASKS: set[object] = set()

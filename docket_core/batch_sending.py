"""How the worker runtime sends the machine's effects (``BatchSending``,
mixed into ``Worker``).

The *flusher* drains the machine's effects whenever it has new ones, and
hands all store effects of a round to the adapter in one call, then feeds
the outcomes back (an idle worker's pickup the reader flushes itself, its
runs begun just before their claim is written: ``held_calls``).  The
machine says when a round's batch goes out (``batch_turn``): beside the
batches out, or alone, once they are answered.  Where the store keeps the
order of a worker's batches, two may be out at once: the flusher leaves a
batch to one of two *senders* and goes on.  Batches go out, and their
outcomes reach the machine, in the order the machine handed them out
(``_send``); a batch that failed is the machine's to send again, give up or
declare fatal (``_store_failed``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import anyio
import anyio.lowlevel

from .docket import Docket
from .execution import Execution
from .health import HealthState
from .sansio.effects import BatchTurn, Effect, Read, StoreEffect
from .sansio.errors import StoreError, StoreUnavailable
from .sansio.inputs import ReplyLost, StoreFailed
from .sansio.worker import WorkerMachine

logger = logging.getLogger("docket.worker")


class _Runtime(Protocol):
    """What ``BatchSending`` needs of the worker it is mixed into."""

    docket: Docket
    _machine: WorkerMachine | None
    _health: HealthState
    _dirty: anyio.Event
    _finished: anyio.Event
    _flushing: bool
    _flushed: anyio.Event | None
    _batches: int
    _written: int
    _answered: int
    _turned: anyio.Event | None
    _outgoing: deque[tuple[list[StoreEffect], int]]
    _outgoing_ready: anyio.Event
    _calls: dict[str, tuple[Callable[..., Any], Execution, dict[str, str]]]

    def _run_effect(self, effect: Effect) -> bool: ...

    def _rearm_timer(self) -> None: ...

    async def _flush(self, rounds: int | None = None) -> None: ...

    async def _send(self, store: list[StoreEffect], batch: int, release: bool = False) -> None: ...

    async def _turn(self) -> None: ...

    def _turn_taken(self) -> None: ...

    def _store_failed(self, effects: list[StoreEffect], error: StoreError) -> None: ...


class BatchSending:
    """The worker's flusher and senders: the machine's effects to the store,
    a round's in one call, and the outcomes back, in order."""

    #: the event the end of the flush under way sets, if someone waits for it
    _flushed: anyio.Event | None
    #: the event a batch going out or being answered sets, if someone waits
    _turned: anyio.Event | None

    async def _flusher(self: _Runtime) -> None:
        """``_flush`` whenever the machine has new effects, until it is quiet."""
        machine = self._machine
        assert machine is not None
        while True:
            await self._dirty.wait()
            self._dirty = anyio.Event()
            while self._flushing:  # (the reader's, for a pickup)
                self._flushed = self._flushed or anyio.Event()
                await self._flushed.wait()
            await self._flush()
            if machine.quiet:
                self._finished.set()
                return

    async def _flush(self: _Runtime, rounds: int | None = None) -> None:
        """Carry out the machine's effects until it has none (or for
        ``rounds`` rounds, the reader's pickup), a round's store effects in
        one call; one flush at a time.  A round's batch goes out when the
        machine's ``batch_turn`` says: beside the batches out, from a sender
        (``_sender``, where the machine may have two out and the flusher
        goes on), or before the runs that start with it, once the batches
        ahead of it are answered where the turn is ``ALONE``.  In a pickup
        (``rounds``) the runs that start with their claim begin just before
        it is written, the store's calls held until it is (``held_calls``)."""
        machine = self._machine
        assert machine is not None
        self._flushing = True
        try:
            while rounds is None or rounds > 0:
                effects = machine.effects()
                if not effects:
                    break
                if rounds is not None:
                    rounds -= 1
                turn = machine.batch_turn
                store: list[StoreEffect] = []
                read_handed = False
                for effect in effects:
                    if isinstance(effect, StoreEffect):
                        store.append(effect)
                    else:
                        read_handed = read_handed or type(effect) is Read
                if store:
                    # a batch handed out before is not on the wire yet: this
                    # one goes after it, and no run of this one starts first
                    while self._written < self._batches:
                        await self._turn()
                    if turn is BatchTurn.ALONE:
                        while self._answered < self._batches:
                            await self._turn()
                started = False
                for effect in effects:
                    if not isinstance(effect, StoreEffect):
                        started = self._run_effect(effect) or started
                if started:  # (a run with a timeout has a deadline now)
                    self._rearm_timer()
                if not store:
                    continue
                batch = self._batches
                self._batches += 1
                if rounds is not None and started:
                    # a pickup: the runs handed over begin before their claim
                    # is written (a write that wakes the server is a good
                    # part of a pickup), every call on the store held back
                    # until it is (``held_calls``), so no run reaches the
                    # store ahead of its claim
                    adapter = self.docket.adapter
                    adapter.hold_calls()
                    try:
                        await anyio.lowlevel.checkpoint()
                        await self._send(store, batch, release=True)
                    finally:
                        adapter.release_calls()
                    continue
                if turn is BatchTurn.BESIDE:
                    if rounds is None and machine.config.batches_in_flight > 1:
                        # (the store keeps the order of this worker's
                        # batches: this one goes out from a sender, beside
                        # the one out, and the flusher goes on)
                        self._outgoing.append((store, batch))
                        self._outgoing_ready.set()
                        continue
                    if read_handed:
                        # the reader sends its read before this batch goes
                        # out: the server answers it first, and the next
                        # deliveries are prepared while it works on the
                        # batch.  (Not before the claim of runs that start
                        # with it: it goes out before they get a turn, so a
                        # run sees its key running.)
                        await anyio.lowlevel.checkpoint()
                await self._send(store, batch)
        finally:
            self._flushing = False
            flushed, self._flushed = self._flushed, None
            if flushed is not None:
                flushed.set()

    async def _sender(self: _Runtime) -> None:
        """Send the batches the flusher leaves to the senders, one at a time
        (a worker that may keep two out has two senders)."""
        outgoing = self._outgoing
        while True:
            while not outgoing:
                await self._outgoing_ready.wait()
                self._outgoing_ready = anyio.Event()
            store, batch = outgoing.popleft()
            await self._send(store, batch)

    async def _send(
        self: _Runtime, store: list[StoreEffect], batch: int, release: bool = False
    ) -> None:
        """Send the ``batch``-th batch once those before it are on the wire,
        and hand its outcomes to the machine once theirs are (a store that
        keeps the order answers them in it anyway).  ``release``: let the
        calls held behind this batch go as it is written."""
        machine = self._machine
        assert machine is not None
        while self._written < batch:
            await self._turn()
        try:
            self._written += 1  # (on the wire when ``execute`` first yields)
            self._turn_taken()
            adapter = self.docket.adapter
            if release:
                # (the held calls go once ``execute`` has written the batch:
                # at its first yield, or where the store's client may yield
                # before it writes, when it says it wrote: ``held_calls``)
                adapter.pass_next_call()
            if machine.config.batches_in_flight > 1:
                outcomes = await adapter.execute_in_order(store)
            else:
                outcomes = await adapter.execute(store)
        except StoreError as error:
            while self._answered < batch:
                await self._turn()
            self._answered += 1
            self._turn_taken()
            self._store_failed(store, error)
            self._dirty.set()
            return
        while self._answered < batch:
            await self._turn()
        self._answered += 1
        self._turn_taken()
        self._health.store_answered()
        machine.store_replied(store, outcomes, time.time())
        if len(self._calls) > len(machine.in_flight):
            # deliveries that ended without starting (struck,
            # superseded, parked, lost) leave their calls behind
            for delivery_id in [d for d in self._calls if d not in machine.in_flight]:
                del self._calls[delivery_id]
        self._dirty.set()

    async def _turn(self: _Runtime) -> None:
        """Wait until a batch goes out or is answered."""
        if self._turned is None:
            self._turned = anyio.Event()
        await self._turned.wait()

    def _turn_taken(self: _Runtime) -> None:
        turned, self._turned = self._turned, None
        if turned is not None:
            turned.set()

    def _store_failed(self: _Runtime, effects: list[StoreEffect], error: StoreError) -> None:
        """Tell the machine a batch failed: it decides when to send it again,
        when to give it up, and when the worker must stop."""
        machine = self._machine
        assert machine is not None
        failure = ReplyLost if isinstance(error, StoreUnavailable) else StoreFailed
        if failure is ReplyLost:
            self._health.store_lost()
        now = time.time()
        machine.receive(failure(effects=tuple(effects), now=now, reason=str(error)))
        self._rearm_timer()
        if machine.fatal is not None:
            logger.error("stopping: %s", machine.fatal)
            raise StoreError(machine.fatal) from error
        resend_at = machine.outbox.resend_at
        then = "given up" if resend_at is None else f"sent again in {resend_at - now:.3g}s"
        logger.warning("store unavailable (%s); %d effects %s", error, len(effects), then)

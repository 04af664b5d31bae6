"""``Worker``: the anyio runtime that drives a ``WorkerMachine`` and runs tasks.

Four loops share one task group: the *reader* asks the store for deliveries
while the machine has capacity; the *flusher* drains the machine's effects,
hands all store effects of a round to the adapter in one call and feeds the
outcomes back (an idle worker's pickup the reader flushes itself: its claim
goes out at once, its next read after the start).  Where the store keeps
the order of a worker's batches (``StorageAdapter.keeps_order``), the
machine lets two be out at once: the flusher leaves a batch to one of two
*senders* and goes on, so the next one (the claims of a read that came back)
goes out behind it instead of after its reply; the batches go out, and
their outcomes reach the machine, in the order the machine handed them out
(``_send``; the flusher and senders are ``batch_sending``'s); the *timer* sleeps until
the machine's next deadline and ticks it; the *listener* turns cancellation
signals into inputs; the *signal* loop turns SIGTERM and SIGINT into a drain
(the second one into a stop without draining).  The worker keeps its
``health`` (``health.HealthState``) from what these loops see.  Task
functions run on a few long-lived runner tasks (``running.Runner``: a
``StartTask`` queues its run, and a runner takes it), shielded from the worker's own
cancellation so a stopping worker drains them instead of killing them; a
``CancelTask`` cancels only its run.  The log lines are pydocket's
(``worker_logs``).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from functools import partial
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup

from . import dependencies, instrumentation, worker_logs
from .batch_sending import BatchSending
from .dependencies import validate as validate_task
from .docket import Docket
from .execution import Execution
from .health import Health, HealthState, close_healthcheck, serve_healthcheck, stop_signals
from .perpetual import first_run
from .running import Runner, decode, frozen_heap, loop_options
from .sansio.admission import Blocked, blocked_message
from .sansio.effects import (
    CancelTask,
    Effect,
    Read,
    SeedPerpetuals,
    StartTask,
    StoreEffect,
)
from .sansio.errors import StoreError, UsageError
from .sansio.flight import Count
from .sansio.inputs import (
    AbandonRequested,
    Arrival,
    CancelRequested,
    ReadDone,
    ReadFailed,
    ShutdownRequested,
    Tick,
)
from .sansio.strikes import StrikeList
from .sansio.values import NO_POLICY, Delivery
from .sansio.worker import WorkerConfig, WorkerMachine
from .serialization import describe
from .shared import SharedScope, open_scope, validate_worker_dependencies

logger = logging.getLogger("docket.worker")

#: the signals that stop a worker (the second one at once), and what it says
_SIGNALLED = {False: ": draining", True: " again: stopping"}

#: how often automatic perpetual tasks are added again, as pydocket does
RESEED_SECONDS = 60.0
#: the least a stopping worker whose tasks have ended waits for its store
STOP_GRACE = 1.0


class Worker(BatchSending):
    """Runs the tasks of one docket."""

    def __init__(
        self,
        docket: Docket,
        name: str | None = None,
        concurrency: int = 10,
        redelivery_timeout: timedelta = timedelta(minutes=5),
        reconnection_delay: timedelta = timedelta(seconds=5),
        minimum_check_interval: timedelta = timedelta(milliseconds=250),
        scheduling_resolution: timedelta = timedelta(milliseconds=250),
        schedule_automatic_tasks: bool = True,
        fallback_task: Callable[..., Any] | None = None,
        drain_timeout: timedelta | None = None,
        handle_signals: bool = True,
        dependencies: Mapping[str, Any] | Sequence[Any] | None = None,
        freeze_gc: bool = False,
    ) -> None:
        """``dependencies`` (by name, or a sequence) resolve around every run
        of this worker, and are not passed to the tasks; their ``Shared``
        values are built as the worker starts (``shared``).
        ``fallback_task`` runs (with the original arguments and full
        dependency injection) for messages naming a task this worker does not
        know; without one, such a message ends FAILED with the reason.
        ``scheduling_resolution`` is accepted for compatibility with pydocket:
        due tasks are promoted by every read, and a newly scheduled soonest task
        wakes the readers, so there is no separate scheduler loop to tune.

        A stopping worker waits for its running tasks as long as they take
        (``drain_timeout`` None, as pydocket) or up to ``drain_timeout``; then,
        or at a second SIGTERM/SIGINT, it cancels them without recording
        anything (the store hands them out again once their leases lapse; a
        sync task's thread cannot be cancelled: the worker waits for it).

        Run in the main thread, the worker drains on SIGTERM or SIGINT and
        stops at once on the second one; ``handle_signals=False`` leaves the
        signals alone, for a worker embedded in a host (a web server's
        lifespan) that owns them and cancels the worker to stop it.

        ``freeze_gc=True`` keeps the objects there when the worker starts out
        of the garbage collector's passes until it stops, and collects young
        objects less often (``running.frozen_heap``: a few µs less CPU a task,
        and no full collection pauses over the application's heap);
        ``docket worker`` sets it, since its process is
        the worker's own.  A reference cycle among those objects that becomes
        garbage meanwhile, or that was garbage already in the oldest
        generation when the worker started, is collected only after the
        worker stops."""
        self.docket = docket
        self.freeze_gc = freeze_gc
        self.drain_timeout = drain_timeout
        self.handle_signals = handle_signals
        self._health = HealthState()
        if fallback_task is not None:
            validate_task(fallback_task)  # (``dependencies`` is the argument here)
        self.fallback_task = fallback_task
        self.name = name or f"{socket.gethostname()}#{os.getpid()}"
        self.concurrency = concurrency
        self.redelivery_timeout = redelivery_timeout
        self.reconnection_delay = reconnection_delay
        self.minimum_check_interval = minimum_check_interval
        self.scheduling_resolution = scheduling_resolution
        self.schedule_automatic_tasks = schedule_automatic_tasks
        if concurrency < 1:
            raise UsageError("a worker's concurrency must be at least 1")
        self._machine: WorkerMachine | None = None
        self._limits: dict[str, int] = {}
        self._runs: dict[str, int] = {}
        self._log_extra = worker_logs.worker_extra(docket.name, self.name)
        self.dependencies = validate_worker_dependencies(dependencies)
        #: the ``Shared`` values of this worker, while it is entered or runs
        self.shared_scope: SharedScope | None = None

    async def __aenter__(self) -> Worker:
        self.shared_scope = await open_scope(self.docket, self, self.dependencies)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        scope, self.shared_scope = self.shared_scope, None
        if scope is not None:
            await scope.__aexit__(exc_type, exc, tb)

    @property
    def counters(self) -> Mapping[str, int]:
        """What the worker has done so far (delivered, started, succeeded, ...,
        the values of ``Count``); a snapshot in which a count never reached
        reads as 0."""
        if self._machine is None:
            return Counter()
        return Counter({count.value: n for count, n in self._machine.counters.items()})

    @property
    def health(self) -> Health:
        """Where this worker stands (``health.Health``): ``READY`` once a
        signal would drain it and its store answered, until it drains or
        loses its store.  Safe to read from any thread."""
        return self._health.health

    @property
    def running_tasks(self) -> int:
        """How many task functions run now."""
        return len(self._scopes) if self._machine else 0

    # -- public run modes ----------------------------------------------------------

    @classmethod
    async def run(
        cls,
        docket_name: str = "docket",
        url: str | None = None,
        *,
        until_finished: bool = False,
        healthcheck_port: int | None = None,
        metrics_port: int | None = None,
        tasks: Sequence[str] = (),
        fallback_task: str | None = None,
        dependencies: Mapping[str, Any] | Sequence[Any] | str | None = None,
        **options: Any,
    ) -> None:
        """Open docket ``docket_name`` at ``url``, register the task
        collections named in ``tasks`` (``"module:attribute"``; the built-in
        tasks are always there), and run one worker on it until finished or
        stopped, optionally serving Prometheus metrics and a healthcheck on
        ``healthcheck_port`` (200 only while the worker is ``READY``, 503
        before, while it drains, and while its store is lost: ``health``).
        ``options`` are the worker's own (``name``, ``concurrency``...);
        ``dependencies`` may be a ``"module:attribute"`` path to them."""
        fallback = None
        if fallback_task:
            module_name, _, attribute = fallback_task.partition(":")
            fallback = getattr(importlib.import_module(module_name), attribute)
        if isinstance(dependencies, str):
            module_name, _, attribute = dependencies.partition(":")
            dependencies = getattr(importlib.import_module(module_name), attribute)
        if metrics_port:
            instrumentation.serve_metrics(metrics_port)
        worker: Worker | None = None

        def health() -> Health:
            # (the probe answers from the worker's own state once it exists)
            return Health.STARTING if worker is None else worker.health

        server = serve_healthcheck(healthcheck_port, health)
        try:
            async with Docket(name=docket_name, url=url) as docket:
                for collection in tasks:
                    docket.register_collection(collection)
                worker = cls(docket, fallback_task=fallback, dependencies=dependencies, **options)
                async with worker:
                    if until_finished:
                        await worker.run_until_finished()
                    else:
                        await worker.run_forever()
        finally:
            if server is not None:
                await anyio.to_thread.run_sync(close_healthcheck, server)

    @classmethod
    def run_sync(cls, *, loop: str = "asyncio", **arguments: Any) -> None:
        """``run(**arguments)`` in an event loop of its own, ``loop``
        (``running.LOOPS``: ``asyncio``, ``uvloop``, ``trio``), until the worker
        stops; for a program whose only job is the worker."""
        anyio.run(partial(cls.run, **arguments), **loop_options(loop))

    async def run_forever(self) -> None:
        """Run until cancelled or sent SIGTERM/SIGINT; running tasks are drained."""
        await self._run(until_finished=False)

    async def run_until_finished(self) -> None:
        """Run until nothing is scheduled, queued or running."""
        await self._run(until_finished=True)

    async def run_at_most(self, iterations_by_key: Mapping[str, int]) -> None:
        """Run until finished, letting each listed key run at most n times
        (later runs are struck)."""
        self._limits = dict(iterations_by_key)
        self._runs = {}
        try:
            await self._run(until_finished=True)
        finally:
            self._limits = {}

    # -- the runtime -----------------------------------------------------------------

    async def _run(self, *, until_finished: bool) -> None:
        health = self._health
        health.begin(signals=self._owns_signals)
        try:
            # the handlers go in before anything else: once ready, a signal drains
            with (
                stop_signals(self._owns_signals, self._health) as signals,
                frozen_heap(self.freeze_gc),
            ):
                if self.shared_scope is not None:
                    await self._work(until_finished, signals)
                else:  # (not entered: the scope lives as long as this run)
                    async with self:
                        await self._work(until_finished, signals)
        finally:
            health.stopped()

    async def _work(
        self, until_finished: bool, signals: AsyncIterator[signal.Signals] | None
    ) -> None:
        config = WorkerConfig(
            name=self.name,
            # (partitioned: not the name, which scopes its limits: ``running``)
            docket=self.docket.name if self.docket.partitions == 1 else f"{self.docket.name}|*",
            concurrency=self.concurrency,
            redelivery_timeout=self.redelivery_timeout.total_seconds(),
            heartbeat_interval=self.docket.heartbeat_interval.total_seconds(),
            execution_ttl=self.docket.execution_ttl.total_seconds(),
            tasks=tuple(sorted(self.docket.tasks)),
            reseed_interval=RESEED_SECONDS if self.schedule_automatic_tasks else None,
            origin=f"{self.name}#{uuid.uuid4().hex[:12]}",
            retry_delay=self.reconnection_delay.total_seconds(),
            read_block=self.minimum_check_interval.total_seconds(),
            until_finished=until_finished,
            reads=True,
            start_early=self.docket.adapter.sends_at_once,
            batches_in_flight=2 if self.docket.adapter.keeps_order else 1,
        )
        worker_logs.log_startup(self.name, self.docket.tasks, self._log_extra)
        machine = self._machine = WorkerMachine(config, time.time())
        instrumentation.watch(self)
        self._dirty = anyio.Event()
        self._rearm = anyio.Event()
        self._stopping = anyio.Event()
        self._finished = anyio.Event()
        #: the read the machine asked for (it asks for one at a time)
        self._read: Read | None = None
        #: a flush runs, and the event its end sets if someone waits for it
        self._flushing = False
        self._flushed: anyio.Event | None = None
        #: the batches handed to the store, those of them on the wire, and
        #: those whose outcomes the machine has: a batch goes out, and is
        #: answered, in its turn (``_send``); the event wakes who waits for one
        self._batches = self._written = self._answered = 0
        self._turned: anyio.Event | None = None
        #: the batches for the senders (``_sender``), and the event that
        #: wakes an idle one
        self._outgoing: deque[tuple[list[StoreEffect], int]] = deque()
        self._outgoing_ready = anyio.Event()
        #: the deadline the timer sleeps until
        self._armed_at = math.inf
        self._read_ready = anyio.Event()
        self._scopes: dict[str, anyio.CancelScope] = {}
        #: delivery id -> the last ``CancelTask`` of its run
        self._stops: dict[str, CancelTask] = {}
        #: delivery id -> the function, the execution and the headers of its call
        self._calls: dict[str, tuple[Callable[..., Any], Execution, dict[str, str]]] = {}
        self._background: list[anyio.CancelScope] = []
        #: set once the cancellations are listened to (or could not be): the
        #: first read waits for it, so that no run starts deaf to its cancel
        self._listening = anyio.Event()
        self._runner = Runner(
            self,
            machine,
            scopes=self._scopes,
            stops=self._stops,
            wake=lambda: self._dirty.set(),
            rearm=self._rearm_timer,
            stop_worker=self._stopping.set,
            spawn=lambda runner: self._spawn(self._group, runner),
        )
        if self.schedule_automatic_tasks:
            await self._seed_automatic()
        async with anyio.create_task_group() as group:
            self._group = group
            self._spawn(group, self._flusher)
            if config.batches_in_flight > 1:
                # (shielded as the loops are: a stopping worker drains what
                # is out, then cancels them with the loops)
                for _ in range(config.batches_in_flight):
                    self._spawn(group, self._sender)
            self._spawn(group, self._timer)
            self._spawn(group, self._listener)
            self._spawn(group, self._reader)
            heartbeat = self.docket.heartbeat_interval.total_seconds()
            self._spawn(group, partial(instrumentation.measure_depths, self.docket, heartbeat))
            if signals is not None:
                self._spawn(group, partial(self._signals, signals))
            try:
                machine.receive(Tick(now=time.time()))
                self._dirty.set()
                await self._stopping.wait()
            finally:
                # (stopping now, however asked: a signal from here on stops at once)
                self._stopping.set()
                self._health.draining()
                with anyio.CancelScope(shield=True):
                    if machine.failed is None:  # (a failed machine takes nothing more)
                        machine.receive(ShutdownRequested(now=time.time()))
                    self._dirty.set()
                    drain = self.drain_timeout
                    with anyio.move_on_after(math.inf if drain is None else drain.total_seconds()):
                        await self._drained()
                    if not machine.quiet:
                        self._abandon()
                    self._runner.close()  # (no runner task starts after the pass below)
                    for scope in self._background:
                        scope.cancel()

    def _spawn(self, group: TaskGroup, loop: Callable[[], Awaitable[None]]) -> None:
        scope = anyio.CancelScope(shield=True)
        self._background.append(scope)

        async def shielded() -> None:
            try:
                with scope:
                    await loop()
            except BaseException:
                # a broken loop must not leave the shutdown path waiting forever
                self._stopping.set()
                self._finished.set()
                raise
            finally:
                # a retired runner's scope is not kept for the worker's lifetime
                self._background.remove(scope)

        group.start_soon(shielded)

    async def _reader(self) -> None:
        """Carry out the machine's reads, one at a time: the strikes first (once
        read, deliveries must reach the machine), then the store's read."""
        machine = self._machine
        assert machine is not None
        adapter = self.docket.adapter
        await self._listening.wait()
        while True:
            while self._read is None:
                await self._read_ready.wait()
                self._read_ready = anyio.Event()
            read, self._read = self._read, None
            pickup = False
            try:
                self._strikes = await adapter.strikes()
                result = await adapter.read(
                    worker=read.worker,
                    count=read.count,
                    now=time.time(),
                    redelivery_timeout=read.redelivery_timeout,
                    block=read.block,
                    recover=read.recover,
                    stale_scan_every=read.stale_scan_every,
                )
                self._health.read_succeeded()
                held = machine.in_flight
                arrivals = tuple(
                    self._arrival(d) for d in result.deliveries if d.delivery_id not in held
                )
                malformed = tuple(m for m in result.malformed if m.delivery_id not in held)
                for entry in malformed:
                    logger.error(
                        "malformed message %s%s: %s; moving it to the dead letters",
                        entry.delivery_id,
                        f" (key {entry.key!r})" if entry.key is not None else "",
                        entry.reason,
                    )
                pending = None
                if read.then_pending and not result.deliveries:
                    pending = await adapter.pending()
                pickup = bool(arrivals) and not held
                done = ReadDone(
                    arrivals=arrivals,
                    next_due=result.next_due,
                    now=time.time(),
                    pending=pending,
                    malformed=malformed,
                    fresh=result.fresh,
                )
                machine.receive(done)
            except StoreError as error:
                self._health.store_lost()
                machine.receive(ReadFailed(now=time.time(), reason=str(error)))
                logger.warning(
                    "store unavailable (%s); reading again in %s", error, self.reconnection_delay
                )
            if machine.finished:
                self._stopping.set()
            self._rearm_timer()
            if pickup and not self._flushing:
                # an idle worker's pickup: the claim goes out from here (a
                # fresh delivery's run starting with it, just before it is
                # written: ``BatchSending._flush``), not handed to the
                # flusher behind whatever else runs first, and the next read
                # waits for the start (its script would share the claim's
                # round trip, and go out first).  Only that round: what its
                # reply leads to (the ends, the next read) goes to the flusher,
                # so this reader is free to send that read while the ends are out
                await self._flush(rounds=1)
                await anyio.lowlevel.checkpoint()  # (the run handed over starts)
                self._dirty.set()
            else:
                self._dirty.set()

    def _arrival(self, delivery: Delivery) -> Arrival:
        """``_prepare``, where an error of ours is the delivery's problem too:
        nothing a message holds may stop the reader."""
        try:
            return self._prepare(delivery)
        except Exception as error:
            self._calls.pop(delivery.delivery_id, None)
            problem = f"the message could not be prepared: {describe(error)}"
            return Arrival(delivery=delivery, policy=NO_POLICY, problem=problem)

    def _prepare(self, delivery: Delivery) -> Arrival:
        """Decode a delivery and work out its policy (pure work, no store)."""
        call = decode(self.docket, delivery, self.fallback_task, self.name, self.dependencies)
        if isinstance(call, str):
            return Arrival(delivery=delivery, policy=NO_POLICY, problem=call)
        function, execution, headers, arguments, policy = call
        struck = self._struck(execution.function_name, execution.key, arguments)
        if struck:
            worker_logs.log_struck(execution, self._log_extra)
        else:
            self._calls[delivery.delivery_id] = (function, execution, headers)
        return Arrival(delivery=delivery, policy=policy, struck=struck)

    def _struck(self, function: str, key: str, arguments: Mapping[str, Any]) -> bool:
        strikes = self._strikes
        if strikes is not None and not strikes.empty and strikes.is_struck(function, arguments):
            return True
        if key in self._limits:
            runs = self._runs.get(key, 0)
            if runs >= self._limits[key]:
                return True
            self._runs[key] = runs + 1
        return False

    def _run_effect(self, effect: Effect) -> bool:
        """Carry out one runtime effect; whether it started a run (the timer
        is then rearmed once for the round)."""
        if isinstance(effect, StartTask):
            function, execution, headers = self._calls.pop(effect.delivery_id)
            self._runner.start(effect.delivery_id, function, execution, headers)
            return True
        if isinstance(effect, SeedPerpetuals):
            self._group.start_soon(self._seed_automatic)
        elif isinstance(effect, CancelTask):
            scope = self._scopes.get(effect.delivery_id)
            if scope is not None:
                self._stops[effect.delivery_id] = effect
                scope.cancel()
            elif effect.delivery_id in self._runner.waiting:
                self._stops[effect.delivery_id] = effect  # (its runner has not begun it)
        elif isinstance(effect, Blocked):
            logger.debug(blocked_message(effect.key, effect.outcome), extra=self._log_extra)
        elif isinstance(effect, Read):
            self._read = effect
            self._read_ready.set()
        return False

    async def _timer(self) -> None:
        """Tick the machine at its next deadline; woken early, look again."""
        machine = self._machine
        assert machine is not None
        while True:
            deadline = machine.next_deadline()
            self._armed_at = math.inf if deadline is None else deadline
            delay = self._armed_at - time.time()
            if delay > 0:
                with anyio.move_on_after(delay) as sleep:
                    await self._rearm.wait()
                self._rearm = anyio.Event()
                if not sleep.cancelled_caught:
                    continue  # rearmed: look again
            machine.receive(Tick(now=time.time()))
            self._dirty.set()

    def _rearm_timer(self) -> None:
        """Wake the timer if the machine's next deadline is now sooner (a
        later one only makes it wake early, and look again)."""
        machine = self._machine
        assert machine is not None
        deadline = machine.next_deadline()
        if deadline is not None and deadline < self._armed_at:
            self._rearm.set()

    async def _listener(self) -> None:
        machine = self._machine
        assert machine is not None
        while True:
            try:
                async with self.docket.adapter.cancellations() as keys:
                    self._listening.set()
                    async for key, generation in keys:
                        machine.receive(
                            CancelRequested(key=key, now=time.time(), generation=generation)
                        )
                        self._dirty.set()
            except StoreError as error:
                # a missed cancellation costs nothing: runs check their key on claim
                machine.counters[Count.STORE_ERRORS] += 1
                self._listening.set()
                logger.warning(
                    "cancellations unavailable (%s); listening again in %s",
                    error,
                    self.reconnection_delay,
                )
                await anyio.sleep(self.reconnection_delay.total_seconds())

    @property
    def _owns_signals(self) -> bool:
        """Whether this run handles SIGTERM and SIGINT (only the main thread may)."""
        return self.handle_signals and threading.current_thread() is threading.main_thread()

    async def _signals(self, signals: AsyncIterator[signal.Signals]) -> None:
        """The first stop signal drains the worker; the next stops it at once
        (``_drained`` gives up waiting, and ``_run`` abandons what still runs)."""
        async for signum in signals:
            again = self._stopping.is_set()
            log = logger.warning if again else logger.info
            log("worker %s got signal %s%s", self.name, signum, _SIGNALLED[again])
            if again:
                self._finished.set()
            else:
                self._health.draining()
                self._stopping.set()

    async def _drained(self) -> None:
        """Wait until the machine is quiet: its tasks ended and the store told.
        Once no task runs, the store gets two reconnection delays (at least
        ``STOP_GRACE``) and a read's wait more to take what is left: a call to
        a server that is gone may take a whole request timeout, or forever."""
        grace = max(2 * self.reconnection_delay.total_seconds(), STOP_GRACE)
        grace += self.minimum_check_interval.total_seconds()
        idle_since: float | None = None
        while not self._finished.is_set():
            with anyio.move_on_after(0.05):
                await self._finished.wait()
            if self._scopes or self._runner.jobs:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= grace:
                return

    def _abandon(self) -> None:
        """Stop without draining: send nothing more (the machine hands out
        nothing from here on, and the flusher goes first), and cancel the
        running tasks without recording their end; the store hands out again
        what this worker held once its leases lapse."""
        machine = self._machine
        assert machine is not None
        left = len(machine.in_flight)
        if machine.failed is None:
            # (first: a batch a loop takes after this, before it sees its
            # cancellation, holds nothing, nor does a cancelled run's end)
            machine.receive(AbandonRequested(now=time.time()))
        self._runner.close()  # (a runner a cancelled run frees takes nothing more)
        for scope in self._background:
            scope.cancel()
        for scope in self._scopes.values():
            scope.cancel()
        logger.warning(
            "worker %s stops without draining: %d tasks cancelled, %d deliveries left "
            "to redelivery",
            self.name,
            len(self._scopes),
            left,
        )

    async def _seed_automatic(self) -> None:
        """Add every automatic perpetual task under its own name as key."""
        try:
            for name, function in list(self.docket.tasks.items()):
                try:
                    policy = dependencies.task_policy(
                        function, name, self.docket.name, {}, self.dependencies
                    )
                except UsageError:
                    continue
                if policy.perpetual is not None and policy.perpetual.automatic:
                    # (an ``add``: a live chain is left alone)
                    when = first_run(policy.perpetual, time.time())
                    if when is not None:
                        await self.docket.add(name, when, key=name)()
        except StoreError as error:
            # the next re-seed tries again
            logger.warning("could not seed automatic perpetual tasks: %s", error)

    _strikes: StrikeList | None = None

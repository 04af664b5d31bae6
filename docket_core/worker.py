"""``Worker``: the anyio runtime that drives a ``WorkerMachine`` and runs tasks.

Four loops share one task group: the *reader* asks the store for deliveries
while the machine has capacity; the *flusher* drains the machine's effects,
hands all store effects of a round to the adapter in one call and feeds the
outcomes back; the *timer* sleeps until the machine's next deadline and ticks
it; the *listener* turns cancellation signals into inputs.  Task functions run
in their own cancel scopes, shielded from the worker's own cancellation so a
stopping worker drains them instead of killing them.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from functools import partial
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup

from . import dependencies, instrumentation
from .dependencies import ForcedRetry, TaskContext, resolve
from .docket import Docket
from .execution import Execution, to_datetime
from .sansio.effects import CancelTask, Effect, Read, SeedPerpetuals, StartTask, StoreEffect
from .sansio.errors import StoreError, StoreUnavailable, UsageError
from .sansio.flight import Count
from .sansio.inputs import (
    Arrival,
    CancelRequested,
    DeadlineExtended,
    ReadDone,
    ReadFailed,
    ReplyLost,
    ShutdownRequested,
    StoreFailed,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from .sansio.strikes import StrikeList
from .sansio.values import NO_POLICY, Delivery
from .sansio.worker import WorkerConfig, WorkerMachine
from .serialization import SignatureError, describe, dumps_value, loads_message

logger = logging.getLogger("docket.worker")

#: the signals that stop a worker (the second one at once), and what it says
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_SIGNALLED = {False: ": draining", True: " again: stopping"}

#: how often automatic perpetual tasks are added again, as pydocket does
RESEED_SECONDS = 60.0
#: the least a stopping worker whose tasks have ended waits for its store
STOP_GRACE = 1.0


class Worker:
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
    ) -> None:
        """``fallback_task`` runs (with the original arguments and full
        dependency injection) for messages naming a task this worker does not
        know; without one, such a message ends FAILED with the reason.
        ``scheduling_resolution`` is accepted for compatibility with pydocket:
        due tasks are promoted by every read, and a newly scheduled soonest task
        wakes the readers, so there is no separate scheduler loop to tune.

        A stopping worker waits for its running tasks as long as they take
        (``drain_timeout`` None, as pydocket) or up to ``drain_timeout``; then,
        or at a second SIGTERM/SIGINT, it cancels them without recording
        anything (the store hands them out again once their leases lapse; a
        sync task's thread cannot be cancelled: the worker waits for it)."""
        self.docket = docket
        self.drain_timeout = drain_timeout
        if fallback_task is not None:
            dependencies.validate(fallback_task)
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
        #: task name -> the metric labels of its runs here
        self._labels: dict[str, dict[str, str]] = {}
        self._runs: dict[str, int] = {}

    async def __aenter__(self) -> Worker:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    @property
    def counters(self) -> Mapping[str, int]:
        """What the worker has done so far (delivered, started, succeeded, ...,
        the values of ``Count``); a snapshot in which a count never reached
        reads as 0."""
        if self._machine is None:
            return Counter()
        return Counter({count.value: n for count, n in self._machine.counters.items()})

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
        **options: Any,
    ) -> None:
        """Open docket ``docket_name`` at ``url``, register the task
        collections named in ``tasks`` (``"module:attribute"``; the built-in
        tasks are always there), and run one worker on it until finished or
        stopped, optionally serving a healthcheck and Prometheus metrics.
        ``options`` are the worker's own (``name``, ``concurrency``...)."""
        fallback = None
        if fallback_task:
            module_name, _, attribute = fallback_task.partition(":")
            fallback = getattr(importlib.import_module(module_name), attribute)
        if metrics_port:
            instrumentation.serve_metrics(metrics_port)
        running = threading.Event()
        health = instrumentation.serve_healthcheck(healthcheck_port, running.is_set)
        try:
            async with Docket(name=docket_name, url=url) as docket:
                for collection in tasks:
                    docket.register_collection(collection)
                worker = cls(docket, fallback_task=fallback, **options)
                async with worker:
                    running.set()
                    if until_finished:
                        await worker.run_until_finished()
                    else:
                        await worker.run_forever()
        finally:
            running.clear()
            if health is not None:
                await anyio.to_thread.run_sync(health.shutdown)

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
        config = WorkerConfig(
            name=self.name,
            docket=self.docket.name,
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
        )
        machine = self._machine = WorkerMachine(config, time.time())
        instrumentation.watch(self)
        self._dirty = anyio.Event()
        self._rearm = anyio.Event()
        self._stopping = anyio.Event()
        self._finished = anyio.Event()
        #: the read the machine asked for (it asks for one at a time)
        self._read: Read | None = None
        self._read_ready = anyio.Event()
        self._scopes: dict[str, anyio.CancelScope] = {}
        #: delivery id -> the last ``CancelTask`` of its run
        self._stops: dict[str, CancelTask] = {}
        #: delivery id -> the function, the execution and the headers of its call
        self._calls: dict[str, tuple[Callable[..., Any], Execution, dict[str, str]]] = {}
        self._background: list[anyio.CancelScope] = []
        if self.schedule_automatic_tasks:
            await self._seed_automatic()
        async with anyio.create_task_group() as group:
            self._group = group
            self._spawn(group, self._flusher)
            self._spawn(group, self._timer)
            self._spawn(group, self._listener)
            self._spawn(group, self._reader)
            if threading.current_thread() is threading.main_thread():
                self._spawn(group, self._signals)
            try:
                machine.receive(Tick(now=time.time()))
                self._dirty.set()
                await self._stopping.wait()
            finally:
                with anyio.CancelScope(shield=True):
                    if machine.failed is None:  # (a failed machine takes nothing more)
                        machine.receive(ShutdownRequested(now=time.time()))
                    self._dirty.set()
                    drain = self.drain_timeout
                    with anyio.move_on_after(math.inf if drain is None else drain.total_seconds()):
                        await self._drained()
                    if not machine.quiet:
                        self._abandon()
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

        group.start_soon(shielded)

    async def _reader(self) -> None:
        """Carry out the machine's reads, one at a time: the strikes first (once
        read, deliveries must reach the machine), then the store's read."""
        machine = self._machine
        assert machine is not None
        adapter = self.docket.adapter
        while True:
            while self._read is None:
                await self._read_ready.wait()
                self._read_ready = anyio.Event()
            read, self._read = self._read, None
            try:
                self._strikes = await adapter.strikes()
                result = await adapter.read(
                    worker=read.worker,
                    count=read.count,
                    now=time.time(),
                    redelivery_timeout=read.redelivery_timeout,
                    block=read.block,
                    recover=read.recover,
                )
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
                done = ReadDone(
                    arrivals=arrivals,
                    next_due=result.next_due,
                    now=time.time(),
                    pending=pending,
                    malformed=malformed,
                )
                machine.receive(done)
            except StoreError as error:
                machine.receive(ReadFailed(now=time.time(), reason=str(error)))
                logger.warning(
                    "store unavailable (%s); reading again in %s", error, self.reconnection_delay
                )
            if machine.finished:
                self._stopping.set()
            self._dirty.set()
            self._rearm.set()

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
        message = delivery.message
        function = self.docket.tasks.get(message.function) or self.fallback_task
        if function is None:
            return Arrival(
                delivery=delivery,
                policy=NO_POLICY,
                problem=f"unknown task {message.function!r}: not registered on worker {self.name}",
            )
        try:
            args, kwargs, headers = loads_message(message.payload, self.docket.signing)
        except SignatureError as error:
            return Arrival(delivery=delivery, policy=NO_POLICY, problem=str(error))
        except Exception as error:
            return Arrival(
                delivery=delivery,
                policy=NO_POLICY,
                problem=f"the arguments could not be unpickled: {describe(error)}",
            )
        try:
            arguments = dependencies.bind_arguments(function, args, kwargs)
            policy = dependencies.task_policy(
                function, message.function, self.docket.name, arguments
            )
        except Exception as error:
            return Arrival(delivery=delivery, policy=NO_POLICY, problem=describe(error))
        struck = self._struck(message.function, message.key, arguments)
        execution = Execution(
            self.docket,
            function,
            args,
            kwargs,
            message.key,
            to_datetime(message.when),
            message.attempt,
            function_name=message.function,
            generation=message.generation,
            redelivered=delivery.redelivered,
        )
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

    async def _flusher(self) -> None:
        machine = self._machine
        assert machine is not None
        while True:
            await self._dirty.wait()
            self._dirty = anyio.Event()
            while effects := machine.effects():
                store: list[StoreEffect] = []
                for effect in effects:
                    if isinstance(effect, StoreEffect):
                        store.append(effect)
                    else:
                        self._run_effect(effect)
                if store:
                    try:
                        outcomes = await self.docket.adapter.execute(store)
                    except StoreError as error:
                        self._store_failed(store, error)
                        continue
                    machine.store_replied(store, outcomes, time.time())
                    if len(self._calls) > len(machine.in_flight):
                        # deliveries that ended without starting (struck,
                        # superseded, parked, lost) leave their calls behind
                        for delivery_id in [d for d in self._calls if d not in machine.in_flight]:
                            del self._calls[delivery_id]
            if machine.quiet:
                self._finished.set()
                return

    def _store_failed(self, effects: list[StoreEffect], error: StoreError) -> None:
        """Tell the machine a batch failed: it decides when to send it again,
        when to give it up, and when the worker must stop."""
        machine = self._machine
        assert machine is not None
        failure = ReplyLost if isinstance(error, StoreUnavailable) else StoreFailed
        now = time.time()
        machine.receive(failure(effects=tuple(effects), now=now, reason=str(error)))
        self._rearm.set()
        if machine.fatal is not None:
            logger.error("stopping: %s", machine.fatal)
            raise StoreError(machine.fatal) from error
        resend_at = machine.outbox.resend_at
        then = "given up" if resend_at is None else f"sent again in {resend_at - now:.3g}s"
        logger.warning("store unavailable (%s); %d effects %s", error, len(effects), then)

    def _run_effect(self, effect: Effect) -> None:
        if isinstance(effect, StartTask):
            self._group.start_soon(self._run_task, effect.delivery_id)
            self._rearm.set()
        elif isinstance(effect, SeedPerpetuals):
            self._group.start_soon(self._seed_automatic)
        elif isinstance(effect, CancelTask):
            scope = self._scopes.get(effect.delivery_id)
            if scope is not None:
                self._stops[effect.delivery_id] = effect
                scope.cancel()
        elif isinstance(effect, Read):
            self._read = effect
            self._read_ready.set()

    async def _timer(self) -> None:
        machine = self._machine
        assert machine is not None
        while True:
            deadline = machine.next_deadline()
            delay = math.inf if deadline is None else deadline - time.time()
            if delay > 0:
                with anyio.move_on_after(delay):
                    await self._rearm.wait()
                self._rearm = anyio.Event()
            machine.receive(Tick(now=time.time()))
            self._dirty.set()

    async def _listener(self) -> None:
        machine = self._machine
        assert machine is not None
        while True:
            try:
                async with self.docket.adapter.cancellations() as keys:
                    async for key, generation in keys:
                        machine.receive(
                            CancelRequested(key=key, now=time.time(), generation=generation)
                        )
                        self._dirty.set()
            except StoreError as error:
                # a missed cancellation costs nothing: runs check their key on claim
                machine.counters[Count.STORE_ERRORS] += 1
                logger.warning(
                    "cancellations unavailable (%s); listening again in %s",
                    error,
                    self.reconnection_delay,
                )
                await anyio.sleep(self.reconnection_delay.total_seconds())

    async def _signals(self) -> None:
        # asyncio resets a handler it removes to the default (SIGTERM then
        # kills the process while it closes its docket): put back what was there
        previous = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
        try:
            with anyio.open_signal_receiver(*_STOP_SIGNALS) as signals:
                async for signum in signals:
                    again = self._stopping.is_set()
                    log = logger.warning if again else logger.info
                    log("worker %s got signal %s%s", self.name, signum, _SIGNALLED[again])
                    (self._finished if again else self._stopping).set()
        finally:
            for signum, handler in previous.items():
                if handler is not None:
                    signal.signal(signum, handler)

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
            if self._scopes:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= grace:
                return

    def _abandon(self) -> None:
        """Stop without draining: send nothing more (the flusher goes first),
        and cancel the running tasks without recording their end; the store
        hands out again what this worker held once its leases lapse."""
        machine = self._machine
        assert machine is not None
        for scope in self._background:
            scope.cancel()
        for scope in self._scopes.values():
            scope.cancel()
        logger.warning(
            "worker %s stops without draining: %d tasks cancelled, %d deliveries left "
            "to redelivery",
            self.name,
            len(self._scopes),
            len(machine.in_flight),
        )

    async def _seed_automatic(self) -> None:
        """Add every automatic perpetual task under its own name as key."""
        try:
            for name, function in list(self.docket.tasks.items()):
                try:
                    policy = dependencies.task_policy(function, name, self.docket.name, {})
                except UsageError:
                    continue
                if policy.perpetual is not None and policy.perpetual.automatic:
                    await self.docket.add(name, key=name)()
        except StoreError as error:
            # the next re-seed tries again
            logger.warning("could not seed automatic perpetual tasks: %s", error)

    # -- running one task --------------------------------------------------------------

    async def _run_task(self, delivery_id: str) -> None:
        machine = self._machine
        assert machine is not None
        function, execution, headers = self._calls.pop(delivery_id)
        flight = machine.in_flight[delivery_id]
        outcome = TaskOutcome.SUCCEEDED
        error: str | None = None
        result: bytes | None = None
        follow_up = None
        execution.state = execution.state.RUNNING
        execution.worker = self.name

        def on_deadline(deadline: float) -> None:
            machine.receive(DeadlineExtended(delivery_id=delivery_id, deadline=deadline))
            self._rearm.set()

        context = TaskContext(
            docket=self.docket,
            worker=self,
            execution=execution,
            function_name=execution.function_name,
            args=execution.args,
            kwargs=execution.kwargs,
            now=time.time,
            deadline=flight.deadline,
            on_deadline_change=on_deadline,
            report_progress=partial(_report, self.docket, execution.key, execution.generation),
        )
        labels = self._labels.get(execution.function_name)
        if labels is None:
            labels = self._labels[execution.function_name] = {
                "docket.name": self.docket.name,
                "docket.worker": self.name,
                "docket.task": execution.function_name,
            }
        started = time.time()
        metering = instrumentation.metering()
        if metering:
            lateness = max(started - execution.when.timestamp(), 0.0)
            instrumentation.TASK_PUNCTUALITY.record(lateness, labels)
        # shielded: a stopping worker drains its tasks; only CancelTask cancels them
        scope = anyio.CancelScope(shield=True)
        self._scopes[delivery_id] = scope
        with instrumentation.task_span(execution, headers, labels) as span:
            with scope:
                try:
                    async with resolve(function, context) as call:
                        try:
                            if inspect.iscoroutinefunction(function):
                                value = await function(*call.args, **call.kwargs)
                            else:
                                # a thread cannot be interrupted: a timed-out or
                                # cancelled sync task ends when it returns, and only
                                # then is its slot released or its retry scheduled
                                value = await anyio.to_thread.run_sync(
                                    partial(function, *call.args, **call.kwargs)
                                )
                            if value is not None and self.docket.execution_ttl.total_seconds() > 0:
                                result = dumps_value(value, self.docket.signing)
                                if result is None:
                                    raise TypeError(
                                        f"the result of {execution.function_name} "
                                        f"({type(value).__name__}) cannot be pickled"
                                    )
                        except ForcedRetry as forced:
                            outcome, error = TaskOutcome.FAILED, describe(forced)
                            follow_up = call.follow_up(time.time(), forced)
                        except BaseException as failure:
                            if _docket_cancelled(failure, scope):
                                raise
                            outcome = TaskOutcome.FAILED
                            error, result = self._task_failed(
                        execution, failure, span, f"{execution.call_repr()} failed"
                    )
                        if follow_up is None:
                            follow_up = call.follow_up(time.time())
                except BaseException as failure:
                    if _docket_cancelled(failure, scope):
                        raise
                    outcome = TaskOutcome.FAILED
                    what = f"{execution.function_name} failed in a dependency"
                    error, result = self._task_failed(execution, failure, span, what)
            stop = self._stops.pop(delivery_id, None)
            if scope.cancelled_caught:
                instrumentation.interrupted(span, stop.reason.value if stop else None)
        if metering:
            instrumentation.TASK_DURATION.record(time.time() - started, labels)
        if scope.cancelled_caught:
            # the core decides what a stopped run records: here only the
            # exception it asked to keep is pickled
            outcome, error, result = TaskOutcome.CANCELLED, None, None
            if stop is not None and stop.result is not None:
                result = dumps_value(stop.result.exception(), self.docket.signing)
        self._scopes.pop(delivery_id, None)
        machine.receive(
            TaskEnded(
                delivery_id=delivery_id,
                now=time.time(),
                outcome=outcome,
                error=error,
                result=result,
                follow_up=follow_up,
            )
        )
        self._dirty.set()

    def _task_failed(
        self, execution: Execution, failure: BaseException, span: Any, what: str
    ) -> tuple[str, bytes | None]:
        """Record what a task raised: any exception, even one that would stop
        a program (``SystemExit``, ``KeyboardInterrupt``: the run fails, then
        the worker stops after draining) or a cancellation docket did not
        cause.  Returns the error text and the pickled exception, if it pickles."""
        error = describe(failure)
        instrumentation.failed(span, failure)
        logger.warning("%s: %s", what, error)
        if isinstance(failure, SystemExit | KeyboardInterrupt):
            logger.error(
                "%s raised %s: worker %s stops after draining",
                execution.function_name,
                type(failure).__name__,
                self.name,
            )
            self._stopping.set()
        return error, dumps_value(failure, self.docket.signing)

    _strikes: StrikeList | None = None


def _docket_cancelled(failure: BaseException, scope: anyio.CancelScope) -> bool:
    """Whether ``failure`` is the cancellation docket asked for (a
    ``CancelTask``): the run's scope takes it.  Any other is the task's own."""
    return scope.cancel_called and isinstance(failure, anyio.get_cancelled_exc_class())


async def _report(docket: Docket, key: str, generation: int, **changes: Any) -> Any:
    return await docket.adapter.report_progress(
        key, now=time.time(), generation=generation, **changes
    )

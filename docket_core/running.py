"""Running task functions: ``Runner``, the worker's pool of runner tasks.

The worker's loops decide nothing about a run: the core (``WorkerMachine``)
says when a delivery starts (``StartTask``) and when it must stop
(``CancelTask``).  ``Runner.start`` queues a start, and a runner task carries
it out: it resolves the task's dependencies, calls the function, records
metrics and the span, logs the run's lines (``worker_logs``) and reports how
it ended (``TaskEnded``); then it takes the next start queued, or waits idle.

Starts are handed over in a chain: a runner task that takes a start while
more are queued calls one more runner (waking an idle one, or starting a
task when none is idle), unless one is called already.  A start that runs
to its end without waiting (a short task) is followed by the next one in the
same runner task, with no wake-up at all; one that waits lets the called
runner take the next.  So a batch of short starts costs one or two
wake-ups, not one each, and a batch of long ones starts each as soon as the
one before it waits, as a wake-up each would.

Runner tasks are shielded from the worker's own cancellation (a stopping
worker drains its tasks).  Each runs its calls inside one cancel scope, kept
from run to run until a ``CancelTask`` cancels it (it only ever does while
that run is the one running): that run ends cancelled and the runner opens a
fresh scope.  So a run pays for no task, no cancel scope and no wake-up beyond
handing it over.  A run that leaves a context variable set (a task binding
log context and never resetting it) retires its runner task, so the next run
starts from a clean context, as it would in a task of its own.

How a run ends:

- the function returned: it succeeded, even if it caught and swallowed the
  cancellation docket sent it (as pydocket records it: ``completed``);
- it raised anything (an ``Exception``, a ``TimeoutError`` of its own, even
  ``SystemExit``): it failed, and the core decides on a retry;
- a dependency failed to resolve: it failed with pydocket's
  ``ExceptionGroup`` (``Failed to resolve dependencies for parameter(s): ...``);
- the cancellation docket asked for reached the scope: it was cancelled,
  and the core decides what that records (a timeout fails the run).

``decode`` turns a delivery into the call it asks for and its policy;
``loop_options`` names the event loops a worker runs on (``Worker.run_sync``);
``frozen_heap`` keeps the objects that were there before a worker started
out of the garbage collector's passes while it runs (``Worker(freeze_gc=True)``).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import importlib
import inspect
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from . import instrumentation, worker_logs
from ._calls import LazyArguments
from ._run_resolution import resolve_in_runner
from .dependencies import (
    Dependency,
    ForcedRetry,
    TaskContext,
    current_docket,
    current_worker,
    task_policy,
)
from .execution import Execution, to_datetime
from .outcomes import blocked_follow_up, blocked_line
from .partition_parts import spanning_limits
from .sansio.decisions import may_retry
from .sansio.effects import CancelTask
from .sansio.errors import UsageError
from .sansio.inputs import DeadlineExtended, TaskEnded, TaskOutcome
from .sansio.values import Delivery, ExecutionState, TaskPolicy
from .sansio.worker import WorkerMachine
from .serialization import SignatureError, describe, dumps_value, loads_message

if TYPE_CHECKING:
    from .docket import Docket
    from .worker import Worker

__all__ = ["LOOPS", "Runner", "decode", "frozen_heap", "loop_options"]

#: one started delivery: its id, the function, the execution and the call's headers
Job = tuple[str, Callable[..., Any], Execution, dict[str, str]]


class Runner:
    """Runs the task functions of one worker run (one ``Worker._run``).

    It shares two tables with the worker: ``scopes`` (delivery id -> the
    cancel scope its run is in, which a ``CancelTask`` cancels) and ``stops``
    (delivery id -> the ``CancelTask`` that did).  ``wake`` tells the
    worker's flusher the machine has effects, ``rearm`` its timer that a
    deadline changed, ``stop_worker`` asks the worker to stop after
    draining, and ``spawn`` starts a runner task (shielded, in the worker's
    task group)."""

    def __init__(
        self,
        worker: Worker,
        machine: WorkerMachine,
        *,
        scopes: dict[str, anyio.CancelScope],
        stops: dict[str, CancelTask],
        wake: Callable[[], None],
        rearm: Callable[[], None],
        stop_worker: Callable[[], None],
        spawn: Callable[[Callable[[], Awaitable[None]]], None],
    ) -> None:
        self.worker = worker
        self.docket: Docket = worker.docket
        self.machine = machine
        self.scopes = scopes
        self.stops = stops
        self.wake = wake
        self.rearm = rearm
        self.stop_worker = stop_worker
        self.spawn = spawn
        #: the ``extra`` fields of every log line of this worker
        self.log_extra = worker_logs.worker_extra(self.docket.name, worker.name)
        #: task name -> the metric labels of its runs here
        self.labels: dict[str, dict[str, str]] = {}
        #: the starts queued for a runner task, oldest first
        self.jobs: deque[Job] = deque()
        #: the waiters of the idle runner tasks (an asyncio future, or an
        #: ``anyio.Event`` on other loops), the last one to finish first
        self.idle: list[Any] = []
        #: runner tasks called (woken or started) that have not looked at
        #: ``jobs`` yet
        self.called = 0
        #: the worker stops (``close``): nothing more starts
        self.closed = False
        #: the runs handed to a runner task that has not begun them yet (a
        #: ``CancelTask`` for one is kept in ``stops`` until it does)
        self.waiting: set[str] = set()
        #: function -> whether it is a coroutine function (asked once)
        self._awaitable: dict[Callable[..., Any], bool] = {}
        try:
            # on asyncio a bare future is the cheapest way to wake a runner
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def _labels(self, function_name: str) -> dict[str, str]:
        labels = self.labels.get(function_name)
        if labels is None:
            labels = self.labels[function_name] = {
                "docket.name": self.docket.name,
                "docket.worker": self.worker.name,
                "docket.task": function_name,
            }
        return labels

    # -- the runner tasks ------------------------------------------------------------

    def start(
        self,
        delivery_id: str,
        function: Callable[..., Any],
        execution: Execution,
        headers: dict[str, str],
    ) -> None:
        """Queue a started delivery's run, and call a runner task for it
        unless one is called already."""
        if self.closed:
            return  # (abandoned: the store hands it out again)
        self.waiting.add(delivery_id)
        self.jobs.append((delivery_id, function, execution, headers))
        if not self.called:
            self._call()

    def close(self) -> None:
        """The worker stops (``Worker._abandon`` first, when it stops without
        draining): the starts still queued are abandoned with the rest (the
        store hands them out again), and no runner task is called or started
        any more."""
        self.closed = True
        self.jobs.clear()

    def _call(self) -> None:
        """Wake an idle runner task, or start one more when none is idle."""
        if self.closed:
            return
        self.called += 1
        idle = self.idle
        while idle:
            waiter = idle.pop()
            if self._loop is None:
                waiter.set()
                return
            if not waiter.done():  # (else its runner is being cancelled: stopping)
                waiter.set_result(None)
                return
        self.spawn(self._serve)

    async def _serve(self) -> None:
        """One runner task: run the queued starts, one after another, waiting
        idle while there are none.

        Its runs share a cancel scope until a ``CancelTask`` cancels one (the
        scope is then spent: the next run gets a fresh one)."""
        self.called -= 1  # (a new task answers the call that started it)
        # (set once for the task's runs: a run sets only ``current_execution``)
        current_docket.set(self.docket)
        current_worker.set(self.worker)
        clean = contextvars.copy_context()
        while True:
            with anyio.CancelScope() as scope:
                while True:
                    if await self._run(await self._take(), scope):
                        break  # (the scope was cancelled: it is spent)
                    if contextvars.copy_context() != clean:
                        break  # the run left context behind: the next one gets a new task
            if contextvars.copy_context() != clean:
                # (a runner that retires hands the starts queued on)
                if self.jobs and not self.called:
                    self._call()
                return

    async def _take(self) -> Job:
        """The oldest queued start, once there is one; a start left queued
        behind it gets a runner called for it."""
        jobs = self.jobs
        while not jobs:
            await self._idle()
        job = jobs.popleft()
        if jobs and not self.called:
            self._call()
        return job

    async def _idle(self) -> None:
        """Wait, idle, until ``_call`` wakes this runner task."""
        idle = self.idle
        waiter: Any
        if self._loop is not None:
            waiter = self._loop.create_future()
            idle.append(waiter)
            wait = waiter
        else:
            waiter = anyio.Event()
            idle.append(waiter)
            wait = waiter.wait()
        try:
            await wait
        except BaseException:
            # (cancelled: the worker stops; the starts still queued are
            # abandoned with the rest, and the store hands them out again)
            if waiter in idle:
                idle.remove(waiter)
            raise
        self.called -= 1

    # -- one run ---------------------------------------------------------------------

    async def _run(self, job: Job, scope: anyio.CancelScope) -> bool:
        """Run the task function of one started delivery in ``scope`` and
        report its end.  The cancellation a ``CancelTask`` sends ``scope``
        ends the run here; any other exception is the run's failure.
        Returns whether docket cancelled ``scope`` (it is then spent)."""
        delivery_id, function, execution, headers = job
        self.waiting.discard(delivery_id)
        machine = self.machine
        docket = self.docket
        flight = machine.in_flight[delivery_id]
        outcome = TaskOutcome.SUCCEEDED
        error: str | None = None
        result: bytes | None = None
        follow_up = None
        failure: BaseException | None = None
        returned = False
        cancelled = False
        function_name = execution.function_name
        execution.state = ExecutionState.RUNNING
        execution.worker = self.worker.name

        labels = self._labels(function_name)
        started = time.time()
        punctuality = started - execution.when.timestamp()
        metering = instrumentation.metering()
        if metering:
            instrumentation.TASK_PUNCTUALITY.record(max(punctuality, 0.0), labels)
        # (a run stopped before it began never starts: no start line)
        stopped_first = delivery_id in self.stops
        line = (
            None if stopped_first else worker_logs.log_start(execution, self.log_extra, punctuality)
        )
        awaitable = self._awaitable.get(function)
        if awaitable is None:
            awaitable = self._awaitable[function] = inspect.iscoroutinefunction(function)
        self.scopes[delivery_id] = scope
        with instrumentation.task_span(execution, headers, labels) as span:
            resolving = True
            try:
                if stopped_first:
                    # stopped before it began (its start and its stop came
                    # in one round): it ends cancelled without running
                    scope.cancel()
                    await anyio.lowlevel.checkpoint()
                make_context = partial(self._task_context, delivery_id, execution, flight.deadline)
                async with resolve_in_runner(
                    function, execution, make_context, self.worker.dependencies
                ) as call:
                    resolving = False
                    try:
                        if call.runtime is not None:  # (a custom ``Runtime``)
                            value = await call.runtime.run(
                                execution, function, call.args, call.kwargs
                            )
                        elif awaitable:
                            value = await function(*call.args, **call.kwargs)
                        else:
                            # a thread cannot be interrupted: a timed-out or
                            # cancelled sync task ends when it returns, and only
                            # then is its slot released or its retry scheduled
                            value = await anyio.to_thread.run_sync(
                                partial(function, *call.args, **call.kwargs)
                            )
                        returned = True
                        if value is not None and docket.execution_ttl.total_seconds() > 0:
                            result = dumps_value(value, docket.signing)
                            if result is None:
                                raise TypeError(
                                    f"the result of {function_name} "
                                    f"({type(value).__name__}) cannot be pickled"
                                )
                    except ForcedRetry as forced:
                        outcome, error, failure = TaskOutcome.FAILED, describe(forced), forced
                    except BaseException as raised:
                        if _docket_cancelled(raised, scope):
                            raise
                        outcome, failure = TaskOutcome.FAILED, raised
                        error, result = self._failed(execution, raised, span)
                    # (the custom handlers, ``extensions``, have their say here)
                    follow_up = await call.settle(
                        execution,
                        started=started,
                        result=value if returned else None,
                        error=failure,
                        retrying=_retrying(flight.policy, execution.attempt),
                    )
            except BaseException as raised:
                if _docket_cancelled(raised, scope):
                    # a function that returned ended as it did, even if what
                    # followed (its dependencies' cleanup) was cut short
                    cancelled = not returned
                else:
                    outcome, failure = TaskOutcome.FAILED, raised
                    error, result = self._failed(execution, raised, span, resolving)
                    follow_up = blocked_follow_up(raised, time.time())
            stop = self.stops.pop(delivery_id, None)
            if follow_up is not None and follow_up.blocked is not None and not cancelled:
                # an ``AdmissionBlocked``: no failure to log, the core settles it
                worker_logs.logger.debug(
                    blocked_line(execution.key, follow_up), extra=self.log_extra
                )
                line = failure = None
            if cancelled:
                instrumentation.interrupted(span, stop.reason.value if stop else None)
        duration = time.time() - started
        if metering:
            instrumentation.TASK_DURATION.record(duration, labels)
        if cancelled:
            # the core decides what a stopped run records: here only the
            # exception it asked to keep is pickled
            outcome, error, result, failure = TaskOutcome.CANCELLED, None, None, None
            if stop is not None and stop.result is not None:
                failure = stop.result.exception()
                result = dumps_value(failure, docket.signing)
        self.scopes.pop(delivery_id, None)
        logged = line is not None or failure is not None or cancelled
        machine.receive(
            TaskEnded(
                delivery_id=delivery_id,
                now=time.time(),
                outcome=outcome,
                error=error,
                result=result,
                follow_up=follow_up,
                started_at=started,
            )
        )
        self.wake()
        if logged:
            worker_logs.log_end(
                line,
                execution,
                self.log_extra,
                punctuality,
                duration,
                rescheduled=machine.rescheduled,
                failure=failure,
                interrupted=_interruption(stop) if cancelled and failure is None else None,
            )
        # (abandoning cancels a scope without a stop; the runner ends then anyway)
        return cancelled or stop is not None

    def _task_context(
        self, delivery_id: str, execution: Execution, deadline: float | None
    ) -> TaskContext:
        """What the dependencies of one run may draw on (made only for a
        function that declares some, or when the worker adds its own)."""
        machine = self.machine
        docket = self.docket

        def on_deadline(deadline: float) -> None:
            machine.receive(DeadlineExtended(delivery_id=delivery_id, deadline=deadline))
            self.rearm()

        return TaskContext(
            docket=docket,
            worker=self.worker,
            execution=execution,
            function_name=execution.function_name,
            args=execution.args,
            kwargs=execution.kwargs,
            now=time.time,
            deadline=deadline,
            on_deadline_change=on_deadline,
            report_progress=partial(_report, docket, execution.key, execution.generation),
        )

    def _failed(
        self,
        execution: Execution,
        failure: BaseException,
        span: Any,
        resolving: bool = False,
    ) -> tuple[str, bytes | None]:
        """Record what a run raised: any exception, even one that would stop
        a program (``SystemExit``, ``KeyboardInterrupt``: the run fails, then
        the worker stops after draining) or a cancellation docket did not
        cause.  Returns the error text and the pickled exception, if it pickles."""
        error = describe(failure)
        if resolving and isinstance(failure, ExceptionGroup):
            # the causes too: the group's own text only counts them
            error += ": " + "; ".join(describe(cause) for cause in failure.exceptions)
        instrumentation.failed(span, failure)
        if isinstance(failure, SystemExit | KeyboardInterrupt):
            worker_logs.logger.error(
                "%s raised %s: worker %s stops after draining",
                execution.function_name,
                type(failure).__name__,
                self.worker.name,
            )
            self.stop_worker()
        return error, dumps_value(failure, self.docket.signing)


#: a delivery decoded: its function, execution, call headers, bound arguments, policy
Call = tuple[Callable[..., Any], Execution, dict[str, str], Mapping[str, Any], TaskPolicy]


def decode(
    docket: Docket,
    delivery: Delivery,
    fallback: Callable[..., Any] | None,
    worker_name: str,
    worker_dependencies: Mapping[str, Dependency],
) -> Call | str:
    """The call a delivery asks for and its policy (pure work, no store), or
    why it cannot run: an unknown task (without a ``fallback``), a payload
    that does not unpickle or verify, arguments that do not bind."""
    message = delivery.message
    function = docket.tasks.get(message.function) or fallback
    if function is None:
        return f"unknown task {message.function!r}: not registered on worker {worker_name}"
    try:
        args, kwargs, headers = loads_message(message.payload, docket.signing)
    except SignatureError as error:
        return str(error)
    except Exception as error:
        return f"the arguments could not be unpickled: {describe(error)}"
    try:
        # (bound by name only if a per-call dependency or a strike reads them)
        arguments = LazyArguments(function, args, kwargs)
        policy = task_policy(
            function, message.function, docket.name, arguments, worker_dependencies
        )
        if docket.partitions > 1:  # a limit spans the partitions
            policy = spanning_limits(policy, docket.name)
    except Exception as error:
        return describe(error)
    execution = Execution(
        docket,
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
    return function, execution, headers, arguments, policy


def _retrying(policy: TaskPolicy, attempt: int) -> bool:
    """Whether a failure of attempt ``attempt`` will be retried by the core."""
    return policy.retry is not None and may_retry(policy.retry, attempt)


def _docket_cancelled(failure: BaseException, scope: anyio.CancelScope) -> bool:
    """Whether ``failure`` is the cancellation docket asked for (a
    ``CancelTask``): the run's scope takes it.  Any other is the task's own."""
    return scope.cancel_called and isinstance(failure, anyio.get_cancelled_exc_class())


def _interruption(stop: CancelTask | None) -> str:
    """Why a run was stopped, for its end line."""
    return "abandoned" if stop is None else stop.reason.value


async def _report(docket: Docket, key: str, generation: int, **changes: Any) -> Any:
    return await docket.adapter.report_progress(
        key, now=time.time(), generation=generation, **changes
    )


# -- the event loop ----------------------------------------------------------------------

#: the event loops a worker runs on, by name: the standard library's asyncio
#: loop, asyncio on uvloop (the ``uvloop`` extra), trio
LOOPS = ("asyncio", "uvloop", "trio")


def loop_options(loop: str) -> dict[str, Any]:
    """``anyio.run``'s keyword arguments for the event loop named ``loop``
    (``LOOPS``); asking for uvloop without it installed says how to get it."""
    if loop == "uvloop":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError as error:
            raise UsageError(
                f"the uvloop event loop needs the uvloop extra: pip install 'docket[uvloop]' "
                f"({error})"
            ) from error
        return {"backend": "asyncio", "backend_options": {"loop_factory": uvloop.new_event_loop}}
    if loop not in LOOPS:
        raise UsageError(f"unknown event loop {loop!r}: one of {', '.join(LOOPS)}")
    return {"backend": loop}


#: how many young objects (allocations less deallocations) start a collection
#: while the heap is frozen (Python's default: 700)
YOUNG_THRESHOLD = 10_000


@contextmanager
def frozen_heap(enabled: bool) -> Iterator[None]:
    """While the block runs, keep every object that was there when it began
    out of the garbage collector's passes (``gc.freeze``, after a
    collection of the young generations), and hand them back to it at the
    end (``gc.unfreeze``).

    A worker allocates a few short-lived objects a task, so the collector
    runs often, and its full passes walk the whole heap: the program's
    modules and the application's objects, which a worker keeps to the end.
    Frozen, those passes walk only what the worker made since (a 50,000-task
    drain spends a few ms on them instead of about 100 ms in pauses of 25 to
    40 ms).  Young objects are collected every ``YOUNG_THRESHOLD``
    allocations (net of deallocations) instead of 700: most of a worker's die
    before a pass sees them, which saves about 1 µs of CPU a task in a
    no-op drain.  The cost: a reference cycle among the frozen objects that
    becomes garbage while the block runs is collected only after it (objects
    without cycles are freed as always), and so is one that was garbage
    already in the oldest generation when it began: a full collection there
    would walk the whole heap, 20-30 ms of CPU before the first task starts,
    while one of the young generations takes well under a millisecond.
    Young cycles wait a little longer.  Freezing and the threshold are
    process-wide: the first of two such blocks to end unfreezes for both,
    the last one puts the threshold back (unless someone else changed it
    meanwhile)."""
    if not enabled:
        yield
        return
    gc.collect(1)
    gc.freeze()
    if not _THRESHOLDS:
        threshold = gc.get_threshold()
        gc.set_threshold(*_raised(threshold))
        _THRESHOLDS.append(threshold)
    else:
        _THRESHOLDS.append(_THRESHOLDS[0])
    try:
        yield
    finally:
        threshold = _THRESHOLDS.pop()
        if not _THRESHOLDS and gc.get_threshold() == _raised(threshold):
            gc.set_threshold(*threshold)
        gc.unfreeze()


def _raised(threshold: tuple[int, int, int]) -> tuple[int, int, int]:
    """The thresholds while a heap is frozen: the young one at least
    ``YOUNG_THRESHOLD`` (unless it is 0: automatic collection is off, and stays off)."""
    young, middle, old = threshold
    return (max(young, YOUNG_THRESHOLD) if young else 0, middle, old)


#: the collector's thresholds before the first frozen heap still open, once per one open
_THRESHOLDS: list[tuple[int, int, int]] = []

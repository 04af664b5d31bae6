"""``Docket``: the client API for scheduling, cancelling and inspecting tasks."""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import attrs

from . import instrumentation
from ._calls import TaskFunction, pending_call, resolve_task, settle, struck, uuid7
from .adapter import StorageAdapter, adapter_for_url
from .dependencies import validate
from .execution import Execution, TaskCall, to_datetime
from .instrumentation import TASKS_CANCELLED, producer_span, trace_headers
from .lua.base import ScriptedStore
from .partition_parts import settle_layout
from .partitioned import PartitionedStore
from .sansio.decisions import is_live, liveness_window, plan_add
from .sansio.effects import Cancel
from .sansio.errors import UsageError
from .sansio.strikes import Operator
from .sansio.values import DeadLetter, MalformedEntry, ScheduleMode
from .serialization import Signing, SigningKeys
from .strikelist import LiteralOperator, Restore, Strike, StrikeList, instruction_for

if TYPE_CHECKING:
    from .batch import Batch

P = ParamSpec("P")
R = TypeVar("R")


@attrs.frozen(slots=True, kw_only=True)
class RunningExecution:
    """A task some worker runs right now."""

    execution: Execution
    worker: str
    started: datetime

    @property
    def key(self) -> str:
        return self.execution.key

    @property
    def function_name(self) -> str:
        return self.execution.function_name

    @property
    def when(self) -> datetime:
        return self.execution.when

    @property
    def attempt(self) -> int:
        return self.execution.attempt


@attrs.frozen(slots=True, kw_only=True)
class WorkerInfo:
    name: str
    last_seen: datetime
    tasks: set[str]


@attrs.frozen(slots=True, kw_only=True)
class DocketSnapshot:
    """The docket at one moment.  ``future`` and ``running`` list at most a
    page of tasks each (``Docket.snapshot(limit=...)``); ``total_tasks``
    counts all of them, whatever the page shows."""

    taken: datetime
    total_tasks: int
    future: list[Execution]
    running: list[RunningExecution]
    workers: list[WorkerInfo]
    #: how many tasks are scheduled or queued, and how many run, in all
    future_total: int = 0
    running_total: int = 0
    #: queue entries that are not messages (the next worker to read them
    #: moves them to the dead letters)
    malformed: list[MalformedEntry] = attrs.field(factory=list)
    #: how many malformed messages were set aside (``Docket.dead_letters()``)
    dead_letters: int = 0

    @property
    def complete(self) -> bool:
        """Whether the lists show every task."""
        return len(self.future) + len(self.running) >= self.total_tasks


class Docket:
    """A named set of tasks on one store, shared by every producer and worker."""

    def __init__(
        self,
        name: str = "docket",
        url: str | None = None,
        heartbeat_interval: timedelta = timedelta(seconds=2),
        missed_heartbeats: int = 5,
        execution_ttl: timedelta = timedelta(minutes=15),
        *,
        adapter: StorageAdapter | None = None,
        signing_key: SigningKeys | None = None,
        partitions: int = 1,
    ) -> None:
        """``signing_key`` (one key or a list: the first signs, all verify;
        without one, the comma-separated keys of ``DOCKET_SIGNING_KEY``) signs
        every payload the docket pickles and rejects any it did not sign;
        without keys, payloads are plain pickles (see "Signed payloads" in
        the README).  ``partitions`` spreads the docket over that many
        queues, each under its own hash tag (the shards of a cluster;
        ``docket_core.partitioned``); a docket holding tasks keeps its count."""
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise UsageError(f"partitions must be a whole number of at least 1, not {partitions!r}")
        self.partitions = partitions
        self.name = name
        self.url = url or os.environ.get("DOCKET_URL") or "memory://"
        self.heartbeat_interval = heartbeat_interval
        self.missed_heartbeats = missed_heartbeats
        self.execution_ttl = execution_ttl
        self.adapter: StorageAdapter = adapter or adapter_for_url(self.url, name)
        if partitions > 1:
            self.adapter = PartitionedStore(self.adapter, partitions)
        #: the keys payloads are signed and verified with (``None``: unsigned)
        self.signing = Signing.resolve(signing_key)
        if isinstance(self.adapter, ScriptedStore | PartitionedStore):
            self.adapter.signing = self.signing  # it pickles the strikes
        #: the docket's strikes, as of its last look at the store
        self.strike_list = StrikeList(name=name, adapter=self.adapter)
        self.tasks: dict[str, TaskFunction] = {}
        self._opened = False
        from .tasks import standard_tasks

        for task in standard_tasks:
            self.register(task)

    async def __aenter__(self) -> Docket:
        if self._opened:
            raise UsageError("a Docket is not re-entrant")
        await self.adapter.open()
        try:
            if self.partitions == 1:
                # (a partitioned store settles its count as it opens) a docket
                # recorded with N partitions whose tasks wait there: refused
                await settle_layout(self.adapter, 1)
            await self.strike_list.refresh()
        except BaseException:
            await self.adapter.close()
            raise
        self._opened = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._opened = False
        await self.adapter.close()

    def labels(self) -> Mapping[str, str]:
        """The docket's telemetry attributes."""
        return {"docket.name": self.name}

    # -- registry ----------------------------------------------------------------

    def register(self, function: TaskFunction, names: Iterable[str] | None = None) -> None:
        """Make ``function`` runnable by workers under its name (or ``names``)."""
        validate(function)
        for name in names or [function.__name__]:
            self.tasks[name] = function

    def register_collection(self, path: str) -> None:
        """Register every function of ``"module:attribute"`` (an iterable)."""
        module_name, _, attribute = path.partition(":")
        if not attribute:
            raise UsageError(f"expected 'module:attribute', got {path!r}")
        module = importlib.import_module(module_name)
        for function in getattr(module, attribute):
            self.register(function)

    # -- scheduling ------------------------------------------------------------------

    @overload
    def add(
        self,
        function: Callable[P, Awaitable[R]],
        when: datetime | None = None,
        key: str | None = None,
    ) -> Callable[P, Awaitable[Execution]]: ...

    @overload
    def add(
        self,
        function: Callable[P, R],
        when: datetime | None = None,
        key: str | None = None,
    ) -> Callable[P, Awaitable[Execution]]: ...

    @overload
    def add(
        self, function: str, when: datetime | None = None, key: str | None = None
    ) -> Callable[..., Awaitable[Execution]]: ...

    def add(
        self,
        function: TaskFunction | str,
        when: datetime | None = None,
        key: str | None = None,
    ) -> Callable[..., Awaitable[Execution]]:
        """Schedule a call: ``await docket.add(fn, when, key)(*args, **kwargs)``.

        With a ``key`` that is already scheduled, queued or running, nothing
        changes and the execution says ``ALREADY_SCHEDULED``."""
        task, name = resolve_task(self, function)

        async def scheduler(*args: Any, **kwargs: Any) -> Execution:
            return await self._schedule(task, name, when, key, ScheduleMode.ADD, args, kwargs)

        return scheduler

    @overload
    def replace(
        self,
        function: Callable[P, Awaitable[R]],
        when: datetime,
        key: str,
    ) -> Callable[P, Awaitable[Execution]]: ...

    @overload
    def replace(
        self,
        function: Callable[P, R],
        when: datetime,
        key: str,
    ) -> Callable[P, Awaitable[Execution]]: ...

    @overload
    def replace(
        self, function: str, when: datetime, key: str
    ) -> Callable[..., Awaitable[Execution]]: ...

    def replace(
        self, function: TaskFunction | str, when: datetime, key: str
    ) -> Callable[..., Awaitable[Execution]]:
        """Schedule a call under ``key``, superseding whatever is live there."""
        task, name = resolve_task(self, function)

        async def scheduler(*args: Any, **kwargs: Any) -> Execution:
            return await self._schedule(task, name, when, key, ScheduleMode.REPLACE, args, kwargs)

        return scheduler

    async def _schedule(
        self,
        task: TaskFunction,
        name: str,
        when: datetime | None,
        key: str | None,
        mode: ScheduleMode,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Execution:
        key = key or uuid7()  # now, so the span can name it
        operation = "add" if mode is ScheduleMode.ADD else "replace"
        attributes = {"docket.task": name, "docket.key": key}
        with producer_span(operation, self.name, attributes) as span:
            strikes = await self.adapter.strikes()
            now = time.time()
            execution, call = pending_call(
                self,
                task,
                name,
                when=when,
                key=key,
                mode=mode,
                args=args,
                kwargs=kwargs,
                headers=trace_headers(span),
                now=now,
            )
            effect = plan_add(call, strikes, now=now)
            if effect is None or self.strike_list.meets_condition(execution):
                return struck(execution)
            (outcome,) = await self.adapter.execute([effect])
        settle(execution, outcome)
        return execution

    async def schedule(self, execution: Execution) -> None:
        """Add ``execution`` as built (its function, arguments, key and
        ``when``), as ``add`` would; it learns its disposition and state."""
        function = execution.function or execution.function_name
        added = await self.add(function, when=execution.when, key=execution.key)(
            *execution.args, **execution.kwargs
        )
        execution.disposition, execution.state = added.disposition, added.state
        execution._generation = added.generation

    @overload
    def call(
        self,
        function: Callable[P, Awaitable[R]],
        when: datetime | None = None,
        key: str | None = None,
    ) -> Callable[P, TaskCall]: ...

    @overload
    def call(
        self,
        function: Callable[P, R],
        when: datetime | None = None,
        key: str | None = None,
    ) -> Callable[P, TaskCall]: ...

    @overload
    def call(
        self, function: str, when: datetime | None = None, key: str | None = None
    ) -> Callable[..., TaskCall]: ...

    def call(
        self,
        function: TaskFunction | str,
        when: datetime | None = None,
        key: str | None = None,
    ) -> Callable[..., TaskCall]:
        """A call for ``add_many``/``replace_many``: ``docket.call(fn, when,
        key)(*args, **kwargs)`` is a ``TaskCall``.  As in pydocket, ``when``
        (default: now) and ``key`` (default: a new uuid7) are settled here,
        once for every call made with the returned function."""
        task, _ = resolve_task(self, function)
        function_name = function if isinstance(function, str) else None
        at = when or utcnow()
        chosen = key or uuid7()

        def specify(*args: Any, **kwargs: Any) -> TaskCall:
            return TaskCall(task, args, kwargs, chosen, at, function_name)

        return specify

    async def add_many(
        self, calls: Iterable[TaskCall], *, chunk_size: int | None = 1000
    ) -> list[Execution]:
        """``add`` every call, ``chunk_size`` to a round trip (``None``: all
        in one); one execution per call, in order, each with its disposition."""
        return await self._schedule_many(calls, ScheduleMode.ADD, chunk_size)

    async def replace_many(
        self, calls: Iterable[TaskCall], *, chunk_size: int | None = 1000
    ) -> list[Execution]:
        """``replace`` every call (each under its ``key``), as ``add_many`` adds."""
        return await self._schedule_many(calls, ScheduleMode.REPLACE, chunk_size)

    async def _schedule_many(
        self, calls: Iterable[TaskCall], mode: ScheduleMode, chunk_size: int | None
    ) -> list[Execution]:
        if chunk_size is not None and chunk_size < 1:
            raise UsageError(f"chunk_size must be at least 1, got {chunk_size}")
        calls = list(calls)
        executions: list[Execution] = []
        async with self.batch(chunk=chunk_size or max(len(calls), 1)) as batch:
            for call in calls:
                function = call.function_name or call.function
                if mode is ScheduleMode.ADD:
                    collect = batch.add(function, when=call.when, key=call.key)
                else:
                    collect = batch.replace(function, when=call.when, key=call.key)
                executions.append(collect(*call.args, **call.kwargs))
        return executions

    def batch(self, chunk: int = 1000) -> Batch:
        """``async with docket.batch() as batch: batch.add(fn)(...)``: adds and
        replaces sent to the store together when the block ends (one round
        trip per ``chunk`` calls); nothing is sent if the block raises."""
        from .batch import Batch

        return Batch(self, chunk=chunk)

    async def cancel(self, key: str) -> None:
        """Cancel ``key`` whatever its stage; a running task is interrupted."""
        ttl = self.execution_ttl.total_seconds()
        if instrumentation.metering():
            TASKS_CANCELLED.add(1, {"docket.name": self.name})
        with producer_span("cancel", self.name, {"docket.key": key}):
            await self.adapter.execute([Cancel(key=key, now=time.time(), ttl=ttl)])

    async def get_execution(self, key: str) -> Execution | None:
        """The latest execution of ``key``, or ``None`` if the store has none."""
        record = await self.adapter.get_record(key)
        if record is None:
            return None
        execution = Execution.from_record(self, record)
        execution.progress._apply(await self.adapter.get_progress(key))
        return execution

    # -- strikes ------------------------------------------------------------------------

    async def strike(
        self,
        function: TaskFunction | str | None = None,
        parameter: str | None = None,
        operator: Operator | LiteralOperator = "==",
        value: Any = None,
    ) -> None:
        """Stop matching calls from being scheduled or run until restored."""
        instruction = instruction_for(Strike, function, parameter, operator, value)
        with producer_span("strike", self.name, instruction.labels()):
            await self.strike_list.send_instruction(instruction)

    async def restore(
        self,
        function: TaskFunction | str | None = None,
        parameter: str | None = None,
        operator: Operator | LiteralOperator = "==",
        value: Any = None,
    ) -> None:
        """Lift a strike made with the same arguments."""
        instruction = instruction_for(Restore, function, parameter, operator, value)
        with producer_span("restore", self.name, instruction.labels()):
            await self.strike_list.send_instruction(instruction)

    async def wait_for_strikes_loaded(self) -> None:
        """Read the strikes now (``strike_list`` then shows them all)."""
        await self.strike_list.wait_for_strikes_loaded()

    # -- inspection ----------------------------------------------------------------------

    async def snapshot(self, limit: int = 1000) -> DocketSnapshot:
        """Scheduled, queued and running tasks (at most ``limit`` of each,
        with the true totals), and the live workers."""
        from .serialization import loads_call

        if limit < 1:
            raise UsageError("a snapshot's limit must be at least 1")
        now = time.time()
        raw = await self.adapter.snapshot(now, limit)

        def load(message: Any) -> Execution:
            try:
                args, kwargs = loads_call(message.payload, self.signing)
            except Exception:
                args, kwargs = (), {}
            return Execution(
                self,
                self.tasks.get(message.function),
                args,
                kwargs,
                message.key,
                to_datetime(message.when),
                message.attempt,
                function_name=message.function,
                generation=message.generation,
            )

        future = [load(m) for m in raw.future]
        running = [
            RunningExecution(
                execution=load(r.message), worker=r.worker, started=to_datetime(r.started)
            )
            for r in raw.running
        ]
        window = self._liveness_window()
        workers = [
            WorkerInfo(name=w.name, last_seen=to_datetime(w.last_seen), tasks=set(w.tasks))
            for w in raw.workers
            if is_live(w.last_seen, now, window)
        ]
        return DocketSnapshot(
            taken=to_datetime(now),
            total_tasks=raw.future_total + raw.running_total,
            future=future,
            running=running,
            workers=workers,
            future_total=raw.future_total,
            running_total=raw.running_total,
            malformed=list(raw.malformed),
            dead_letters=raw.dead_letters,
        )

    async def dead_letters(self, limit: int = 1000) -> tuple[int, list[DeadLetter]]:
        """How many malformed messages were set aside, and the newest ``limit``."""
        return await self.adapter.dead_letters(limit)

    async def replay_dead_letters(self, entry_ids: Sequence[str] | None = None) -> int:
        """Put these dead letters (``None``: all) back in the queue as they
        were, their keys queued again (one that still cannot be read comes
        back to the dead letters); returns how many."""
        return await self.adapter.replay_dead_letters(entry_ids)

    async def drop_dead_letters(self, entry_ids: Sequence[str] | None = None) -> int:
        """Remove these dead letters (``None``: all of them); returns how many."""
        return await self.adapter.drop_dead_letters(entry_ids)

    async def workers(self) -> list[WorkerInfo]:
        """Workers seen within ``heartbeat_interval * missed_heartbeats``."""
        records = await self.adapter.workers(time.time(), self._liveness_window())
        return [
            WorkerInfo(name=w.name, last_seen=to_datetime(w.last_seen), tasks=set(w.tasks))
            for w in records
        ]

    def _liveness_window(self) -> float:
        return liveness_window(self.heartbeat_interval.total_seconds(), self.missed_heartbeats)

    async def task_workers(self, task_name: str) -> list[WorkerInfo]:
        """Live workers that can run ``task_name``."""
        return [w for w in await self.workers() if task_name in w.tasks]

    async def clear(self) -> int:
        """Cancel every task that waits to run (scheduled, queued, or parked
        behind a concurrency limit); return how many there were."""
        with producer_span("clear", self.name):
            return await self.adapter.clear(time.time(), self.execution_ttl.total_seconds())


def utcnow() -> datetime:
    return datetime.now(UTC)


__all__ = ["Docket", "DocketSnapshot", "RunningExecution", "WorkerInfo", "utcnow"]

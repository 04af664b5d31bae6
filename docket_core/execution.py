"""``Execution``: a handle on one scheduled call, its state, progress and result.

The names pydocket's ``docket.execution`` offers are here too: the states
(``ExecutionState``, ``Disposition``), the events ``subscribe`` and
``events`` give (``StateEvent``, ``ProgressEvent``), ``ExecutionProgress``,
``TaskCall`` (``Docket.call``) and the strike values of
``docket_core.strikelist`` (``Operator``, ``Strike``, ``Restore``,
``StrikeList``).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from ._execution_progress import ExecutionProgress
from .adapter import ProgressEvent, StateEvent, StoreEvent
from .sansio.errors import ExecutionCancelled as ExecutionCancelled
from .sansio.errors import StoreError
from .sansio.values import Disposition, ExecutionRecord, ExecutionState
from .serialization import SignatureError, describe, loads_call, loads_value
from .strikelist import LiteralOperator, Operator, Restore, Strike, StrikeInstruction, StrikeList

#: how often a waiting ``get_result`` looks at the record itself, besides
#: its events (one published while the subscriber reconnected is lost)
RECHECK_SECONDS = 5.0

if TYPE_CHECKING:
    from .docket import Docket


def to_datetime(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)


def to_timestamp(when: datetime) -> float:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


TaskFunction = Callable[..., Any]


@attrs.frozen(slots=True)
class TaskCall:
    """One call to schedule, every input settled (``Docket.call(fn)(...)``);
    ``Docket.add_many``/``replace_many`` take a list of them.
    ``function_name`` is set when the task was named rather than passed."""

    function: TaskFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    key: str
    when: datetime
    function_name: str | None = None


class Execution:
    """One call of a task function, as scheduled under a key."""

    def __init__(
        self,
        docket: Docket,
        function: Callable[..., Any] | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: str,
        when: datetime,
        attempt: int = 1,
        *,
        function_name: str | None = None,
        generation: int = 0,
        redelivered: bool = False,
        disposition: Disposition = Disposition.LOADED,
        state: ExecutionState = ExecutionState.SCHEDULED,
    ) -> None:
        self._docket = docket
        self._function = function
        self._function_name: str = function_name or str(getattr(function, "__name__", "<unknown>"))
        self._args = args
        self._kwargs = kwargs
        self._key = key
        self._generation = generation
        self._redelivered = redelivered
        self.when = when
        self.attempt = attempt
        self.disposition = disposition
        self.state = state
        self.worker: str | None = None
        self.started_at: datetime | None = None
        self.completed_at: datetime | None = None
        self.error: str | None = None
        self._progress: ExecutionProgress | None = None
        self._result: bytes | None = None

    # -- identity --------------------------------------------------------------

    @property
    def docket(self) -> Docket:
        return self._docket

    @property
    def function(self) -> Callable[..., Any] | None:
        return self._function

    @property
    def function_name(self) -> str:
        return self._function_name

    @property
    def args(self) -> tuple[Any, ...]:
        return self._args

    @property
    def kwargs(self) -> dict[str, Any]:
        return self._kwargs

    @property
    def key(self) -> str:
        return self._key

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def redelivered(self) -> bool:
        return self._redelivered

    @property
    def progress(self) -> ExecutionProgress:
        """The progress of this execution (its handle is made when first asked for)."""
        progress = self._progress
        if progress is None:
            progress = self._progress = ExecutionProgress(self._docket, self._key)
        return progress

    def get_argument(self, name: str) -> Any:
        """The call's argument for parameter ``name``."""
        from .dependencies import bind_arguments

        if self._function is None:
            return self._kwargs[name]
        return bind_arguments(self._function, self._args, self._kwargs)[name]

    def call_repr(self) -> str:
        """``name(args){key}``, as the worker's log lines show the call:
        arguments print as ``...`` unless their parameter is ``Logged``."""
        from .dependencies import call_repr

        if self._function is None:
            return f"{self._function_name}(...){{{self._key}}}"
        call = call_repr(self._function, self._function_name, self._args, self._kwargs)
        return f"{call}{{{self._key}}}"

    def __repr__(self) -> str:
        return f"<Execution {self._key} {self._function_name} {self.state.value}>"

    # -- loading -----------------------------------------------------------------

    @classmethod
    def from_record(cls, docket: Docket, record: ExecutionRecord) -> Execution:
        """Rebuild an execution from what the store keeps about its key."""
        try:
            args, kwargs = loads_call(record.payload, docket.signing)
        except Exception:
            args, kwargs = (), {}
        execution = cls(
            docket,
            docket.tasks.get(record.function),
            args,
            kwargs,
            record.key,
            to_datetime(record.when),
            record.attempt,
            function_name=record.function,
            generation=record.generation,
        )
        execution._apply(record)
        return execution

    def _apply(self, record: ExecutionRecord) -> None:
        self.state = record.state
        self.attempt = record.attempt
        self.when = to_datetime(record.when)
        self._generation = record.generation
        self.worker = record.worker
        self.started_at = to_datetime(record.started_at) if record.started_at else None
        self.completed_at = to_datetime(record.completed_at) if record.completed_at else None
        self.error = record.error
        self._result = record.result

    async def sync(self) -> None:
        """Reload state and progress from the store."""
        await self._reload()

    async def _reload(self) -> bool:
        """``sync``, saying whether the record it read had ended (the state
        alone cannot say: another listener of this execution may apply an
        event meanwhile, before the result is loaded)."""
        record = await self._docket.adapter.get_record(self._key)
        if record is not None:
            self._apply(record)
        self.progress._apply(await self._docket.adapter.get_progress(self._key))
        # no record: nothing in the store can end it (a struck add), so what
        # this process knows decides
        return self.state.terminal if record is None else record.state.terminal

    async def is_superseded(self) -> bool:
        """Whether a later ``replace`` (or a retry, a perpetual follow-up) of
        the key holds it now; always false for an execution of generation 0."""
        if self._generation == 0:
            return False
        record = await self._docket.adapter.get_record(self._key)
        return record is not None and record.generation > self._generation

    def _apply_event(self, event: StoreEvent) -> None:
        if type(event) is StateEvent:
            self.state = event.state
            if event.worker:
                self.worker = event.worker
            if event.started_at:
                self.started_at = to_datetime(event.started_at)
            if event.completed_at:
                self.completed_at = to_datetime(event.completed_at)
            if event.error is not None:
                self.error = event.error
        elif type(event) is ProgressEvent:
            self.progress._apply(event.progress)

    # -- events and results ----------------------------------------------------------

    async def events(self) -> AsyncIterator[StoreEvent]:
        """Yield the current state and progress, then every live event, as
        ``StateEvent`` and ``ProgressEvent`` values (applied to this handle)."""
        async with self._docket.adapter.subscribe(self._key) as events:
            await self.sync()
            worker, error = self.worker or None, self.error or None
            yield StateEvent(key=self._key, state=self.state, worker=worker, error=error)
            yield self.progress.event()
            async for event in events:
                self._apply_event(event)
                yield event

    async def subscribe(self) -> AsyncIterator[dict[str, Any]]:
        """Yield the current state and progress, then every live event, as
        the JSON-like dicts pydocket yields (``StateEvent.as_dict()``...)."""
        async for event in self.events():
            yield event.as_dict()

    async def get_result(
        self, *, timeout: timedelta | None = None, deadline: datetime | None = None
    ) -> Any:
        """Wait for the execution to end; return its result or raise its error.

        Raises ``ExecutionCancelled`` for a cancelled execution,
        ``TimeoutError`` when it has not ended by ``timeout``/``deadline``,
        and ``ValueError`` when given both."""
        if timeout is not None and deadline is not None:
            raise ValueError("Cannot specify both timeout and deadline")
        seconds = math.inf
        if timeout is not None:
            seconds = timeout.total_seconds()
        if deadline is not None:
            seconds = min(seconds, to_timestamp(deadline) - datetime.now(UTC).timestamp())
        with anyio.move_on_after(max(seconds, 0)):
            async with self._docket.adapter.subscribe(self._key) as events:
                if not await self._reload():
                    async with anyio.create_task_group() as group:
                        group.start_soon(self._recheck, group.cancel_scope)
                        async for event in events:
                            self._apply_event(event)
                            if self.state.terminal:
                                break
                        group.cancel_scope.cancel()
                    await self.sync()  # the result, and the end a recheck saw
                return self._outcome()
        raise TimeoutError(f"Timeout waiting for execution {self._key} to complete")

    async def _recheck(self, waiting: anyio.CancelScope) -> None:
        """Look at the record now and then while waiting for its events (an
        event published while the subscriber reconnected is lost); end the
        wait once it ended.  Only reads: the waiting loop alone applies."""
        while True:
            await anyio.sleep(RECHECK_SECONDS)
            try:
                record = await self._docket.adapter.get_record(self._key)
            except StoreError:
                continue  # the events may still come; the next look may work
            if record is not None and record.state.terminal:
                waiting.cancel()
                return

    def _outcome(self) -> Any:
        if self.state is ExecutionState.CANCELLED:
            raise ExecutionCancelled(f"Execution {self._key} was cancelled")
        if self.state is ExecutionState.FAILED:
            if self._result is not None:
                try:
                    error = loads_value(self._result, self._docket.signing)
                except SignatureError as unsigned:
                    raise SignatureError(
                        f"{self.error or 'Task execution failed'}; its exception was not "
                        f"unpickled: {unsigned}"
                    ) from None
                except Exception as unreadable:
                    raise Exception(
                        f"{self.error or 'Task execution failed'} (its exception could not be "
                        f"unpickled here: {describe(unreadable)})"
                    ) from unreadable
                if isinstance(error, Exception):
                    raise error
            # (a SystemExit or KeyboardInterrupt the task raised is not raised
            # here: it would stop the program waiting for the result)
            raise Exception(self.error or "Task execution failed")
        if self._result is not None:
            try:
                return loads_value(self._result, self._docket.signing)
            except SignatureError as unsigned:
                raise SignatureError(
                    f"the result of execution {self._key} was not unpickled: {unsigned}"
                ) from None
            except Exception as unreadable:
                raise ValueError(
                    f"the result of execution {self._key} could not be unpickled here: "
                    f"{describe(unreadable)}"
                ) from unreadable
        return None


__all__ = [
    "Disposition",
    "Execution",
    "ExecutionCancelled",
    "ExecutionProgress",
    "ExecutionState",
    "LiteralOperator",
    "Operator",
    "ProgressEvent",
    "Restore",
    "StateEvent",
    "Strike",
    "StrikeInstruction",
    "StrikeList",
    "TaskCall",
    "TaskFunction",
]

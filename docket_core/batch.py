"""``Docket.batch()``: many adds and replaces, sent to the store together.

::

    async with docket.batch() as batch:
        for customer in customers:
            batch.add(send_invoice)(customer)

Inside the block, ``batch.add`` and ``batch.replace`` check and pickle each
call at once (an unpicklable argument fails on its own line) and return its
``Execution``; when the block ends, the calls go to the store ``chunk`` at a
time, each chunk in one round trip (one script call on a server), and every
execution learns what the store did with it (scheduled, already scheduled).
Strikes are read once, when the block starts.  If the block raises, nothing
is sent.  Within one chunk the calls are carried out in order, so two calls
with the same key behave as they would one after the other.

pydocket 0.27's ``Docket.add_many``/``replace_many`` (of ``Docket.call``'s
``TaskCall`` values) are one such block.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, overload

from ._calls import TaskFunction, pending_call, resolve_task, settle, struck
from .execution import Execution
from .instrumentation import producer_span, trace_headers
from .sansio.decisions import plan_add
from .sansio.effects import Schedule
from .sansio.errors import UsageError
from .sansio.strikes import StrikeList
from .sansio.values import ScheduleMode

if TYPE_CHECKING:
    from .docket import Docket

P = ParamSpec("P")


class Batch:
    """Calls collected by ``Docket.batch()``; see the module's documentation."""

    def __init__(self, docket: Docket, *, chunk: int = 1000) -> None:
        if chunk < 1:
            raise UsageError("a batch's chunk must be at least 1")
        self.docket = docket
        self.chunk = chunk
        self._pending: list[tuple[Execution, Schedule]] = []
        self._strikes: StrikeList | None = None
        self._headers: dict[str, str] | None = None
        self._span = ExitStack()

    async def __aenter__(self) -> Batch:
        span = self._span.enter_context(producer_span("batch", self.docket.name))
        self._headers = trace_headers(span)
        self._strikes = await self.docket.adapter.strikes()
        return self

    async def __aexit__(self, *raised: object) -> None:
        with self._span:
            pending, self._pending = self._pending, []
            if raised[0] is not None:
                return  # the block raised: nothing is sent
            for start in range(0, len(pending), self.chunk):
                part = pending[start : start + self.chunk]
                outcomes = await self.docket.adapter.execute([effect for _, effect in part])
                for (execution, _), outcome in zip(part, outcomes, strict=True):
                    settle(execution, outcome)

    @overload
    def add(
        self, function: Callable[P, Any], when: datetime | None = None, key: str | None = None
    ) -> Callable[P, Execution]: ...

    @overload
    def add(
        self, function: str, when: datetime | None = None, key: str | None = None
    ) -> Callable[..., Execution]: ...

    def add(
        self, function: TaskFunction | str, when: datetime | None = None, key: str | None = None
    ) -> Callable[..., Execution]:
        """Collect a call, as ``Docket.add`` schedules one."""
        return self._collector(function, when, key, ScheduleMode.ADD)

    @overload
    def replace(
        self, function: Callable[P, Any], when: datetime, key: str
    ) -> Callable[P, Execution]: ...

    @overload
    def replace(self, function: str, when: datetime, key: str) -> Callable[..., Execution]: ...

    def replace(
        self, function: TaskFunction | str, when: datetime, key: str
    ) -> Callable[..., Execution]:
        """Collect a call that supersedes whatever is live under ``key``."""
        return self._collector(function, when, key, ScheduleMode.REPLACE)

    def _collector(
        self,
        function: TaskFunction | str,
        when: datetime | None,
        key: str | None,
        mode: ScheduleMode,
    ) -> Callable[..., Execution]:
        if self._strikes is None:
            raise UsageError("use a batch inside 'async with docket.batch() as batch'")
        strikes, docket, headers = self._strikes, self.docket, self._headers
        task, name = resolve_task(docket, function)

        def collect(*args: Any, **kwargs: Any) -> Execution:
            now = time.time()
            execution, call = pending_call(
                docket,
                task,
                name,
                when=when,
                key=key,
                mode=mode,
                args=args,
                kwargs=kwargs,
                headers=headers,
                now=now,
            )
            effect = plan_add(call, strikes, now=now)
            if effect is None or docket.strike_list.meets_condition(execution):
                return struck(execution)
            self._pending.append((execution, effect))
            return execution

        return collect

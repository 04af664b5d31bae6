"""``Perpetual`` and ``Cron``: tasks that schedule their own next run.

The core (``decisions.plan_end``) schedules the next run as it records a
run's end; these declarations give it the policy (``PerpetualPolicy``) and,
through their injected copies, what a run asks of its successor.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, ClassVar

import cloudpickle

from ._run_resolution import Run
from .extensions import CompletionHandler
from .outcomes import TaskOutcome, carried_out_by_the_core
from .sansio.cron import CronPolicy, cron_policy, next_instant
from .sansio.errors import UsageError
from .sansio.inputs import FollowUp
from .sansio.values import PerpetualPolicy
from .serialization import CALL, Signing


class Perpetual(CompletionHandler):
    """Run the task again ``every`` interval (start to start) after each run.

    ``automatic`` tasks (which take no arguments) are scheduled by workers on
    their own.  The injected copy can ``cancel()`` the chain, ``perpetuate()``
    with other arguments, or move the next run with ``after``/``at``.  The
    core schedules the next run as it records this one's end; a subclass may
    override ``on_complete`` (called once the run is over), and the chain
    goes on only if it calls ``Perpetual.on_complete``.
    """

    single: ClassVar[bool] = True

    def __init__(self, every: timedelta = timedelta(0), automatic: bool = False) -> None:
        self.every = every
        self.automatic = automatic
        self.cancelled = False
        self.args: tuple[Any, ...] | None = None
        self.kwargs: dict[str, Any] | None = None
        self.next_at: float | None = None
        self._now: Callable[[], float] = time.time
        #: the docket's signing keys, for the next run's arguments
        self._signing: Signing | None = None
        #: whether the chain goes on (an overriding ``on_complete`` that does
        #: not call this class's ends it)
        self._chain = True

    def _policy(self) -> dict[str, Any]:
        return {
            "perpetual": PerpetualPolicy(every=self.every.total_seconds(), automatic=self.automatic)
        }

    def _cache_key(self) -> object | None:
        return Perpetual

    async def _inject(self, run: Run, parameter: str) -> Any:
        injected = copy.copy(self)
        injected._now = run.context.now
        injected._signing = getattr(run.context.docket, "signing", None)
        run.follow_ups.append(injected)
        return injected

    def cancel(self) -> None:
        """End the chain: no next run."""
        self.cancelled = True

    def perpetuate(self, *args: Any, **kwargs: Any) -> None:
        """Call the next run with these arguments."""
        self.args = args
        self.kwargs = kwargs

    def after(self, delay: timedelta) -> None:
        """Schedule the next run ``delay`` from now instead of ``every``."""
        self.next_at = self._now() + delay.total_seconds()

    def at(self, when: datetime) -> None:
        """Schedule the next run at ``when`` instead of after ``every``."""
        self.next_at = when.timestamp()

    @property
    def initial_when(self) -> datetime | None:
        """When a worker first schedules an automatic one: ``None``, now."""
        return None

    @carried_out_by_the_core
    async def on_complete(self, execution: Any, outcome: TaskOutcome) -> bool:
        """Let the chain go on: the core schedules the next run (as this
        copy says: ``cancel``, ``perpetuate``, ``after``/``at``) when it
        records this run's end.  Returns ``True``."""
        self._chain = True
        return True

    def _follow_up(self) -> FollowUp | None:
        cancelled = self.cancelled or not self._chain
        if not cancelled and self.next_at is None and self.args is None:
            return None
        payload = None
        if self.args is not None:
            payload = cloudpickle.dumps((self.args, self.kwargs or {}))
            if self._signing is not None:
                payload = self._signing.sign(CALL, payload)
        return FollowUp(
            perpetual_cancelled=cancelled,
            perpetual_at=self.next_at,
            perpetual_payload=payload,
        )

    def __repr__(self) -> str:
        return f"Perpetual(every={self.every!r}, automatic={self.automatic})"


class Cron(Perpetual):
    """A perpetual task on wall-clock time: it runs at each instant matching
    ``expression`` (5 fields, or a Vixie keyword such as ``@daily``) in time
    zone ``tz``, daylight saving changes included.  After each run, however
    it ended, the next run is the first instant after both its end and its
    own instant (one instant never runs twice).  ``automatic`` (the default)
    cron tasks are scheduled by every worker that starts, at their next
    instant; a live chain is left alone."""

    def __init__(self, expression: str, automatic: bool = True, tz: tzinfo = UTC) -> None:
        super().__init__(automatic=automatic)
        self._cron: CronPolicy = cron_policy(expression, tz, automatic=automatic)
        self.expression = self._cron.expression
        self.tz = tz

    def _policy(self) -> dict[str, Any]:
        return {"perpetual": PerpetualPolicy(every=0.0, automatic=self.automatic, cron=self._cron)}

    def next_time(self) -> datetime:
        """The next matching instant from now, in ``tz``."""
        instant = next_instant(self._cron, self._now())
        if instant is None:
            raise UsageError(f"cron expression {self.expression!r} has no instant left")
        return datetime.fromtimestamp(instant, self.tz)

    @property
    def initial_when(self) -> datetime:
        """When a worker first schedules it: its next instant."""
        return self.next_time()

    def __repr__(self) -> str:
        return f"Cron({self.expression!r}, automatic={self.automatic}, tz={self.tz!r})"


def first_run(policy: PerpetualPolicy, now: float) -> datetime | None:
    """When a worker schedules an automatic perpetual task: now, or a cron
    task's next instant (``None``: it has none left)."""
    instant = now if policy.cron is None else next_instant(policy.cron, now)
    return None if instant is None else datetime.fromtimestamp(instant, UTC)


__all__ = ["Cron", "Perpetual", "first_run"]

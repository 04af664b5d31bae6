"""``Agenda``: collect calls, then spread them over a window of time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ._calls import unregistered
from .sansio.errors import UsageError

if TYPE_CHECKING:
    from .docket import Docket
    from .execution import Execution

#: one collected call, as pydocket's ``Agenda`` iterates them:
#: ``(function, args, kwargs, key)``
AgendaItem = tuple["Callable[..., Any] | str", tuple[Any, ...], dict[str, Any], "str | None"]


def scatter_times(count: int, start: float, over: float) -> list[float]:
    """``count`` instants spread evenly over ``[start, start + over]``, ends
    included; a single one goes in the middle."""
    if count == 1:
        return [start + over / 2]
    step = over / (count - 1) if count > 1 else 0.0
    return [start + i * step for i in range(count)]


class Agenda:
    """A list of calls to schedule together; iterating gives each as
    ``(function, args, kwargs, key)``."""

    def __init__(self) -> None:
        self._calls: list[AgendaItem] = []

    def add(
        self, function: Callable[..., Any] | str, key: str | None = None
    ) -> Callable[..., None]:
        """Collect ``function(*args, **kwargs)``: ``agenda.add(fn)(*args)``."""

        def collect(*args: Any, **kwargs: Any) -> None:
            self._calls.append((function, args, kwargs, key))

        return collect

    def clear(self) -> None:
        self._calls.clear()

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[AgendaItem]:
        return iter(self._calls)

    async def scatter(
        self,
        docket: Docket,
        over: timedelta,
        start: datetime | None = None,
        jitter: timedelta | None = None,
        *,
        random: Callable[[], float] | None = None,
    ) -> list[Execution]:
        """Schedule every call, evenly spread over ``over`` from ``start``.

        ``jitter`` moves each by up to that much either way (never before
        ``start``); ``random`` supplies the draws in [0, 1) (default:
        ``random.random``).  Unknown task names fail before anything is
        scheduled; stable keys make a second scatter a no-op."""
        if over.total_seconds() <= 0:
            raise UsageError("'over' parameter must be a positive duration")
        for function, _, _, _ in self._calls:
            if isinstance(function, str) and function not in docket.tasks:
                raise unregistered(function)
        if not self._calls:
            return []
        begin = (start or datetime.now(UTC)).timestamp()
        times = scatter_times(len(self._calls), begin, over.total_seconds())
        if jitter is not None:
            if random is None:
                import random as _random

                random = _random.random
            spread = jitter.total_seconds()
            times = [max(begin, t + (random() * 2 - 1) * spread) for t in times]
        executions = []
        for (function, args, kwargs, key), at in zip(self._calls, times, strict=True):
            when = datetime.fromtimestamp(at, UTC)
            executions.append(await docket.add(function, when=when, key=key)(*args, **kwargs))
        return executions

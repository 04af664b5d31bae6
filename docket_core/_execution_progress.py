"""``ExecutionProgress``: an execution's reported progress, as pydocket has it.

``execution.progress`` holds what was last read from the store (``sync``) or
seen in an event: ``current`` (``None`` until anything is known), ``total``,
``message`` and ``updated_at`` (a UTC ``datetime``).  ``set_total``,
``increment`` and ``set_message`` report progress for the execution's key
from anywhere (inside a task, the ``Progress()`` dependency does the same).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .adapter import ProgressEvent
from .sansio.values import DEFAULT_PROGRESS_TOTAL, ProgressRecord

if TYPE_CHECKING:
    from .docket import Docket


class ExecutionProgress:
    """The progress of the execution under ``key``."""

    def __init__(self, docket: Docket, key: str) -> None:
        self.docket = docket
        self.key = key
        self.current: int | None = None
        self.total: int = DEFAULT_PROGRESS_TOTAL
        self.message: str | None = None
        self.updated_at: datetime | None = None

    @classmethod
    async def create(cls, docket: Docket, key: str) -> ExecutionProgress:
        """A progress handle read from the store."""
        progress = cls(docket, key)
        await progress.sync()
        return progress

    def __repr__(self) -> str:
        return (
            f"ExecutionProgress(key={self.key!r}, current={self.current}, "
            f"total={self.total}, message={self.message!r})"
        )

    def _apply(self, record: ProgressRecord | None) -> None:
        """Take what the store (or an event) says; ``None``: nothing reported."""
        if record is None:
            self.current, self.total, self.message, self.updated_at = (
                None,
                DEFAULT_PROGRESS_TOTAL,
                None,
                None,
            )
            return
        self.current = record.current
        self.total = record.total
        self.message = record.message
        self.updated_at = (
            datetime.fromtimestamp(record.updated_at, UTC) if record.updated_at else None
        )

    def event(self) -> ProgressEvent:
        """This progress as a ``ProgressEvent``."""
        updated_at = self.updated_at.timestamp() if self.updated_at else None
        return ProgressEvent(
            key=self.key,
            current=self.current or 0,
            total=self.total,
            message=self.message,
            updated_at=updated_at,
        )

    async def sync(self) -> None:
        """Reload the progress from the store."""
        self._apply(await self.docket.adapter.get_progress(self.key))

    async def _report(self, **changes: Any) -> None:
        record = await self.docket.adapter.report_progress(self.key, now=time.time(), **changes)
        self._apply(record)

    async def set_total(self, total: int) -> None:
        """Set the number of units of work (at least 1)."""
        if total < 1:
            raise ValueError("Total must be at least 1")
        await self._report(total=total)

    async def increment(self, amount: int = 1) -> None:
        """Add ``amount`` (at least 1) to ``current``."""
        if amount < 1:
            raise ValueError("Amount must be at least 1")
        await self._report(increment=amount)

    async def set_message(self, message: str | None) -> None:
        """Set the status message; ``None`` clears it."""
        await self._report(message=message, clear_message=message is None)

    async def subscribe(self) -> AsyncIterator[dict[str, Any]]:
        """Yield every live progress event of the key, as JSON-like dicts."""
        async with self.docket.adapter.subscribe(self.key) as events:
            async for event in events:
                if isinstance(event, ProgressEvent):
                    self._apply(event.progress)
                    yield event.as_dict()


__all__ = ["ExecutionProgress"]

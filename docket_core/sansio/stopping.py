"""Stopping a running task: the ``CancelTask`` the core sends for each
``StopReason``, and what a run stopped for its timeout records.

The runtime only carries these out: it cancels the task function and, when
the ``CancelTask`` names an exception (``ErrorResult``), pickles it as the
run's result.  What a timeout records (its state, its error text, its
result) is decided here, nowhere else.
"""

from __future__ import annotations

from .effects import CancelTask, ErrorResult, StopReason
from .inputs import TaskEnded, TaskOutcome
from .values import TaskMessage, TaskPolicy


def stop_task(delivery_id: str, reason: StopReason, message: TaskMessage) -> CancelTask:
    """The effect that stops a delivery's run; a timeout keeps a
    ``TimeoutError`` as the run's result, as pydocket does."""
    if reason is StopReason.TIMEOUT:
        result = ErrorResult(kind=TimeoutError, message=f"{message.function} timed out")
        return CancelTask(delivery_id=delivery_id, reason=reason, result=result)
    return CancelTask(delivery_id=delivery_id, reason=reason)


def timed_out_end(ended: TaskEnded, policy: TaskPolicy) -> tuple[TaskOutcome, str | None]:
    """The outcome and error of a run stopped for its timeout: a failure
    with the ``TimeoutError`` reason once the stop took (it ended cancelled);
    a run that returned or raised first ends as it did."""
    if ended.outcome is TaskOutcome.CANCELLED:
        return TaskOutcome.FAILED, f"TimeoutError: task exceeded its timeout of {policy.timeout}s"
    return ended.outcome, ended.error


__all__ = ["stop_task", "timed_out_end"]

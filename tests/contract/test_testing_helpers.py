"""``docket_core.testing``'s assertions on every contract backend: what is
scheduled, how many, what is not, and the messages that say what was found.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from helpers import Now, running

from docket_core import Docket, Worker
from docket_core.testing import (
    assert_no_tasks,
    assert_task_count,
    assert_task_not_scheduled,
    assert_task_scheduled,
)

pytestmark = pytest.mark.anyio


async def test_testing_helpers(docket: Docket, worker: Worker, now: Now) -> None:
    async def send(to: str, subject: str = "", *, urgent: bool = False) -> None:
        pass

    async def other() -> None:
        pass

    await assert_no_tasks(docket)
    await assert_task_count(docket, count=0)
    await assert_task_not_scheduled(docket, send)

    await docket.add(send, key="k1")("ann", subject="hi", urgent=True)
    await docket.add(send, when=now() + timedelta(seconds=30))("bob")
    await docket.add(other)()

    await assert_task_scheduled(docket, send)
    await assert_task_scheduled(docket, "send", args=("ann",))
    await assert_task_scheduled(docket, send, kwargs={"urgent": True})
    await assert_task_scheduled(docket, send, kwargs={"subject": "hi", "urgent": True})
    await assert_task_scheduled(docket, send, key="k1")
    await assert_task_scheduled(docket, send, args=("bob",))
    await assert_task_scheduled(docket, other)
    await assert_task_not_scheduled(docket, send, args=("carol",))
    await assert_task_not_scheduled(docket, send, kwargs={"urgent": False})
    await assert_task_not_scheduled(docket, send, key="k2")
    await assert_task_not_scheduled(docket, "trace")
    await assert_task_count(docket, count=3)
    await assert_task_count(docket, send, count=2)
    await assert_task_count(docket, "other", count=1)

    # pydocket's wording: the task's name, what was asked, what is scheduled
    with pytest.raises(AssertionError) as caught:
        await assert_task_scheduled(docket, send, args=("carol",))
    message = str(caught.value)
    assert message.startswith("Task send not found with function=send, args=('carol',)")
    assert "Scheduled tasks:\n" in message
    assert message.count("\n  - ") == 3
    assert "send(args=('ann',), kwargs={'subject': 'hi', 'urgent': True}, key='k1')" in message
    assert "'bob'" in message and "other(args=()" in message

    with pytest.raises(AssertionError) as caught:
        await assert_task_not_scheduled(docket, send, key="k1")
    message = str(caught.value)
    assert message.startswith("Task send found but should not be scheduled\nFound: send(")
    assert "key='k1'" in message

    with pytest.raises(AssertionError) as caught:
        await assert_task_count(docket, send, count=5)
    assert str(caught.value).startswith("Expected 5 tasks for send, found 2")
    assert "other(args=()" in str(caught.value)
    with pytest.raises(AssertionError, match=r"^Expected 4 all tasks, found 3"):
        await assert_task_count(docket, count=4)
    with pytest.raises(AssertionError) as caught:
        await assert_no_tasks(docket)
    assert str(caught.value).startswith("Expected no tasks, found 3 task(s) scheduled:\n  - ")

    await docket.clear()
    await assert_no_tasks(docket)
    with pytest.raises(
        AssertionError, match=r"^Task send not found: no tasks scheduled on docket$"
    ):
        await assert_task_scheduled(docket, send)
    with pytest.raises(AssertionError, match=r"^Expected 1 tasks for send, found 0$"):
        await assert_task_count(docket, send, count=1)


async def test_testing_helpers_ignore_running_tasks(docket: Docket, worker: Worker) -> None:
    started = anyio.Event()
    release = anyio.Event()

    async def blocking() -> None:
        started.set()
        await release.wait()

    async with running(worker):
        execution = await docket.add(blocking)()
        await started.wait()
        await assert_no_tasks(docket)
        await assert_task_not_scheduled(docket, blocking)
        release.set()
        await execution.get_result(timeout=timedelta(seconds=2))

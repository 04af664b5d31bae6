"""pydocket's public names at pydocket's module paths (``docket.X`` becomes
``docket_core.X``), with pydocket's parameter names; pydocket's
``Task 'name' is not registered`` wherever a Docket is given an unknown task
name; and the standard tasks (``docket_core.tasks``) saying what pydocket's
say, on every contract backend.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from datetime import UTC, datetime, timedelta

import pytest
from helpers import finish

from docket_core import Agenda, Docket, Worker

pytestmark = pytest.mark.anyio

#: module -> names pydocket users import from it (0.15 and 0.27 together)
NAMES = {
    "docket_core": [
        "Agenda",
        "ConcurrencyLimit",
        "CurrentDocket",
        "CurrentExecution",
        "CurrentWorker",
        "Depends",
        "Disposition",
        "Docket",
        "Execution",
        "ExecutionCancelled",
        "ExecutionState",
        "ExponentialRetry",
        "Logged",
        "Perpetual",
        "Progress",
        "Retry",
        "StrikeList",
        "TaskArgument",
        "TaskCall",
        "TaskKey",
        "TaskLogger",
        "Timeout",
        "Worker",
        "testing",
        "__version__",
    ],
    "docket_core.execution": [
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
    ],
    "docket_core.strikelist": [
        "LiteralOperator",
        "Operator",
        "Restore",
        "Strike",
        "StrikeInstruction",
        "StrikeList",
    ],
    "docket_core.docket": ["Docket", "DocketSnapshot", "RunningExecution", "WorkerInfo"],
    "docket_core.agenda": ["Agenda"],
    "docket_core.tasks": ["TaskCollection", "fail", "sleep", "standard_tasks", "trace"],
    "docket_core.testing": [
        "assert_no_tasks",
        "assert_task_count",
        "assert_task_not_scheduled",
        "assert_task_scheduled",
    ],
}


@pytest.mark.parametrize("module", sorted(NAMES))
def test_pydockets_names_are_at_pydockets_paths(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in NAMES[module] if not hasattr(imported, name)]
    assert missing == []


def test_one_object_under_every_path() -> None:
    import docket_core
    from docket_core import execution, strikelist

    for name in ("Operator", "Strike", "Restore", "StrikeList", "StrikeInstruction"):
        assert getattr(execution, name) is getattr(strikelist, name)
    for name in ("Execution", "ExecutionState", "Disposition", "TaskCall", "StrikeList"):
        assert getattr(docket_core, name) is getattr(execution, name)
    assert docket_core.testing is importlib.import_module("docket_core.testing")
    assert docket_core.StateEvent is execution.StateEvent
    assert docket_core.ProgressEvent is execution.ProgressEvent


def _parameters(function: object) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]  # type: ignore[arg-type]


def test_pydockets_parameter_names() -> None:
    from docket_core import Execution, StrikeList, testing
    from docket_core.execution import ExecutionProgress

    expected = ["docket", "function", "args", "kwargs", "key", "when", "attempt"]
    assert _parameters(Execution.__init__)[:7] == expected
    assert _parameters(Execution.get_result) == ["timeout", "deadline"]
    assert _parameters(ExecutionProgress.__init__) == ["docket", "key"]
    assert _parameters(Docket.call) == ["function", "when", "key"]
    assert _parameters(Docket.add_many) == ["calls", "chunk_size"]
    assert _parameters(Docket.replace_many) == ["calls", "chunk_size"]
    assert _parameters(Docket.strike) == ["function", "parameter", "operator", "value"]
    assert _parameters(StrikeList.__init__)[:2] == ["url", "name"]
    assert _parameters(StrikeList.strike) == ["function", "parameter", "operator", "value"]
    assert _parameters(Agenda.add) == ["function", "key"]
    assert _parameters(Agenda.scatter)[:4] == ["docket", "over", "start", "jitter"]
    for assertion in (testing.assert_task_scheduled, testing.assert_task_not_scheduled):
        assert _parameters(assertion) == ["docket", "function", "args", "kwargs", "key"]
    assert _parameters(testing.assert_task_count) == ["docket", "function", "count"]
    assert _parameters(testing.assert_no_tasks) == ["docket"]


# -- Task 'name' is not registered -----------------------------------------------------


async def test_an_unknown_task_name_is_pydockets_key_error(docket: Docket) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    message = r"Task 'nope' is not registered"
    with pytest.raises(KeyError, match=message):
        docket.add("nope")
    with pytest.raises(KeyError, match=message):
        docket.replace("nope", when=later, key="k")
    with pytest.raises(KeyError, match=message):
        docket.call("nope")
    async with docket.batch() as batch:
        with pytest.raises(KeyError, match=message):
            batch.replace("nope", when=later, key="k")
    agenda = Agenda()
    agenda.add("nope")()
    with pytest.raises(KeyError, match=message):
        await agenda.scatter(docket, over=timedelta(seconds=1))
    assert (await docket.snapshot()).future == []


# -- docket_core.tasks -------------------------------------------------------------------


async def test_the_standard_tasks_say_what_pydockets_say(
    docket: Docket, worker: Worker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="docket.task")
    traced = await docket.add("trace", key="traced")("hello")
    slept = await docket.add("sleep", key="slept")(0.01)
    failed = await docket.add("fail", key="failed")("boom")
    await finish(worker, limit=10)

    assert await traced.get_result() is None and await slept.get_result() is None
    lines = [r.getMessage() for r in caplog.records if r.name == "docket.task.trace"]
    assert len(lines) == 1
    expected = f"hello: 'traced' added to docket {docket.name!r} "
    assert lines[0].startswith(expected)
    assert lines[0].endswith(f" ago now running on worker {worker.name!r}")
    sleeping = [r.getMessage() for r in caplog.records if r.name == "docket.task.sleep"]
    assert sleeping == ["Sleeping for 0.01 seconds"]

    with pytest.raises(Exception, match=rf"^boom: failed added to docket {docket.name} ") as raised:
        await failed.get_result()
    assert str(raised.value).endswith(f" ago now running on worker {worker.name}")
    stored = await docket.get_execution("failed")
    assert stored is not None and stored.attempt == 2  # fail is tried twice

"""A worker whose machine fails (docket's own bug) stops with that error
instead of hanging: the failed machine refuses everything, and the runtime
does not ask it to shut down."""

from __future__ import annotations

import anyio
import pytest
from helpers import make_worker

from docket_core import Docket
from docket_core.sansio.errors import InternalError, InvalidTransition
from docket_core.sansio.inputs import TaskEnded
from docket_core.sansio.lifecycle import Phase, Step
from docket_core.sansio.worker import WorkerMachine

pytestmark = pytest.mark.anyio


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


@pytest.mark.backends("memory-asyncio", "memory-trio")
async def test_a_failed_machine_stops_the_worker(
    docket: Docket, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: WorkerMachine, event: TaskEnded) -> None:
        raise InvalidTransition(Phase.DONE, Step.ENDED)

    monkeypatch.setattr(WorkerMachine, "_task_ended", broken)

    async def job() -> None:
        pass

    await docket.add(job)()
    worker = make_worker(docket)
    with anyio.fail_after(5), pytest.raises(BaseException) as caught:
        await worker.run_until_finished()
    leaves = _leaves(caught.value)
    assert any(isinstance(leaf, InvalidTransition) for leaf in leaves), leaves
    assert all(isinstance(leaf, InvalidTransition | InternalError) for leaf in leaves), leaves
    machine = worker._machine
    assert machine is not None and isinstance(machine.failed, InvalidTransition)

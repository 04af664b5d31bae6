"""The admission controls wired into the core: the worker machine asks
``Admit`` after a claim (before a concurrency slot), and reads its verdicts;
``plan_end`` schedules a cron task's next instant and settles runs an
``AdmissionBlocked`` stopped; ``task_policy`` gathers every control of a
call in gate order; the Lua protocol batches admissions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

import attrs
import pytest
from machines import LIMIT, arrival, end, make_machine, message, reply, start

from docket_core import Cooldown, Cron, Debounce, RateLimit
from docket_core.dependencies import task_policy
from docket_core.lua.protocol import Layout, calls_for
from docket_core.sansio.admission import (
    Admit,
    Admitted,
    Blocked,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
    Verdict,
)
from docket_core.sansio.cron import cron_policy
from docket_core.sansio.decisions import plan_end
from docket_core.sansio.effects import AcquireSlot, Finish, Schedule, StartTask
from docket_core.sansio.inputs import (
    BlockedAction,
    FollowUp,
    ReplyLost,
    SlotAcquired,
    TaskEnded,
    TaskOutcome,
)
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.values import ExecutionState, PerpetualPolicy, TaskPolicy

COOLDOWN = CooldownPolicy(key="docket:cooldown:f", window=5.0)
RATE = RateLimitPolicy(key="docket:ratelimit:f", limit=1, per=5.0)


def admit(policy: TaskPolicy, now: float = 1.0) -> tuple[object, Admit]:
    machine = make_machine(redelivery_timeout=30.0, execution_ttl=60.0)
    (effect,) = start(machine, arrival("d1", policy=policy), now=now)
    assert isinstance(effect, Admit)
    return machine, effect


def test_a_controlled_task_is_admitted_after_its_claim() -> None:
    machine, effect = admit(TaskPolicy(admission=(COOLDOWN,)))
    assert effect == Admit(
        delivery_id="d1",
        message=message("key-d1"),
        controls=(COOLDOWN,),
        now=1.0,
        stale_after=30.0,
        ttl=60.0,
    )
    assert machine.in_flight["d1"].phase is Phase.ADMITTING  # type: ignore[attr-defined]
    effects = reply(machine, effect, Admitted(delivery_id="d1", verdict=Verdict.ADMIT))  # type: ignore[arg-type]
    assert effects == [StartTask(delivery_id="d1")]


def test_admission_comes_before_the_concurrency_slot() -> None:
    machine, effect = admit(TaskPolicy(admission=(RATE,), concurrency=LIMIT))
    (acquire,) = reply(machine, effect, Admitted(delivery_id="d1", verdict=Verdict.ADMIT))  # type: ignore[arg-type]
    assert isinstance(acquire, AcquireSlot)
    effects = reply(machine, acquire, SlotAcquired(delivery_id="d1", acquired=True))  # type: ignore[arg-type]
    assert effects == [StartTask(delivery_id="d1")]


@pytest.mark.parametrize(
    ("verdict", "control", "counted"),
    [
        (Verdict.DROP, COOLDOWN, {"cooled_down": 1}),
        (Verdict.RESCHEDULE, RATE, {"rate_limited": 1, "rescheduled": 1}),
        (
            Verdict.RESCHEDULE,
            DebouncePolicy(key="d", settle=1.0),
            {"debounced": 1, "rescheduled": 1},
        ),
    ],
)
def test_a_blocked_delivery_is_counted_and_left_to_the_store(
    verdict: Verdict, control: object, counted: dict[str, int]
) -> None:
    machine, effect = admit(TaskPolicy(admission=(control,)))  # type: ignore[arg-type]
    at = 9.0 if verdict is Verdict.RESCHEDULE else None
    outcome = Admitted(delivery_id="d1", verdict=verdict, at=at, blocked_by=control)  # type: ignore[arg-type]
    effects = reply(machine, effect, outcome)  # type: ignore[arg-type]
    assert effects == [Blocked(delivery_id="d1", key="key-d1", outcome=outcome)]
    assert machine.idle  # type: ignore[attr-defined]
    assert {k: v for k, v in machine.counters.items() if v} == {  # type: ignore[attr-defined]
        "delivered": 1,
        **counted,
    }


def test_a_lost_admission_never_starts() -> None:
    machine, effect = admit(TaskPolicy(admission=(COOLDOWN,)))
    effects = reply(machine, effect, Admitted(delivery_id="d1", verdict=Verdict.LOST))  # type: ignore[arg-type]
    assert effects == []
    assert machine.idle  # type: ignore[attr-defined]
    assert machine.counters["abandoned"] == 1  # type: ignore[attr-defined]


def test_an_admission_the_store_never_answers_is_given_up() -> None:
    machine = make_machine(redelivery_timeout=4.0, retry_delay=0.5)
    (effect,) = start(machine, arrival("d1", policy=TaskPolicy(admission=(COOLDOWN,))))
    for now in (1.0, 2.0, 3.0, 5.0, 9.0):
        machine.receive(ReplyLost(effects=(effect,), now=now, reason="gone"))  # type: ignore[arg-type]
    assert machine.idle
    assert machine.counters["given_up"] >= 1


def test_a_cron_run_is_followed_by_the_next_instant_after_its_end() -> None:
    every_minute = cron_policy("* * * * *")
    policy = TaskPolicy(perpetual=PerpetualPolicy(every=0.0, automatic=True, cron=every_minute))
    instant = datetime(2030, 1, 1, 12, 0, tzinfo=UTC).timestamp()
    scheduled = attrs.evolve(message("cron"), when=instant)

    def after(ended: float, outcome: TaskOutcome) -> Schedule | Finish:
        effect = plan_end(
            delivery_id="d1",
            message=scheduled,
            policy=policy,
            ended=TaskEnded(delivery_id="d1", now=ended, outcome=outcome),
            outcome=outcome,
            error="E: x" if outcome is TaskOutcome.FAILED else None,
            started_at=instant,
            execution_ttl=60.0,
        )
        assert isinstance(effect, Schedule | Finish)
        return effect

    ok = after(instant + 5.0, TaskOutcome.SUCCEEDED)
    failed = after(instant + 5.0, TaskOutcome.FAILED)
    assert isinstance(ok, Schedule) and isinstance(failed, Schedule)
    assert ok.message.when == failed.message.when == instant + 60.0
    assert failed.ended is ExecutionState.FAILED
    # a run that ended "before" its own instant (a slow clock) never repeats it
    assert after(instant - 3.0, TaskOutcome.SUCCEEDED).message.when == instant + 60.0  # type: ignore[union-attr]
    # a long run skips the instants it overran
    assert after(instant + 130.0, TaskOutcome.SUCCEEDED).message.when == instant + 180.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("action", "until", "expected"),
    [
        (BlockedAction.RESCHEDULE, 7.5, Schedule),
        (BlockedAction.DROP, None, ExecutionState.CANCELLED),
        (BlockedAction.HANDLED, None, ExecutionState.FAILED),
    ],
)
def test_a_run_an_admission_blocked_stopped_follows_its_flags(
    action: BlockedAction, until: float | None, expected: object
) -> None:
    follow_up = FollowUp(blocked=action, blocked_until=until)
    effect = plan_end(
        delivery_id="d1",
        message=message("k", attempt=2),
        policy=TaskPolicy(),
        ended=TaskEnded(delivery_id="d1", now=5.0, outcome=TaskOutcome.FAILED, follow_up=follow_up),
        outcome=TaskOutcome.FAILED,
        error="AdmissionBlocked: Task k blocked by gate",
        started_at=4.0,
        execution_ttl=60.0,
    )
    if expected is Schedule:
        assert isinstance(effect, Schedule)
        assert (effect.message.when, effect.message.attempt) == (7.5, 2)
        assert effect.ended is None and effect.acknowledge == "d1"
    else:
        assert isinstance(effect, Finish) and effect.state is expected


def test_a_blocked_run_counts_as_rescheduled() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    follow_up = FollowUp(blocked=BlockedAction.RESCHEDULE, blocked_until=3.0)
    (effect,) = end(machine, "d1", TaskOutcome.FAILED, 1.0, follow_up=follow_up)
    assert isinstance(effect, Schedule)
    assert machine.counters["rescheduled"] == 1
    assert machine.counters["failed"] == machine.counters["perpetuated"] == 0


def test_task_policy_gathers_every_control_in_gate_order() -> None:
    async def task(
        customer: Annotated[int, RateLimit(2, per=timedelta(seconds=10))],
        region: Annotated[str, Cooldown(timedelta(seconds=3), scope="s")],
        debounce: Debounce = Debounce(timedelta(seconds=1)),
    ) -> None: ...

    policy = task_policy(task, "task", "dk", {"customer": 7, "region": "eu"})
    assert policy.admission == (
        DebouncePolicy(key="dk:debounce:task", settle=1.0),
        CooldownPolicy(key="s:cooldown:region:'eu'", window=3.0, scope="s"),
        RateLimitPolicy(key="dk:ratelimit:customer:7", limit=2, per=10.0),
    )


def test_a_cron_declaration_is_a_perpetual_policy() -> None:
    async def nightly(cron: Cron = Cron("@daily")) -> None: ...

    policy = task_policy(nightly, "nightly", "dk", {})
    assert policy.perpetual is not None and policy.perpetual.automatic
    assert policy.perpetual.cron is not None and policy.perpetual.cron.expression == "0 0 * * *"
    with pytest.raises(ValueError, match="invalid cron expression"):
        Cron("61 * * * *")


def test_consecutive_admissions_share_one_script_call() -> None:
    admissions = [
        Admit(
            delivery_id=f"d{i}",
            message=message(f"k{i}"),
            controls=(COOLDOWN,),
            now=1.0,
            stale_after=30.0,
            ttl=60.0,
        )
        for i in range(3)
    ]
    calls = calls_for(Layout("dk"), admissions)
    assert [(call.name, covered) for call, covered in calls] == [("admit", 3)]

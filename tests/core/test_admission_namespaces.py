"""Admission controls of several namespaces (issue 14): one ``Admit`` step
per namespace, in gate order, as the core sequences them.

The worker machine sends a delivery's groups one after another and stops at
the first that does not admit; a block in a scope's namespace is settled by
a step of its own in the docket (``settle_apart``), one in the docket's own
namespace by the store's step.  The Lua protocol runs each step in its
namespace (a cluster routes it to that slot); the memory store checks the
delivery and settles only in the docket's own namespace.  A scope naming
the docket itself is the docket's own namespace.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Annotated

import attrs
import pytest
from machines import LIMIT, arrival, make_machine, message, reply, start

from docket_core import Cooldown, RateLimit
from docket_core.dependencies import task_policy
from docket_core.lua.admission import admit_layout
from docket_core.lua.protocol import GROUP, Layout, calls_for
from docket_core.sansio.admission import (
    Admit,
    Admitted,
    Blocked,
    Control,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
    Verdict,
    admission_groups,
    next_admit,
    settle_apart,
)
from docket_core.sansio.admission_state import RateLog
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
    AcquireSlot,
    Claim,
    ClaimItem,
    Finish,
    Request,
    Schedule,
    StartTask,
)
from docket_core.sansio.inputs import CancelRequested, Claimed, ClaimVerdict, Scheduled
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.values import ExecutionState, ScheduleMode, TaskPolicy
from docket_core.sansio.worker import WorkerMachine
from docket_memory import store as memory_module
from docket_memory.store import MemoryStore

OWN_COOLDOWN = CooldownPolicy(key="dk:cooldown:f", window=5.0)
OWN_RATE = RateLimitPolicy(key="dk:ratelimit:f", limit=1, per=5.0)
SCOPED_DEBOUNCE = DebouncePolicy(key="s:debounce:f", settle=1.0, scope="s")
SCOPED_RATE = RateLimitPolicy(key="s:ratelimit:f", limit=1, per=5.0, scope="s")
OTHER_COOLDOWN = CooldownPolicy(key="t:cooldown:f", window=5.0, scope="t")


def test_groups_follow_the_gate_order_of_their_first_control() -> None:
    controls = (OWN_RATE, OTHER_COOLDOWN, SCOPED_DEBOUNCE, OWN_COOLDOWN, SCOPED_RATE)
    assert admission_groups(controls) == (
        (SCOPED_DEBOUNCE, SCOPED_RATE),
        (OTHER_COOLDOWN,),
        (OWN_COOLDOWN, OWN_RATE),
    )
    assert admission_groups((OWN_COOLDOWN,)) == ((OWN_COOLDOWN,),)


def test_an_admit_judges_one_namespace() -> None:
    with pytest.raises(ValueError, match="one namespace"):
        Admit(
            delivery_id="d1",
            message=message(),
            controls=(OWN_COOLDOWN, SCOPED_RATE),
            now=1.0,
            stale_after=30.0,
            ttl=60.0,
        )
    scoped = Admit(
        delivery_id="d1",
        message=message(),
        controls=(SCOPED_DEBOUNCE, SCOPED_RATE),
        now=1.0,
        stale_after=30.0,
        ttl=60.0,
    )
    assert scoped.scope == "s" and not scoped.settles


def test_a_scope_naming_the_docket_is_its_own_namespace() -> None:
    async def task(
        region: Annotated[str, Cooldown(timedelta(seconds=3), scope="dk")],
        rate: RateLimit = RateLimit(2, per=timedelta(seconds=10), scope="other"),
    ) -> None: ...

    policy = task_policy(task, "task", "dk", {"region": "eu"})
    assert policy.admission == (
        CooldownPolicy(key="dk:cooldown:region:'eu'", window=3.0),
        RateLimitPolicy(key="other:ratelimit:task", limit=2, per=10.0, scope="other"),
    )


# -- the worker machine -------------------------------------------------------------


def _admit(policy: TaskPolicy) -> tuple[WorkerMachine, Admit]:
    machine = make_machine(redelivery_timeout=30.0, execution_ttl=60.0)
    (effect,) = start(machine, arrival("d1", policy=policy), now=1.0)
    assert isinstance(effect, Admit)
    return machine, effect


def test_the_groups_are_sent_one_after_another_while_admitted() -> None:
    policy = TaskPolicy(admission=(SCOPED_DEBOUNCE, OWN_COOLDOWN), concurrency=LIMIT)
    machine, first = _admit(policy)
    assert first.controls == (SCOPED_DEBOUNCE,) and first.request is not None
    admitted = Admitted(delivery_id="d1", verdict=Verdict.ADMIT)
    (second,) = reply(machine, first, admitted, now=2.0)
    assert isinstance(second, Admit)
    assert second.controls == (OWN_COOLDOWN,) and second.now == 2.0
    assert second.request is not None and second.request.seq > first.request.seq
    assert machine.in_flight["d1"].phase is Phase.ADMITTING
    (acquire,) = reply(machine, second, admitted, now=3.0)
    assert isinstance(acquire, AcquireSlot)


def test_a_block_in_a_scope_is_settled_in_the_docket_next() -> None:
    machine, first = _admit(TaskPolicy(admission=(SCOPED_RATE, OWN_COOLDOWN)))
    assert first.controls == (OWN_COOLDOWN,)
    (second,) = reply(machine, first, Admitted(delivery_id="d1", verdict=Verdict.ADMIT))
    assert isinstance(second, Admit) and second.controls == (SCOPED_RATE,)
    blocked = Admitted(delivery_id="d1", verdict=Verdict.RESCHEDULE, at=9.0, blocked_by=SCOPED_RATE)
    effects = reply(machine, second, blocked, now=4.0)
    settle, note = effects
    assert isinstance(settle, Schedule) and settle.request is not None
    assert settle.acknowledge == "d1" and settle.message.when == 9.0 and settle.now == 4.0
    assert settle.mode is ScheduleMode.REPLACE and settle.expect_generation == 1
    assert note == Blocked(delivery_id="d1", key="key-d1", outcome=blocked)
    assert machine.idle
    counted = {name.value: n for name, n in machine.counters.items()}
    assert counted["rate_limited"] == counted["rescheduled"] == 1
    # its answer finds nothing left to do
    accepted = Scheduled(key="key-d1", accepted=True, generation=2, state=None)
    assert reply(machine, settle, accepted) == []


def test_a_drop_in_a_scope_is_recorded_cancelled_in_the_docket() -> None:
    machine, first = _admit(TaskPolicy(admission=(OTHER_COOLDOWN,)))
    dropped = Admitted(delivery_id="d1", verdict=Verdict.DROP, blocked_by=OTHER_COOLDOWN)
    settle, note = reply(machine, first, dropped, now=2.0)
    assert settle == Finish(
        delivery_id="d1",
        key="key-d1",
        generation=1,
        state=ExecutionState.CANCELLED,
        now=2.0,
        ttl=60.0,
    )
    assert isinstance(note, Blocked)


def test_a_block_in_the_first_group_ends_the_sequence() -> None:
    machine, first = _admit(TaskPolicy(admission=(SCOPED_DEBOUNCE, OWN_COOLDOWN)))
    blocked = Admitted(
        delivery_id="d1", verdict=Verdict.RESCHEDULE, at=2.0, blocked_by=SCOPED_DEBOUNCE
    )
    effects = reply(machine, first, blocked)
    assert not any(isinstance(e, Admit) for e in effects)
    assert [type(e) for e in effects] == [Schedule, Blocked]


def test_a_block_in_the_dockets_own_namespace_was_settled_by_its_step() -> None:
    machine, first = _admit(TaskPolicy(admission=(SCOPED_DEBOUNCE, OWN_COOLDOWN)))
    (second,) = reply(machine, first, Admitted(delivery_id="d1", verdict=Verdict.ADMIT))
    dropped = Admitted(delivery_id="d1", verdict=Verdict.DROP, blocked_by=OWN_COOLDOWN)
    effects = reply(machine, second, dropped)
    assert effects == [Blocked(delivery_id="d1", key="key-d1", outcome=dropped)]


def test_a_delivery_cancelled_between_groups_goes_no_further() -> None:
    machine, first = _admit(TaskPolicy(admission=(SCOPED_DEBOUNCE, OWN_COOLDOWN)))
    machine.receive(CancelRequested(key="key-d1", now=1.5))
    effects = reply(machine, first, Admitted(delivery_id="d1", verdict=Verdict.ADMIT))
    assert not any(isinstance(e, Admit | StartTask) for e in effects)
    assert any(isinstance(e, Finish) and e.state is ExecutionState.CANCELLED for e in effects)


def test_next_admit_and_settle_apart_are_pure() -> None:
    controls = (SCOPED_DEBOUNCE, OWN_COOLDOWN)
    first = Admit(
        delivery_id="d1",
        message=message(),
        controls=(SCOPED_DEBOUNCE,),
        now=1.0,
        stale_after=30.0,
        ttl=60.0,
    )
    requests = iter(range(1, 10))

    def request() -> Request:
        return Request(origin="o", worker="w", seq=next(requests), floor=1, remember=60.0)

    second = next_admit(first, controls, 5.0, request)
    assert second is not None and second.controls == (OWN_COOLDOWN,) and second.now == 5.0
    assert next_admit(second, controls, 6.0, request) is None
    admitted = Admitted(delivery_id="d1", verdict=Verdict.ADMIT)
    assert settle_apart(first, admitted, 5.0, request) is None
    dropped = Admitted(delivery_id="d1", verdict=Verdict.DROP, blocked_by=OWN_COOLDOWN)
    assert settle_apart(second, dropped, 6.0, request) is None  # (its own step settled it)
    assert next(requests) == 2  # a request is drawn only for an effect sent


# -- the Lua protocol ---------------------------------------------------------------


def test_each_namespace_runs_in_its_own_call() -> None:
    def admit(i: int, controls: tuple[Control, ...]) -> Admit:
        return Admit(
            delivery_id=f"d{i}",
            message=message(f"k{i}"),
            controls=controls,
            now=1.0,
            stale_after=30.0,
            ttl=60.0,
        )

    layout = Layout("dk")
    effects = [
        admit(1, (OWN_COOLDOWN,)),
        admit(2, (OWN_COOLDOWN,)),
        admit(3, (SCOPED_RATE,)),
        admit(4, (SCOPED_DEBOUNCE,)),
        admit(5, (OWN_COOLDOWN,)),
    ]
    calls = calls_for(layout, effects)
    assert [(call.name, covered) for call, covered in calls] == [
        ("admit", 2),
        ("admit", 2),
        ("admit", 1),
    ]
    own, scoped, again = (call for call, _ in calls)
    assert own.keys == ("{dk}:q", "{dk}:fence") and own.args[:2] == ("{dk}", GROUP)
    assert scoped.keys == ("{s}:q", "{s}:fence") and scoped.args[:2] == ("{s}", GROUP)
    assert again.keys == own.keys
    assert admit_layout(layout, effects[2]) == Layout("s")


# -- the memory store ---------------------------------------------------------------


@pytest.fixture
def memory() -> Iterator[MemoryStore]:
    name, location = f"adm-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    yield MemoryStore(name=name, location=location)
    memory_module._SHELVES.pop((location, name), None)
    memory_module._POOLS.pop(location, None)


async def _held(store: MemoryStore, key: str, worker: str = "w") -> str:
    """A delivery of ``key`` that ``worker`` holds (added, read, claimed)."""
    add = plan_add(key=key, function="f", payload=b"p", when=0.0, mode=ScheduleMode.ADD, now=0.0)
    await store.execute([add])
    read = await store.read(worker=worker, count=1, now=0.0, redelivery_timeout=300, block=0)
    (delivery,) = read.deliveries
    item = ClaimItem(
        delivery_id=delivery.delivery_id, key=key, generation=delivery.message.generation
    )
    request = Request(origin=worker, worker=worker, seq=1000, floor=1, remember=60.0)
    (claimed,) = await store.execute(
        [Claim(worker=worker, items=(item,), now=0.0, request=request)]
    )
    assert claimed == Claimed(verdicts=((delivery.delivery_id, ClaimVerdict.CLAIMED),))
    return delivery.delivery_id


async def _judged(store: MemoryStore, effect: Admit) -> Admitted:
    (outcome,) = await store.execute([effect])
    assert isinstance(outcome, Admitted)
    return outcome


def _effect(delivery_id: str, key: str, controls: tuple[Control, ...], seq: int) -> Admit:
    return Admit(
        delivery_id=delivery_id,
        message=attrs.evolve(message(key), generation=1),
        controls=controls,
        now=1.0,
        stale_after=30.0,
        ttl=60.0,
        request=Request(origin="w", worker="w", seq=seq, floor=1, remember=60.0),
    )


@pytest.mark.anyio
async def test_memory_judges_a_scope_without_settling(memory: MemoryStore) -> None:
    delivery_id = await _held(memory, "k")
    rate = RateLimitPolicy(key="r", limit=1, per=10.0, scope=f"scope-{uuid.uuid4().hex[:6]}")
    full = RateLog(entries=((0.5, "other#1"),))
    memory.shelf.pool(rate.scope).admission[(rate.kind, rate.key)] = (rate, full)
    outcome = await _judged(memory, _effect(delivery_id, "k", (rate,), 1))
    assert outcome.verdict is Verdict.RESCHEDULE and outcome.at == 10.5
    # not settled: the delivery is still held, its record still queued
    assert delivery_id in memory.shelf.held
    record = await memory.get_record("k")
    assert record is not None and record.state is not ExecutionState.SCHEDULED


@pytest.mark.anyio
async def test_memory_answers_lost_when_the_sender_does_not_hold_it(memory: MemoryStore) -> None:
    delivery_id = await _held(memory, "k", worker="other")
    outcome = await _judged(memory, _effect(delivery_id, "k", (OWN_COOLDOWN,), 1))
    assert outcome.verdict is Verdict.LOST
    # nobody holds it (the sender's send was forgotten since): lost too
    outcome = await _judged(memory, _effect("nobody-holds-this", "k", (OWN_COOLDOWN,), 2))
    assert outcome.verdict is Verdict.LOST
    # a scope's step does not look
    scoped = (attrs.evolve(OWN_COOLDOWN, scope=f"s-{uuid.uuid4().hex[:6]}"),)
    outcome = await _judged(memory, _effect(delivery_id, "k", scoped, 3))
    assert outcome.verdict is Verdict.ADMIT


@pytest.mark.anyio
async def test_memory_resend_after_a_takeover_answers_lost(memory: MemoryStore) -> None:
    delivery_id = await _held(memory, "k")
    effect = _effect(delivery_id, "k", (OWN_COOLDOWN,), 1)
    first = await _judged(memory, effect)
    assert first.verdict is Verdict.ADMIT
    memory.shelf.held[delivery_id].worker = "taker"
    again = await _judged(memory, effect)
    assert again.verdict is Verdict.LOST

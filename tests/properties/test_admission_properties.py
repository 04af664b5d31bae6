"""Admission controls decided by the algebra, proven by properties.

A hypothesis ``RuleBasedStateMachine`` plays producers and several workers
over one admission store (``admission_state.decide`` with the store's memo
of first outcomes, as both stores run it): submissions of tasks under a
debounce, a cooldown, two rate limits (one dropping) and a gate of a
cooldown and a rate limit; workers whose clocks are skewed and jump, whose
replies are lost (before or after the store acted) and sent again later,
and who crash after the store acted.  The store settles what it does not
admit in the same step (dropped ends, rescheduled comes back at ``at`` as a
new generation); an admitted delivery whose worker crashed comes back after
the redelivery timeout as the same execution.

Invariants, in the frame of the times the store recorded:

- a debounce admits an execution only ``settle`` after every submission
  since its previous run, never twice without a submission in between (a
  run redelivered after a crash is admitted again as itself), and once
  everything settled, every submission was followed by a run;
- a cooldown never admits two executions within its window, and drops only
  inside the window of a start;
- a rate limit never admits more than ``limit`` starts in any window, and
  holds a start back only when a window holding it is full;
- a resend never acts twice: the store answers it with the first outcome
  and changes nothing; one whose first send never arrived acts at its own time;
- a delivery the store did not admit is settled in the same step: a crash
  after it never brings it back to be judged again.

Below the machine, each rule is mutated and the machine must catch it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from docket_core.sansio import admission_state
from docket_core.sansio.admission import (
    Admit,
    Admitted,
    Control,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
    Verdict,
    gate_order,
)
from docket_core.sansio.admission_state import Address, State, admitted, ask_of, decide
from docket_core.sansio.effects import Request
from docket_core.sansio.values import TaskMessage

DEBOUNCE = DebouncePolicy(key="debounce", settle=3.0)
COOLDOWN = CooldownPolicy(key="cooldown", window=4.0)
RATE = RateLimitPolicy(key="rate", limit=2, per=5.0)
RATE_DROP = RateLimitPolicy(key="rate-drop", limit=1, per=2.0, drop=True, scope="shared")
GATED_COOLDOWN = CooldownPolicy(key="gated-cooldown", window=3.0)
GATED_RATE = RateLimitPolicy(key="gated-rate", limit=1, per=2.5)
#: the controls a task may carry
TASKS: dict[str, tuple[Control, ...]] = {
    "debounced": (DEBOUNCE,),
    "cooled": (COOLDOWN,),
    "rated": (RATE,),
    "dropped": (RATE_DROP,),
    "gated": gate_order([GATED_RATE, GATED_COOLDOWN]),
}
ALL_CONTROLS = tuple(dict.fromkeys(c for controls in TASKS.values() for c in controls))
STALE_AFTER = 8.0
REDELIVERY = 10.0
WORKERS = 3


@attrs.define
class Pending:
    key: str
    generation: int
    task: str
    due: float


@attrs.frozen
class Judged:
    """One admission the store carried out (not a memo answer)."""

    task: str
    key: str
    generation: int
    now: float
    outcome: Admitted
    #: the first admission of this execution the workers saw
    first_start: bool


@attrs.define
class Worker:
    origin: str
    skew: float
    seq: int = 0
    #: effects whose reply was lost (the store may have carried them out)
    unanswered: list[Admit] = attrs.field(factory=list)


class AdmissionStore:
    """The algebra with the store's memo of first outcomes."""

    def __init__(self) -> None:
        self.states: dict[Address, State] = {}
        self.first: dict[tuple[str, int], Admitted] = {}

    def execute(self, effect: Admit) -> tuple[Admitted, bool]:
        """The outcome, and whether the store acted (else: a memo answer)."""
        assert effect.request is not None
        memo = (effect.request.origin, effect.request.seq)
        if memo in self.first:
            return self.first[memo], False
        ruling, writes = decide(effect.controls, self.states, ask_of(effect))
        for where, state in writes.items():
            if state is None:
                self.states.pop(where, None)
            else:
                self.states[where] = state
        outcome = self.first[memo] = admitted(effect, ruling)
        return outcome, True


class AdmissionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.store = AdmissionStore()
        self.workers = [Worker(origin=f"w{i}.0", skew=0.0) for i in range(WORKERS)]
        self.pending: list[Pending] = []
        self.generation = 0
        self.serial = 0
        self.judged: list[Judged] = []
        #: task key -> the generation its producer added
        self.submitted: dict[str, int] = {}
        #: executions (key, generation) the store has admitted
        self.started: set[tuple[str, int]] = set()

    # -- helpers -----------------------------------------------------------------------

    def clock(self, worker: Worker) -> float:
        return self.now + worker.skew

    def new_generation(self) -> int:
        self.generation += 1
        return self.generation

    def admit_effect(self, worker: Worker, item: Pending) -> Admit:
        worker.seq += 1
        request = Request(origin=worker.origin, worker=worker.origin, seq=worker.seq, floor=1,
                          remember=1e9)  # fmt: skip
        message = TaskMessage(
            key=item.key, function=item.task, payload=b"", when=item.due, generation=item.generation
        )
        return Admit(
            delivery_id=f"{item.key}@{item.generation}",
            message=message,
            controls=TASKS[item.task],
            now=self.clock(worker),
            stale_after=STALE_AFTER,
            ttl=60.0,
            request=request,
        )

    def send(self, effect: Admit) -> Admitted:
        before = dict(self.store.states)
        outcome, acted = self.store.execute(effect)
        if not acted:
            # a resend: the first outcome, and nothing changes
            assert self.store.states == before, "a resend acted again"
            return outcome
        message = effect.message
        execution = (message.key, message.generation)
        first_start = outcome.verdict is Verdict.ADMIT and execution not in self.started
        if outcome.verdict is Verdict.RESCHEDULE:
            # settled by the store in the same step: back at ``at``, a new generation
            assert outcome.at is not None and outcome.at > effect.now, outcome
            task = message.function
            self.pending.append(Pending(message.key, self.new_generation(), task, outcome.at))
        if outcome.repeat:
            assert execution in self.started, f"{execution} repeats an admission it never had"
        if outcome.verdict is Verdict.ADMIT:
            self.started.add(execution)
        self.judged.append(
            Judged(
                message.function, message.key, message.generation, effect.now, outcome, first_start
            )
        )
        return outcome

    def redeliver(self, effect: Admit) -> None:
        """The delivery of ``effect`` is handed out again (its worker died
        holding it), unless the store already settled it."""
        first = self.store.first.get((effect.request.origin, effect.request.seq))  # type: ignore[union-attr]
        if first is not None and first.verdict is not Verdict.ADMIT:
            return
        message = effect.message
        due = self.now + REDELIVERY
        self.pending.append(Pending(message.key, message.generation, message.function, due))

    # -- rules -------------------------------------------------------------------------

    @rule(task=st.sampled_from(sorted(TASKS)))
    def submit(self, task: str) -> None:
        self.serial += 1
        key = f"k{self.serial}"
        self.submitted[key] = self.new_generation()
        self.pending.append(Pending(key, self.submitted[key], task, self.now))

    @rule(
        worker=st.integers(0, WORKERS - 1),
        pick=st.integers(0, 1000),
        fault=st.sampled_from(["none"] * 6 + ["lost-after", "lost-before", "crash-after"]),
    )
    def deliver(self, worker: int, pick: int, fault: str) -> None:
        due = [item for item in self.pending if item.due <= self.now]
        if not due:
            return
        item = due[pick % len(due)]
        self.pending.remove(item)
        self.handle(self.workers[worker], item, fault)

    def handle(self, worker: Worker, item: Pending, fault: str) -> None:
        effect = self.admit_effect(worker, item)
        if fault == "lost-before":
            worker.unanswered.append(effect)
            return
        self.send(effect)
        if fault == "lost-after":
            worker.unanswered.append(effect)
        elif fault == "crash-after":
            self.redeliver(effect)
        # admitted, the task runs and ends; otherwise the store settled it

    @rule(pick=st.integers(0, 1000))
    def stall(self, pick: int) -> None:
        """A worker dies holding a due delivery it has not judged yet: the
        delivery comes back after the redelivery timeout."""
        due = [item for item in self.pending if item.due <= self.now]
        if due:
            due[pick % len(due)].due = self.now + REDELIVERY

    @rule(worker=st.integers(0, WORKERS - 1))
    def resend(self, worker: int) -> None:
        sender = self.workers[worker]
        unanswered, sender.unanswered = sender.unanswered, []
        for effect in unanswered:
            # the resend carries the time of its own attempt
            self.send(attrs.evolve(effect, now=self.clock(sender)))

    @rule(worker=st.integers(0, WORKERS - 1), skew=st.floats(-0.5, 0.5))
    def crash(self, worker: int, skew: float) -> None:
        """The worker dies: what it held comes back after the redelivery
        timeout; it restarts with a new origin (and its clock)."""
        old = self.workers[worker]
        for effect in old.unanswered:
            self.redeliver(effect)
        generation = int(old.origin.rsplit(".", 1)[1]) + 1
        self.workers[worker] = Worker(origin=f"w{worker}.{generation}", skew=skew)

    @rule(worker=st.integers(0, WORKERS - 1), skew=st.floats(-0.5, 0.5))
    def skew_clock(self, worker: int, skew: float) -> None:
        self.workers[worker].skew = skew

    @rule(step=st.sampled_from([0.1, 0.25, 0.5, 1.0, 2.0, 3.0]))
    def tick(self, step: float) -> None:
        self.now += step

    @rule(jump=st.sampled_from([6.0, 15.0, 40.0]))
    def jump(self, jump: float) -> None:
        self.now += jump

    # -- invariants --------------------------------------------------------------------

    def of(self, control: Control) -> Iterator[Judged]:
        return (j for j in self.judged if control in TASKS[j.task])

    @invariant()
    def debounce_runs_once_per_quiet_period(self) -> None:
        latest_submission: float | None = None
        submitted_since_run = True
        ran: set[tuple[str, int]] = set()
        for j in self.of(DEBOUNCE):
            outcome = j.outcome
            if (j.key, j.generation) in ran:
                # a run redelivered (its worker crashed) runs again as itself
                assert outcome.verdict is Verdict.ADMIT and outcome.repeat, j
                continue
            if outcome.verdict is Verdict.ADMIT:
                ran.add((j.key, j.generation))
            if outcome.verdict is Verdict.ADMIT:
                assert submitted_since_run, f"a second run without a submission: {j}"
                assert latest_submission is not None
                assert j.now >= latest_submission + DEBOUNCE.settle, f"ran before quiet: {j}"
                submitted_since_run, latest_submission = False, None
            elif self.is_submission(j):
                submitted_since_run = True
                latest = j.now if latest_submission is None else max(latest_submission, j.now)
                latest_submission = latest

    def is_submission(self, j: Judged) -> bool:
        """A producer's submission: the first judgment of an execution a
        producer added (not a winner coming back, nor a redelivery)."""
        return j.generation == self.submitted.get(j.key) and j is next(
            other for other in self.judged if (other.key, other.generation) == (j.key, j.generation)
        )

    @invariant()
    def cooldowns_never_admit_two_in_a_window(self) -> None:
        for control in (COOLDOWN, GATED_COOLDOWN):
            assert isinstance(control, CooldownPolicy)
            starts: list[float] = []
            earlier: list[float] = []  # every start before, repeats of expired ones too
            for j in self.of(control):
                if j.first_start:
                    if starts:
                        assert j.now >= starts[-1] + control.window, f"{control}: {j}"
                    starts.append(j.now)
                if j.outcome.verdict is not Verdict.ADMIT and j.outcome.blocked_by == control:
                    # (a slow clock may be dropped by a start "after" it)
                    assert any(j.now < t + control.window for t in earlier), f"{control}: {j}"
                if j.outcome.verdict is Verdict.ADMIT and not j.outcome.repeat:
                    earlier.append(j.now)

    def all_starts(self, control: Control) -> list[float]:
        return [
            j.now
            for j in self.of(control)
            if j.outcome.verdict is Verdict.ADMIT and not j.outcome.repeat
        ]

    @invariant()
    def rate_limits_never_exceed_their_windows(self) -> None:
        for control in (RATE, RATE_DROP, GATED_RATE):
            assert isinstance(control, RateLimitPolicy)
            starts = sorted(j.now for j in self.of(control) if j.first_start)
            for x in starts:
                inside = [t for t in starts if t <= x and t + control.per > x]
                assert len(inside) <= control.limit, f"{control}: {inside}"
            every = self.all_starts(control)
            for j in self.of(control):
                if j.outcome.blocked_by != control:
                    continue
                assert j.outcome.verdict is (Verdict.DROP if control.drop else Verdict.RESCHEDULE)
                points = [j.now, *(t for t in every if j.now < t < j.now + control.per)]
                assert any(
                    sum(1 for t in every if t <= x and t + control.per > x) >= control.limit
                    for x in points
                ), f"held back with room in every window: {j}"

    def teardown(self) -> None:
        """Faults stop; every delivery and resend is carried out; then every
        debounced submission has been followed by a run."""
        for worker in self.workers:
            worker.skew = 0.0  # (a clock behind would never see its due time come)
        for _ in range(5000):
            for worker in self.workers:
                if worker.unanswered:
                    self.resend(self.workers.index(worker))
            if not self.pending:
                break
            soonest = min(item.due for item in self.pending)
            self.now = max(self.now, soonest)
            item = next(item for item in self.pending if item.due <= self.now)
            self.pending.remove(item)
            self.handle(self.workers[0], item, "none")
        else:
            raise AssertionError("admissions never settled")
        self.debounce_runs_once_per_quiet_period()
        self.cooldowns_never_admit_two_in_a_window()
        self.rate_limits_never_exceed_their_windows()
        last_run = max(
            (i for i, j in enumerate(self.judged) if j.task == "debounced" and j.first_start),
            default=-1,
        )
        unserved = [
            j
            for j in self.judged[last_run + 1 :]
            if j.task == "debounced" and self.is_submission(j)
        ]
        assert not unserved, f"debounced submissions never followed by a run: {unserved}"


SETTINGS = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
AdmissionMachine.TestCase.settings = SETTINGS
TestAdmission = AdmissionMachine.TestCase


# -- mutations: each rule, broken, must be caught ---------------------------------------


def _debounce_loser_is_not_seen(original: Callable[..., Any]) -> Callable[..., Any]:
    def settle(p: Any, j: Any, ruling: Any, ask: Any) -> Any:
        if j.verdict is Verdict.DROP:
            return j.state
        return original(p, j, ruling, ask)

    return settle


def _debounce_winner_does_not_wait(original: Callable[..., Any]) -> Callable[..., Any]:
    def judge(p: Any, st: Any, ask: Any) -> Any:
        j = original(p, st, ask)
        if j.verdict is Verdict.RESCHEDULE and not j.newcomer:
            return attrs.evolve(j, verdict=Verdict.ADMIT, at=None)
        return j

    return judge


def _debounce_loser_also_waits(original: Callable[..., Any]) -> Callable[..., Any]:
    def judge(p: Any, st: Any, ask: Any) -> Any:
        j = original(p, st, ask)
        if j.verdict is Verdict.DROP:
            return attrs.evolve(j, verdict=Verdict.RESCHEDULE, at=ask.now + p.settle)
        return j

    return judge


def _debounce_forgets(field: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def mutate(original: Callable[..., Any]) -> Callable[..., Any]:
        def judge(p: Any, st: Any, ask: Any) -> Any:
            return original(p, None if st is None else attrs.evolve(st, **{field: ()}), ask)

        return judge

    return mutate


def _cooldown_window_too_short(original: Callable[..., Any]) -> Callable[..., Any]:
    def settle(p: Any, j: Any, ruling: Any, ask: Any) -> Any:
        return original(attrs.evolve(p, window=p.window / 2), j, ruling, ask)

    return settle


def _cooldown_window_too_long(original: Callable[..., Any]) -> Callable[..., Any]:
    def settle(p: Any, j: Any, ruling: Any, ask: Any) -> Any:
        return original(attrs.evolve(p, window=p.window * 2), j, ruling, ask)

    return settle


def _cooldown_opens_early(original: Callable[..., Any]) -> Callable[..., Any]:
    def judge(p: Any, st: Any, ask: Any) -> Any:
        return original(p, st, attrs.evolve(ask, now=ask.now + 1.0))

    return judge


def _rate_one_too_many(original: Callable[..., Any]) -> Callable[..., Any]:
    def fits(window: Any, now: float, per: float, limit: int) -> bool:
        return bool(original(window, now, per, limit + 1))

    return fits


def _rate_ignores_later_starts(original: Callable[..., Any]) -> Callable[..., Any]:
    def fits(window: Any, now: float, per: float, limit: int) -> bool:
        return sum(1 for s in window if s <= now) < limit

    return fits


def _rate_window_too_long(original: Callable[..., Any]) -> Callable[..., Any]:
    def judge(p: Any, log: Any, ask: Any) -> Any:
        return original(attrs.evolve(p, per=p.per * 2), log, ask)

    return judge


MUTANTS = {
    "debounce-loser-not-seen": ("_settle_debounce", _debounce_loser_is_not_seen),
    "debounce-winner-does-not-wait": ("_judge_debounce", _debounce_winner_does_not_wait),
    "debounce-loser-also-waits": ("_judge_debounce", _debounce_loser_also_waits),
    "debounce-forgets-its-runs": ("_judge_debounce", _debounce_forgets("ran")),
    "debounce-forgets-lost-winners": ("_judge_debounce", _debounce_forgets("displaced")),
    "cooldown-window-too-short": ("_settle_cooldown", _cooldown_window_too_short),
    "cooldown-window-too-long": ("_settle_cooldown", _cooldown_window_too_long),
    "cooldown-opens-early": ("_judge_cooldown", _cooldown_opens_early),
    "rate-one-too-many": ("_fits", _rate_one_too_many),
    "rate-ignores-later-starts": ("_fits", _rate_ignores_later_starts),
    "rate-window-too-long": ("_judge_rate", _rate_window_too_long),
}


@contextmanager
def mutated(name: str) -> Iterator[None]:
    function, mutate = MUTANTS[name]
    original = getattr(admission_state, function)
    setattr(admission_state, function, mutate(original))
    try:
        yield
    finally:
        setattr(admission_state, function, original)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_machine_catches_a_broken_rule(mutant: str) -> None:
    hunting = settings(
        SETTINGS, max_examples=3000, database=None, phases=[p for p in SETTINGS.phases if
        p.name != "shrink"]
    )  # fmt: skip
    with mutated(mutant), pytest.raises((AssertionError, Flaky)):
        run_state_machine_as_test(AdmissionMachine, settings=hunting)

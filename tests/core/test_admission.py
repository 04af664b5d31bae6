"""The admission algebra, rule by rule: debounce, cooldown, rate limit, the
gate that combines them, and what follows a verdict (``plan_blocked``)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from docket_core.sansio.admission import (
    Admit,
    Admitted,
    Control,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
    Verdict,
    block_reason,
    blocked_counts,
    blocked_message,
    execution_id,
    gate_order,
    settlement,
)
from docket_core.sansio.admission_state import (
    Address,
    Ask,
    DebounceState,
    RateLog,
    Ruling,
    State,
    address,
    admitted,
    ask_of,
    decide,
    expiry,
)
from docket_core.sansio.effects import Finish, Schedule
from docket_core.sansio.values import ExecutionState, ScheduleMode, TaskMessage

DEBOUNCE = DebouncePolicy(key="d", settle=5.0)
COOLDOWN = CooldownPolicy(key="c", window=10.0)
RATE = RateLimitPolicy(key="r", limit=2, per=10.0)
STALE = 30.0


class Store:
    """The algebra's states, as a store keeps them."""

    def __init__(self) -> None:
        self.states: dict[Address, State] = {}

    def admit(
        self, controls: Sequence[Control], key: str, now: float, generation: int = 1
    ) -> Ruling:
        ask = Ask(key=key, execution=execution_id(key, generation), now=now, stale_after=STALE)
        ruling, writes = decide(controls, self.states, ask)
        for where, state in writes.items():
            if state is None:
                self.states.pop(where, None)
            else:
                self.states[where] = state
        return ruling


# -- debounce ------------------------------------------------------------------------


def test_debounce_runs_the_first_submission_once_after_settle_of_quiet() -> None:
    store = Store()
    first = store.admit([DEBOUNCE], "a", 100.0)
    assert first == Ruling(verdict=Verdict.RESCHEDULE, at=105.0, blocker=0)
    # later submissions are dropped, and push the quiet period on
    assert store.admit([DEBOUNCE], "b", 102.0).verdict is Verdict.DROP
    assert store.admit([DEBOUNCE], "c", 103.0).verdict is Verdict.DROP
    # the winner, back at 105, waits for 5 s of quiet after the last one
    back = store.admit([DEBOUNCE], "a", 105.0, generation=2)
    assert back == Ruling(verdict=Verdict.RESCHEDULE, at=108.0, blocker=0)
    assert store.admit([DEBOUNCE], "a", 108.0, generation=3) == Ruling(verdict=Verdict.ADMIT)
    # a new quiet period begins with the next submission
    assert store.admit([DEBOUNCE], "d", 109.0).at == 114.0


def test_debounce_readmits_the_execution_it_admitted_and_only_it() -> None:
    store = Store()
    store.admit([DEBOUNCE], "a", 100.0)
    store.admit([DEBOUNCE], "a", 105.0, generation=2)
    again = store.admit([DEBOUNCE], "a", 170.0, generation=2)  # a redelivery after a crash
    assert again == Ruling(verdict=Verdict.ADMIT, repeat=True)
    # the same key with a newer generation is a new submission
    assert store.admit([DEBOUNCE], "a", 171.0, generation=3).verdict is Verdict.RESCHEDULE


def test_a_debounce_winner_that_overstays_its_return_is_replaced() -> None:
    store = Store()
    store.admit([DEBOUNCE], "a", 100.0)  # due back at 105; presumed lost at 135
    assert store.admit([DEBOUNCE], "b", 134.0).verdict is Verdict.DROP
    takeover = store.admit([DEBOUNCE], "c", 135.0)
    assert takeover == Ruling(verdict=Verdict.RESCHEDULE, at=140.0, blocker=0)
    # the old winner, back at last, is a loser now: only "c" will run
    assert store.admit([DEBOUNCE], "a", 136.0, generation=2).verdict is Verdict.DROP
    assert store.admit([DEBOUNCE], "c", 141.0, generation=2).verdict is Verdict.ADMIT
    state = store.states[address(DEBOUNCE)]
    assert isinstance(state, DebounceState) and state.displaced == ()
    # dropped once (the drop settled it), its key is free: a later
    # submission of "a" is a new one, not a lost winner back
    later = store.admit([DEBOUNCE], "a", 150.0, generation=3)
    assert later == Ruling(verdict=Verdict.RESCHEDULE, at=155.0, blocker=0)


def test_a_lost_winner_is_remembered_until_it_comes_back() -> None:
    store = Store()
    store.admit([DEBOUNCE], "a", 100.0)
    store.admit([DEBOUNCE], "b", 135.0)  # takes over: "a" is displaced
    state = store.states[address(DEBOUNCE)]
    assert isinstance(state, DebounceState) and state.displaced == ("a",)
    assert store.admit([DEBOUNCE], "b", 140.0, generation=2).verdict is Verdict.ADMIT
    # after "b" ran, "a" back at last is still the lost winner: dropped
    assert store.admit([DEBOUNCE], "a", 150.0, generation=2).verdict is Verdict.DROP


def test_debounce_follows_the_latest_submission_even_from_a_faster_clock() -> None:
    store = Store()
    store.admit([DEBOUNCE], "a", 100.0)
    store.admit([DEBOUNCE], "b", 104.0)  # a clock ahead of the winner's
    # the winner's clock says 106, but quiet began at 104 (never moves back)
    store.admit([DEBOUNCE], "c", 103.0)
    assert store.admit([DEBOUNCE], "a", 106.0, generation=2).at == 109.0


# -- cooldown ------------------------------------------------------------------------


def test_cooldown_runs_the_first_and_drops_the_rest_of_the_window() -> None:
    store = Store()
    assert store.admit([COOLDOWN], "a", 100.0) == Ruling(verdict=Verdict.ADMIT)
    assert store.admit([COOLDOWN], "b", 109.9) == Ruling(verdict=Verdict.DROP, blocker=0)
    assert store.admit([COOLDOWN], "c", 95.0).verdict is Verdict.DROP  # a slow clock
    assert store.admit([COOLDOWN], "a", 105.0).repeat  # the starter, redelivered
    assert store.admit([COOLDOWN], "d", 110.0).verdict is Verdict.ADMIT


# -- rate limit ----------------------------------------------------------------------


def test_rate_limit_admits_limit_starts_per_window_and_reschedules_the_rest() -> None:
    store = Store()
    assert store.admit([RATE], "a", 100.0).verdict is Verdict.ADMIT
    assert store.admit([RATE], "b", 103.0).verdict is Verdict.ADMIT
    blocked = store.admit([RATE], "c", 104.0)
    assert blocked == Ruling(verdict=Verdict.RESCHEDULE, at=110.0, blocker=0)
    assert store.admit([RATE], "c", 110.0, generation=2).verdict is Verdict.ADMIT
    assert store.admit([RATE], "d", 112.0).at == 113.0


def test_a_dropping_rate_limit_drops_the_excess() -> None:
    store = Store()
    dropping = RateLimitPolicy(key="r", limit=1, per=10.0, drop=True)
    store.admit([dropping], "a", 100.0)
    assert store.admit([dropping], "b", 101.0) == Ruling(verdict=Verdict.DROP, blocker=0)


def test_rate_limit_counts_starts_a_faster_clock_recorded_ahead() -> None:
    store = Store()
    store.admit([RATE], "a", 96.0)
    store.admit([RATE], "b", 96.5)
    # a fast clock: both are older than its window, so it starts at 106.6
    assert store.admit([RATE], "fast", 106.6).verdict is Verdict.ADMIT
    # a slow clock at 105.9: (95.9, 105.9] already holds 96 and 96.5
    slow = store.admit([RATE], "slow", 105.9)
    assert slow.verdict is Verdict.RESCHEDULE and slow.at == 106.5
    # and a start whose windows reach the fast one's start later
    future = RateLimitPolicy(key="f", limit=1, per=10.0)
    store.admit([future], "x", 120.0)
    assert store.admit([future], "y", 112.0) == Ruling(
        verdict=Verdict.RESCHEDULE, at=130.0, blocker=0
    )


def test_rate_limit_forgets_starts_two_windows_old() -> None:
    store = Store()
    store.admit([RATE], "a", 100.0)
    log = store.states[address(RATE)]
    assert isinstance(log, RateLog) and expiry(RATE, log) == 120.0
    store.admit([RATE], "b", 120.0)
    assert store.states[address(RATE)] == RateLog(entries=((120.0, "b#1"),))


# -- the gate ------------------------------------------------------------------------


def test_the_gate_consults_debounce_then_cooldown_then_rate_limits() -> None:
    assert gate_order([RATE, COOLDOWN, DEBOUNCE, RATE]) == (DEBOUNCE, COOLDOWN, RATE)


def test_the_first_blocking_control_decides_and_the_rest_record_nothing() -> None:
    store = Store()
    controls = gate_order([COOLDOWN, RATE])
    assert store.admit(controls, "a", 100.0).verdict is Verdict.ADMIT
    # the cooldown drops "b": the rate limit never counts it
    assert store.admit(controls, "b", 101.0) == Ruling(verdict=Verdict.DROP, blocker=0)
    log = store.states[address(RATE)]
    assert isinstance(log, RateLog) and len(log.entries) == 1


def test_a_settled_debounce_winner_that_a_rate_limit_holds_back_keeps_winning() -> None:
    store = Store()
    tight = RateLimitPolicy(key="r", limit=1, per=10.0)
    store.admit([tight], "other", 99.0)
    controls = gate_order([DEBOUNCE, tight])
    store.admit(controls, "a", 100.0)
    held = store.admit(controls, "a", 105.0, generation=2)
    assert held == Ruling(verdict=Verdict.RESCHEDULE, at=109.0, blocker=1)
    state = store.states[address(DEBOUNCE)]
    assert isinstance(state, DebounceState) and state.winner == "a" and state.due == 109.0
    assert store.admit(controls, "b", 106.0).verdict is Verdict.DROP  # still debounced
    assert store.admit(controls, "a", 111.0, generation=3).verdict is Verdict.ADMIT


def test_a_cooldown_does_not_start_when_a_later_control_blocks() -> None:
    store = Store()
    tight = RateLimitPolicy(key="r", limit=1, per=10.0)
    store.admit([tight], "other", 100.0)
    controls = gate_order([COOLDOWN, tight])
    assert store.admit(controls, "a", 101.0).verdict is Verdict.RESCHEDULE
    assert address(COOLDOWN) not in store.states
    assert store.admit(controls, "a", 110.0, generation=2).verdict is Verdict.ADMIT


def test_no_controls_admit() -> None:
    assert Store().admit([], "a", 1.0) == Ruling(verdict=Verdict.ADMIT)


def test_policies_refuse_numbers_the_scripts_cannot_take() -> None:
    with pytest.raises(ValueError):
        RateLimitPolicy(key="r", limit=0, per=1.0)
    with pytest.raises(ValueError):
        RateLimitPolicy(key="r", limit=1, per=0.0)
    with pytest.raises(ValueError):
        CooldownPolicy(key="c", window=float("inf"))
    with pytest.raises(ValueError):
        DebouncePolicy(key="d", settle=-1.0)


# -- the effect, its outcome, and what follows ----------------------------------------

MESSAGE = TaskMessage(key="k", function="f", payload=b"p", when=50.0, attempt=2, generation=7)


def admit_effect(controls: tuple[Control, ...]) -> Admit:
    return Admit(
        delivery_id="d1",
        message=MESSAGE,
        controls=controls,
        now=100.0,
        stale_after=STALE,
        ttl=60.0,
    )


def test_an_effect_asks_for_its_execution_and_names_the_blocking_control() -> None:
    effect = admit_effect((COOLDOWN, RATE))
    assert ask_of(effect) == Ask(key="k", execution="k#7", now=100.0, stale_after=STALE)
    outcome = admitted(effect, Ruling(verdict=Verdict.RESCHEDULE, at=110.0, blocker=1))
    assert outcome == Admitted(
        delivery_id="d1", verdict=Verdict.RESCHEDULE, at=110.0, blocked_by=RATE
    )
    assert blocked_counts(outcome) == ("rate_limited", "rescheduled")


def test_a_reschedule_replaces_the_message_at_its_time_and_acknowledges_it() -> None:
    outcome = Admitted(delivery_id="d1", verdict=Verdict.RESCHEDULE, at=110.0, blocked_by=RATE)
    effect = settlement(admit_effect((RATE,)), outcome)
    assert isinstance(effect, Schedule)
    assert effect.message.when == 110.0 and effect.message.attempt == 2
    assert effect.mode is ScheduleMode.REPLACE and effect.now == 100.0
    assert effect.acknowledge == "d1" and effect.expect_generation == 7


def test_a_drop_records_the_delivery_cancelled() -> None:
    outcome = Admitted(delivery_id="d1", verdict=Verdict.DROP, blocked_by=COOLDOWN)
    effect = settlement(admit_effect((COOLDOWN,)), outcome)
    assert isinstance(effect, Finish)
    assert (effect.state, effect.generation, effect.ttl) == (ExecutionState.CANCELLED, 7, 60.0)
    assert effect.delivery_id == "d1"
    assert blocked_counts(outcome) == ("cooled_down",)
    with pytest.raises(ValueError):
        settlement(admit_effect(()), Admitted(delivery_id="d1", verdict=Verdict.ADMIT))


def test_reasons_are_worded_as_pydockets() -> None:
    assert block_reason(DEBOUNCE) == "debounce (0:00:05) on d"
    assert block_reason(COOLDOWN) == "cooldown (0:00:10) on c"
    assert block_reason(RATE) == "rate limit (2/0:00:10) on r"
    dropped = Admitted(delivery_id="d1", verdict=Verdict.DROP, blocked_by=COOLDOWN)
    assert blocked_message("k", dropped) == (
        "⏭ Task k blocked by admission control, dropping (cooldown (0:00:10) on c)"
    )

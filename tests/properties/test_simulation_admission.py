"""The simulator's admission controls (``docket_memory.simulate.ADMISSION``):
bounded seeds keep every rule, and a store that breaks one rule of the
admission algebra is caught."""

from __future__ import annotations

from typing import Any

import pytest

from docket_core.sansio import admission_state
from docket_core.sansio.admission import Verdict
from docket_memory import simulate
from docket_memory.simulate import InvariantViolated


def _violation(seeds: range, steps: int = 5000) -> str:
    for seed in seeds:
        try:
            simulate.simulate(seed, steps)
        except InvariantViolated as violation:
            return str(violation)
    return ""


@pytest.mark.parametrize("seed", range(6))
def test_the_controls_keep_their_rules_through_faults(seed: int) -> None:
    simulation = simulate.simulate(seed, 4000)
    counters: dict[str, int] = {}
    for worker in simulation.workers:
        for name, count in worker.machine.counters.items():
            counters[name] = counters.get(name, 0) + count
    admitted = {where[1]: len(starts) for where, starts in simulation.admitted.items()}
    # every kind of control admitted starts, and blocked others
    assert set(admitted) == {"debounce", "cooldown", "ratelimit"}
    assert len(simulation.judged) > sum(admitted.values())


def test_a_rate_limit_that_admits_one_too_many_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    fits = admission_state._fits
    monkeypatch.setattr(
        admission_state, "_fits", lambda w, now, per, limit: fits(w, now, per, limit + 1)
    )
    assert "starts within" in _violation(range(10))


def test_a_cooldown_that_never_drops_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    judge = admission_state._judge_cooldown

    def never_drops(*args: Any) -> Any:
        judgement = judge(*args)
        if judgement.verdict is Verdict.DROP:
            return admission_state._Judgement(verdict=Verdict.ADMIT, state=judgement.state)
        return judgement

    monkeypatch.setattr(admission_state, "_judge_cooldown", never_drops)
    assert "cooldown admitted two starts" in _violation(range(10))


def test_a_debounce_winner_that_does_not_wait_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    judge = admission_state._judge_debounce

    def impatient(*args: Any) -> Any:
        judgement = judge(*args)
        if judgement.verdict is Verdict.RESCHEDULE and not judgement.newcomer:
            return admission_state._Judgement(verdict=Verdict.ADMIT, state=judgement.state)
        return judgement

    monkeypatch.setattr(admission_state, "_judge_debounce", impatient)
    assert "before it settled" in _violation(range(20))

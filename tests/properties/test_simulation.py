"""The deterministic simulator: bounded seeds in CI, and proof that its
invariant checks catch the bugs they are meant to catch."""

from __future__ import annotations

import pytest

from docket_core.sansio.effects import Effect, ReleaseSlot
from docket_core.sansio.inputs import SlotAcquired
from docket_core.sansio.outbox import Outbox
from docket_core.sansio.worker import InFlight, WorkerMachine
from docket_memory import simulate, slots
from docket_memory.shelf import Pool, Shelf
from docket_memory.simulate import InvariantViolated, Simulation
from docket_memory.store import MemoryStore


@pytest.mark.parametrize("seed", range(12))
def test_simulation_keeps_every_invariant(seed: int) -> None:
    simulation = simulate.simulate(seed, 3000)
    assert simulation.steps == 3000
    assert len(simulation.accepted) > 100
    started = sum(w.machine.counters["started"] for w in simulation.workers)
    parked = sum(w.machine.counters["parked"] for w in simulation.workers)
    # the workload must really exercise the interesting paths
    assert started > 0 or parked > 0


@pytest.mark.parametrize("seed", [88, 265, 2002])
def test_the_seeds_that_found_bugs_keep_every_invariant(seed: int) -> None:
    """Seeds that broke an invariant in session 18 (a run started after its
    lease's fence: two runs under a limit of one; a resend past the store's
    memory, judged again).  A change of the code shifts their paths, so they
    guard loosely; the sweeps of ``python -m docket_memory.simulate`` are the
    real check."""
    simulation = simulate.simulate(seed, 20_000)
    assert simulation.steps == 20_000


def test_the_command_reports_steps_per_second(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate.main(["--seed", "3", "--steps", "500"]) == 0
    out = capsys.readouterr().out
    assert "seed 3: 500 steps" in out
    assert "steps/s" in out


def _run_until_violation(seeds: range, steps: int, remember_outcomes: bool = True) -> str:
    for seed in seeds:
        try:
            simulate.simulate(seed, steps, remember_outcomes=remember_outcomes)
        except InvariantViolated as violation:
            return str(violation)
    return ""


def test_a_store_that_ignores_limits_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: every acquisition (``AcquireSlot``, or a ``SlotStep``'s take)
    finds a slot."""
    monkeypatch.setattr(slots, "_take_from", lambda *arguments: True)
    assert "tasks run under" in _run_until_violation(range(5), 3000)


def test_a_worker_that_runs_past_its_concurrency_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a worker that sends every delivery on at once and never
    counts its runs (no backlog, no ``READY``)."""
    monkeypatch.setattr(WorkerMachine, "_room", lambda self: 1_000)
    monkeypatch.setattr(
        WorkerMachine, "_runs", property(lambda self: 0, lambda self, n: None), raising=False
    )
    assert "functions at once" in _run_until_violation(range(5), 3000)


def test_releasing_a_slot_never_acquired_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pydocket 0.15 bug: a blocked delivery released the slot anyway."""
    original = WorkerMachine._slot

    def release_when_parked(
        self: WorkerMachine, outcome: SlotAcquired, now: float, taken_at: float
    ) -> None:
        flight: InFlight | None = self.in_flight.get(outcome.delivery_id)
        original(self, outcome, now, taken_at)
        if flight is not None and not outcome.acquired and flight.policy.concurrency:
            self._effects.append(
                ReleaseSlot(
                    limit_key=flight.policy.concurrency.limit_key,
                    holder=self.holder(outcome.delivery_id),
                    now=now,
                )
            )

    monkeypatch.setattr(WorkerMachine, "_slot", release_when_parked)
    # (an ``AcquireSlot`` the store denies is rare in the simulation: about
    # one run in twenty meets one, so the search spans forty seeds)
    assert "does not hold" in _run_until_violation(range(40), 3000)


def test_a_store_that_hands_out_leased_messages_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = simulate.Simulation.read

    def read_ignoring_leases(self: Simulation, worker: simulate.SimWorker) -> None:
        for held in self.shelf.held.values():
            held.renewed_at = -1e12  # every lease looks expired
        original(self, worker)

    monkeypatch.setattr(simulate.Simulation, "read", read_ignoring_leases)
    violation = _run_until_violation(range(5), 3000)
    assert "two live workers" in violation or "runs while it" in violation


def test_a_store_that_drops_messages_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = simulate.Simulation.add

    def add_then_lose(self: Simulation) -> None:
        original(self)
        if self.rng.random() < 0.05 and self.shelf.future:
            key = next(iter(self.shelf.future))
            del self.shelf.future[key]
            del self.shelf.records[key]

    monkeypatch.setattr(simulate.Simulation, "add", add_then_lose)
    assert "vanished" in _run_until_violation(range(30), 3000)


def test_a_store_that_keeps_a_shared_scope_per_docket_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gap a scope closes: each docket limiting only its own tasks (its
    share of the shared concurrency limit, or of the shared rate limit)."""
    original = Shelf.pool

    def own_pool_only(self: Shelf, scope: str | None = None) -> Pool:
        return original(self, None)

    monkeypatch.setattr(Shelf, "pool", own_pool_only)
    violation = _run_until_violation(range(5), 3000)
    assert "tasks run under" in violation or "rate admitted" in violation


def test_a_store_that_acts_again_on_a_resend_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chaos run's failure: a resent acquisition whose first send parked
    takes a freed slot, so the task runs while it also waits (or is queued
    again) for a second run."""
    # the store before the fix: no memory of outcomes, no check of the holder
    monkeypatch.setattr(MemoryStore, "_holds", lambda self, request, delivery_id: True)
    monkeypatch.setattr(MemoryStore, "_sender_holds", lambda self, request, delivery_id: True)
    violation = _run_until_violation(range(60), 3000, remember_outcomes=False)
    # (or a second copy of the run took a second slot of its limit)
    symptoms = ("runs while it", "queued twice", "tasks run under")
    assert any(symptom in violation for symptom in symptoms), violation


def test_a_machine_that_resends_its_first_now_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the fix the runtime resent a batch as it was: with the first
    send's ``now``, and with a store that acts again."""

    original = Outbox.resend

    def resend_as_sent(self: Outbox, now: float, held: list[Effect]) -> list[Effect] | None:
        failed = list(self._failed)
        resent = original(self, now, held)
        return None if resent is None else [*failed, *held]

    monkeypatch.setattr(Outbox, "resend", resend_as_sent)
    monkeypatch.setattr(MemoryStore, "_holds", lambda self, request, delivery_id: True)
    monkeypatch.setattr(MemoryStore, "_sender_holds", lambda self, request, delivery_id: True)
    violation = _run_until_violation(range(60), 3000, remember_outcomes=False)
    # (or a resent admission admitted a second start)
    symptoms = ("runs while it", "queued twice", "admitted two starts")
    assert any(symptom in violation for symptom in symptoms), violation


def test_lost_replies_are_resent_in_the_simulation() -> None:
    simulation = simulate.simulate(1, 3000)
    counters = [w.machine.counters for w in simulation.workers]
    assert sum(c["store_errors"] for c in counters) > 0

"""Differential test of ``SlotStep`` (``docket_core.sansio.local_slots``):
the memory store and ``step.lua`` answer alike.

The machine of ``test_store_differential.py`` (every other effect, on the
same deliveries), with two rules more: a step that claims deliveries into
slots (their first step: the claim is part of it), and a step that ends a run
(records it, releases its slot) and may claim one more delivery into the slot
it frees.  Its replies, the records, ``pending()`` and the depths are
compared after every step, as there; a resent step answers its first outcome,
except that a take that got a slot answers lost once its delivery or its slot
is no longer the worker's.
"""

from __future__ import annotations

import os
from typing import Any

import test_store_differential as base
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule, run_state_machine_as_test
from test_store_differential import (
    KEYS,
    LIMITS,
    MEMORY,
    REDIS,
    STALE_AFTER,
    WORKERS,
    Handle,
    StoreDifferential,
    ends_a_run,
)

from docket_core.sansio.effects import ReleaseSlot, StoreEffect
from docket_core.sansio.inputs import ClaimVerdict
from docket_core.sansio.local_slots import (
    TAKE_ACQUIRED,
    TAKE_LOST,
    TAKE_PARKED,
    SlotStep,
    SlotStepped,
    SlotTake,
)
from docket_core.sansio.values import ExecutionState, ScheduleMode


def _fresh(handle: Handle) -> bool:
    return handle.held and not handle.claimed and not handle.acquire_tried


class StepDifferential(StoreDifferential):
    def _take(self, handle: Handle, s: int, limit: str) -> SlotTake:
        return SlotTake(
            handle.ids[s],
            handle.messages[s],
            limit,
            LIMITS[limit],
            f"{handle.worker}/{handle.name}",
        )

    def _answered(self, handles: list[Handle], limit: str, outcome: SlotStepped) -> None:
        for handle, answer in zip(handles, outcome.takes, strict=True):
            if answer == TAKE_ACQUIRED:
                handle.claimed = True
                handle.slot = (limit, f"{handle.worker}/{handle.name}")
            else:
                handle.held = False  # parked, settled (acknowledged), or another's

    def apply(self, spec: list[tuple[Any, ...]], outcomes: list[Any]) -> None:
        steps = [(item, outcome) for item, outcome in zip(spec, outcomes, strict=True)]
        others = [(i, o) for i, o in steps if i[0] != "step"]
        super().apply([i for i, _ in others], [o for _, o in others])
        for (_, handles, limit, ended), outcome in [(i, o) for i, o in steps if i[0] == "step"]:
            for handle in (*handles, *((ended,) if ended else ())):
                handle.locked = False
            if ended is not None:
                ended.held = False
                ended.slot = None
            self._answered(handles, limit, outcome)
            event(f"step: {sorted(set(outcome.takes))}, woken {outcome.woken}")
        self.forget()

    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3),
        worker=st.sampled_from(WORKERS),
        limit=st.sampled_from(["L1", "L1", "L2"]),
        drop=st.sampled_from([False, False, True]),
    )
    def read_and_step(self, keys: list[str], worker: str, limit: str, drop: bool) -> None:
        """Add ``keys`` now, read, and claim what came into slots in one step
        (as a worker does with a limit of its docket's own)."""
        self.add(keys, ScheduleMode.ADD, 0.0, b"x")  # (the base machine's rule, called)
        fresh = [h for h in self._read(worker, 3) if _fresh(h)]
        if fresh and not self.blocked(worker):
            self._step_take(worker, fresh, limit, drop)

    @precondition(lambda self: any(_fresh(h) for h in self.free_handles()))
    @rule(
        data=st.data(),
        limit=st.sampled_from(["L1", "L1", "L2"]),
        drop=st.sampled_from([False, False, True]),
    )
    def step_take(self, data: st.DataObject, limit: str, drop: bool) -> None:
        """Claim deliveries into slots of ``limit``, in one step."""
        workers = sorted({h.worker for h in self.free_handles() if _fresh(h)})
        worker = data.draw(st.sampled_from(workers))
        candidates = [h for h in self.free_handles(worker) if _fresh(h)]
        chosen = data.draw(
            st.lists(
                st.sampled_from(candidates), min_size=1, max_size=3, unique_by=lambda h: h.name
            )
        )
        self._step_take(worker, chosen, limit, drop)

    def _step_take(self, worker: str, chosen: list[Handle], limit: str, drop: bool) -> None:
        (request,) = self.request(worker, 1)
        for handle in chosen:
            handle.acquire_tried = True
        self.send(
            worker,
            [("step", chosen, limit, None)],
            lambda s: [
                SlotStep(
                    takes=tuple(self._take(h, s, limit) for h in chosen),
                    stale_after=STALE_AFTER,
                    now=self.now,
                    request=request,
                )
            ],
            drop,
        )

    @ends_a_run(hand_on=st.booleans())
    def step_end(
        self,
        data: st.DataObject,
        state: ExecutionState,
        result: bytes | None,
        hand_on: bool,
        drop: bool,
    ) -> None:
        """Record a run's end and release its slot (if it holds one) in one
        step, which may claim a delivery of the worker into the slot."""
        candidates = [h for h in self.free_handles() if h.held and h.claimed]
        ended = data.draw(st.sampled_from(candidates))
        slot = ended.slot
        limit = slot[0] if slot is not None else "L1"
        fresh = [h for h in self.free_handles(ended.worker) if _fresh(h)]
        nexts = [data.draw(st.sampled_from(fresh))] if hand_on and fresh else []
        for handle in nexts:
            handle.acquire_tried = True
        (request,) = self.request(ended.worker, 1)

        def build(s: int) -> list[StoreEffect]:
            finish = self.finish_of(ended, s, state, result)
            release = None
            if slot is not None:
                release = ReleaseSlot(limit_key=slot[0], holder=slot[1], now=self.now)
            return [
                SlotStep(
                    finish=finish,
                    release=release,
                    takes=tuple(self._take(h, s, limit) for h in nexts),
                    stale_after=STALE_AFTER,
                    now=self.now,
                    request=request,
                )
            ]

        if drop:
            ended.locked = True
        self.send(ended.worker, [("step", nexts, limit, ended)], build, drop)

    def check_replay(self, item: tuple[Any, ...], first: Any, now: Any) -> None:
        """A resent step answers its first outcome, except that a take that
        got a slot answers lost once its delivery or its slot is no longer
        the worker's; the other effects as this machine always checked them
        (claims and acquisitions by their answers alone, admissions not)."""
        kind = item[0]
        if kind == "step":
            assert (first.recorded, first.woken, first.wake) == (
                now.recorded,
                now.woken,
                now.wake,
            ), (first, now)
            for a1, a2 in zip(first.takes, now.takes, strict=True):
                assert a1 == a2 or (a1, a2) == (TAKE_ACQUIRED, TAKE_LOST), (first, now)
        elif kind == "claim":
            for (_, v1), (_, v2) in zip(first[1], now[1], strict=True):
                assert v1 == v2 or (v1, v2) == (ClaimVerdict.CLAIMED, ClaimVerdict.LOST)
        elif kind == "acquire":
            assert first == now or (first[2] and now[3]), (first, now)
        elif kind != "admit":
            assert first == now, f"a replayed {kind} answered {now}, first {first}"

    def heed_replay(self, item: tuple[Any, ...], now: Any) -> None:
        """A duplicate's step tells the worker of the slots its takes lost."""
        kind, handles, *_rest = item
        if kind == "step":
            for handle, answer in zip(handles, now.takes, strict=True):
                if answer == TAKE_LOST:
                    handle.slot = None
        elif kind == "acquire" and now[3]:
            handles[0].slot = None


assert TAKE_PARKED == 0 and ClaimVerdict.CLAIMED  # (the answers the rules rely on)
assert (MEMORY, REDIS) == (0, 1)

SETTINGS = settings(
    base.SETTINGS,
    max_examples=int(os.environ.get("DOCKET_DIFFERENTIAL_EXAMPLES", "100")),
)


def test_memory_and_redis_steps_agree(redis_server: Any) -> None:
    base.URL = redis_server.url
    try:
        run_state_machine_as_test(StepDifferential, settings=SETTINGS)
    finally:
        base.URL = None

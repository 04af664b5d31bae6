"""Differential test of admission end to end: the memory store (the algebra,
``MemoryStore._admit``) and the Redis store (``admit.lua``) carry out the
same submissions alike, settlement included.

Hypothesis draws rounds of submissions (task keys added, a set of controls
for the round, the time passing); each round the worker's part is played on
both stores: read what is due, claim it, admit it in one batch (a blocked
delivery is dropped or rescheduled by the store in that step), finish what
was admitted, sometimes send an admission batch again.  After every round
the outcomes (verdict, time to come back, deciding control, repeat), the
records of every key (state, time, attempt) and ``pending()`` must agree.
Rescheduled messages come back in later rounds, as the winners of a
debounce do.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from docket_core.sansio.admission import (
    Admit,
    Admitted,
    Control,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
    Verdict,
)
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import Claim, ClaimItem, Finish, Request, StoreEffect
from docket_core.sansio.inputs import Claimed, ClaimVerdict
from docket_core.sansio.values import ExecutionState, ScheduleMode
from docket_memory import store as memory_module
from docket_memory.store import MemoryStore
from docket_redis import RedisStore

KEYS = tuple(f"k{i}" for i in range(6))
CONTROLS: tuple[tuple[Control, ...], ...] = (
    (DebouncePolicy(key="d", settle=4.0),),
    (CooldownPolicy(key="c", window=6.0),),
    (RateLimitPolicy(key="r", limit=2, per=5.0),),
    (RateLimitPolicy(key="rd", limit=1, per=3.0, drop=True, scope="adm-scope"),),
    (DebouncePolicy(key="d", settle=4.0), RateLimitPolicy(key="r", limit=2, per=5.0)),
    (CooldownPolicy(key="c2", window=2.5), RateLimitPolicy(key="r2", limit=1, per=4.0)),
)
REDELIVERY = 100_000.0
TTL = 100_000.0
WORKER = "w1"


def run(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, Any]) -> Any:
    return loop.run_until_complete(coroutine)


@attrs.define
class Pair:
    """The two stores of one example, and the worker's request numbers."""

    loop: asyncio.AbstractEventLoop
    stores: tuple[MemoryStore, RedisStore]
    name: str
    location: str
    seq: int = 1

    def both(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [run(self.loop, getattr(s, method)(*args, **kwargs)) for s in self.stores]

    def requests(self, count: int) -> list[Request]:
        first, self.seq = self.seq, self.seq + count
        return [
            Request(
                origin=f"{WORKER}#{self.name}",
                seq=first + i,
                floor=first,
                remember=10_000.0,
                worker=WORKER,
            )
            for i in range(count)
        ]

    def execute(self, effects: list[list[StoreEffect]]) -> list[list[Any]]:
        return [
            run(self.loop, store.execute(batch))
            for store, batch in zip(self.stores, effects, strict=True)
        ]


@pytest.fixture(scope="module")
def redis_url(redis_server: Any) -> str:
    url: str = redis_server.url
    return url


@pytest.fixture
def stores(redis_url: str) -> Iterator[Any]:
    def make() -> Pair:
        loop = asyncio.new_event_loop()
        name, location = f"adm-{uuid.uuid4().hex}", uuid.uuid4().hex
        redis_store = RedisStore.from_url(redis_url, name=name)
        run(loop, redis_store.open())
        made.append(
            Pair(loop, (MemoryStore(name=name, location=location), redis_store), name, location)
        )
        return made[-1]

    made: list[Pair] = []
    yield make
    for pair in made:
        run(pair.loop, pair.stores[1].close())
        pair.loop.close()
        memory_module._SHELVES.pop((pair.location, pair.name), None)
        memory_module._POOLS.pop(pair.location, None)


def canonical(outcome: Admitted, effect: Admit) -> tuple[Any, ...]:
    blocker = None if outcome.blocked_by is None else effect.controls.index(outcome.blocked_by)
    return (effect.message.key, outcome.verdict, outcome.at, blocker, outcome.repeat)


rounds = st.lists(
    st.tuples(
        st.lists(st.sampled_from(KEYS), max_size=3),  # keys submitted
        st.sampled_from(CONTROLS),
        st.sampled_from([0.0, 0.5, 1.0, 2.5, 4.0, 7.0]),  # time passing first
        st.booleans(),  # send the admission batch again
    ),
    min_size=1,
    max_size=14,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rounds=rounds)
def test_both_stores_admit_and_settle_alike(stores: Any, rounds: list[Any]) -> None:
    pair: Pair = stores()
    now = 1_000.0
    seen_verdicts: set[Verdict] = set()
    for keys, declared, passing, resend in rounds:
        now += passing
        # (a scope of this example's own: the server outlives examples)
        controls = tuple(
            c if c.scope is None else attrs.evolve(c, scope=f"{pair.name}-{c.scope}")
            for c in declared
        )
        for key in keys:
            add = plan_add(
                key=key, function="task", payload=b"x", when=now, mode=ScheduleMode.ADD, now=now
            )
            pair.execute([[add], [add]])
        taken = pair.both(
            "read", worker=WORKER, count=20, now=now, redelivery_timeout=REDELIVERY, block=0
        )
        deliveries = [sorted(t.deliveries, key=lambda d: d.message.key) for t in taken]
        assert [d.message.key for d in deliveries[0]] == [d.message.key for d in deliveries[1]]
        if not deliveries[0]:
            continue
        (claim_request,) = pair.requests(1)
        claims = [
            [
                Claim(
                    worker=WORKER,
                    items=tuple(
                        ClaimItem(
                            delivery_id=d.delivery_id,
                            key=d.message.key,
                            generation=d.message.generation,
                        )
                        for d in batch
                    ),
                    now=now,
                    request=claim_request,
                )
            ]
            for batch in deliveries
        ]
        claimed = pair.execute(claims)
        verdicts = [[v for _, v in c[0].verdicts] for c in claimed if isinstance(c[0], Claimed)]
        assert verdicts[0] == verdicts[1]
        running = [
            [d for d, v in zip(batch, verdicts[0], strict=True) if v is ClaimVerdict.CLAIMED]
            for batch in deliveries
        ]
        requests = pair.requests(len(running[0]))
        admits = [
            [
                Admit(
                    delivery_id=d.delivery_id,
                    message=d.message,
                    controls=controls,
                    now=now,
                    stale_after=10.0,
                    ttl=TTL,
                    request=request,
                )
                for d, request in zip(batch, requests, strict=True)
            ]
            for batch in running
        ]
        outcomes = pair.execute(admits)
        if resend:
            again = pair.execute([[attrs.evolve(a, now=now + 0.5) for a in b] for b in admits])
            assert again == outcomes, "a resent admission acted again"
        canon = [
            [canonical(o, e) for o, e in zip(batch, effects, strict=True)]
            for batch, effects in zip(outcomes, admits, strict=True)
        ]
        assert canon[0] == canon[1], (
            f"admissions differ:\n  memory: {canon[0]}\n  redis:  {canon[1]}"
        )
        seen_verdicts |= {c[1] for c in canon[0]}
        finishes: list[list[StoreEffect]] = [[], []]
        finish_requests = pair.requests(len(running[0]))
        for s in (0, 1):
            for d, outcome, request in zip(running[s], outcomes[s], finish_requests, strict=True):
                if outcome.verdict is Verdict.ADMIT:
                    finishes[s].append(
                        Finish(
                            delivery_id=d.delivery_id,
                            key=d.message.key,
                            generation=d.message.generation,
                            state=ExecutionState.COMPLETED,
                            now=now,
                            ttl=TTL,
                            request=request,
                        )
                    )
        if finishes[0]:
            pair.execute(finishes)
        for key in KEYS:
            records = pair.both("get_record", key)
            shown = [None if r is None else (r.state, r.when, r.attempt, r.error) for r in records]
            assert shown[0] == shown[1], (
                f"record of {key}:\n  memory: {shown[0]}\n  redis: {shown[1]}"
            )
        pending = pair.both("pending")
        assert pending[0] == pending[1]

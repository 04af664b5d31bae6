"""The depths of a docket (``StorageAdapter.depths``) and the gauges that
export them, ``docket_queue_depth`` and ``docket_schedule_depth``.

The depths must be exact on every backend after every step: adds now and in
the future, a new soonest message (the servers write a wake-up entry for
blocked readers, which must count nowhere), reads, time passing, parking
behind a concurrency limit, a release, a finish and a cancel.  The gauges
are read from an OpenTelemetry SDK in a child process: a process has one
meter provider, and the instrumentation tests install theirs.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta

import anyio
import pytest

from docket_core import Docket
from docket_core.adapter import Depths
from docket_core.sansio.effects import AcquireSlot, Finish, ReleaseSlot
from docket_core.sansio.values import Delivery, ExecutionState

pytestmark = pytest.mark.anyio

HOUR = 3600.0


async def noop() -> None:
    """Never runs: the tests read the deliveries themselves."""


async def check(docket: Docket, queued: int, scheduled: int, held: int, at: float = 0.0) -> None:
    """The depths ``at`` seconds from now are exactly these, and ``pending()``
    is their sum (nothing else, such as a wake-up entry, counts)."""
    depths = await docket.adapter.depths(time.time() + at)
    assert depths == Depths(queued=queued, scheduled=scheduled, held=held)
    assert await docket.adapter.pending() == queued + scheduled + held


async def read(docket: Docket, count: int, at: float = 0.0) -> list[Delivery]:
    result = await docket.adapter.read(
        worker="reader", count=count, now=time.time() + at, redelivery_timeout=HOUR, block=0
    )
    assert result.malformed == ()
    return list(result.deliveries)


def later(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def test_the_depths_are_exact_after_every_step(docket: Docket) -> None:
    docket.register(noop)
    await check(docket, 0, 0, 0)
    for n in range(3):
        await docket.add(noop, key=f"now-{n}")()
    for n in range(2):
        await docket.add(noop, key=f"later-{n}", when=later(HOUR))()
    await check(docket, 3, 2, 0)
    # a new soonest message: a blocked reader would be woken to re-arm
    await docket.add(noop, key="sooner", when=later(HOUR / 2))()
    await check(docket, 3, 3, 0)

    # a wake-up entry never takes a read's place
    assert len(await read(docket, 1)) == 1
    await check(docket, 2, 3, 1)
    held = await read(docket, 10)
    assert len(held) == 2
    await check(docket, 0, 3, 3)

    # time passing: a scheduled message due counts as queued before a read
    # moves it, and measuring moves nothing
    await check(docket, 1, 2, 3, at=HOUR * 0.75)
    await check(docket, 3, 0, 3, at=HOUR * 2)
    await check(docket, 0, 3, 3)
    (sooner,) = await read(docket, 10, at=HOUR * 0.75)
    assert sooner.message.key == "sooner"
    await check(docket, 0, 2, 4, at=HOUR * 0.75)
    held.append(sooner)

    # a limit of one: the first delivery takes the slot, the second parks
    # (waiting for a slot counts as scheduled), the release queues it again
    now = time.time()
    outcomes = await docket.adapter.execute(
        [
            AcquireSlot(
                limit_key="one-at-a-time",
                holder=f"reader/{delivery.delivery_id}",
                max_concurrent=1,
                now=now,
                stale_after=HOUR,
                delivery_id=delivery.delivery_id,
                message=delivery.message,
            )
            for delivery in held[:2]
        ]
    )
    assert [getattr(o, "acquired", None) for o in outcomes] == [True, False]
    await check(docket, 0, 3, 3)
    await docket.adapter.execute(
        [ReleaseSlot(limit_key="one-at-a-time", holder=f"reader/{held[0].delivery_id}", now=now)]
    )
    await check(docket, 1, 2, 3)

    # finishing acknowledges, cancelling removes
    await docket.adapter.execute(
        [
            Finish(
                delivery_id=delivery.delivery_id,
                key=delivery.message.key,
                generation=delivery.message.generation,
                state=ExecutionState.COMPLETED,
                now=time.time(),
                ttl=60,
            )
            for delivery in (held[0], held[2])
        ]
    )
    await check(docket, 1, 2, 1)
    await docket.cancel("later-0")
    await check(docket, 1, 1, 1)
    await docket.clear()
    await check(docket, 0, 0, 1)


async def test_a_wake_up_wakes_a_blocked_reader_at_once_and_counts_nowhere(
    docket: Docket,
) -> None:
    docket.register(noop)
    await docket.add(noop, key="far", when=later(HOUR))()
    returned: list[float] = []

    async def blocked() -> None:
        result = await docket.adapter.read(
            worker="reader", count=10, now=time.time(), redelivery_timeout=HOUR, block=5
        )
        assert result.deliveries == ()
        returned.append(time.monotonic())

    with anyio.fail_after(4):
        async with anyio.create_task_group() as group:
            group.start_soon(blocked)
            await anyio.sleep(0.2)  # the reader blocks
            added = time.monotonic()
            await docket.add(noop, key="near", when=later(HOUR / 2))()
    assert returned[0] - added < 1.0, "the blocked reader slept through the wake-up"
    await check(docket, 0, 2, 0)
    # and one nobody was blocked for: still nothing counts but the messages
    await docket.add(noop, key="nearer", when=later(HOUR / 4))()
    await check(docket, 0, 3, 0)
    assert await read(docket, 10) == []
    await check(docket, 0, 3, 0)


#: what the child process runs: depths measured for the gauges, read from an
#: in-memory SDK reader, then forgotten when the measuring loop ends
GAUGES = textwrap.dedent(
    """
    import json, sys
    from datetime import UTC, datetime, timedelta

    import anyio
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    from docket_core import Docket, instrumentation


    def gauges(name):
        found = {}
        for resource in reader.get_metrics_data().resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if not metric.name.endswith("_depth"):
                        continue
                    for point in metric.data.data_points:
                        attributes = dict(point.attributes or {})
                        if attributes.get("docket.name") == name:
                            found[metric.name] = [point.value, attributes]
        return found


    async def noop():
        pass


    async def main(url, name):
        out = {}
        async with Docket(name=name, url=url) as docket:
            docket.register(noop)
            for n in range(3):
                await docket.add(noop)()
            for n in range(2):
                await docket.add(noop, when=datetime.now(UTC) + timedelta(hours=1))()
            out["before"] = gauges(name)
            async with anyio.create_task_group() as group:
                group.start_soon(instrumentation.measure_depths, docket, 0.05)
                await anyio.sleep(0.3)
                out["measured"] = gauges(name)
                await docket.add(noop)()
                await anyio.sleep(0.3)
                out["again"] = gauges(name)
                group.cancel_scope.cancel()
            out["after"] = gauges(name)
        print(json.dumps(out))


    anyio.run(main, sys.argv[1], sys.argv[2])
    """
)


@pytest.mark.backends("memory-asyncio", "redis-asyncio", "glide_valkey-asyncio")
async def test_the_gauges_report_the_depths_with_pydockets_names(docket_url: str) -> None:
    name = f"gauges-{os.urandom(4).hex()}"
    child = await anyio.run_process(
        [sys.executable, "-c", GAUGES, docket_url, name],
        check=False,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert child.returncode == 0, child.stderr.decode()
    out = json.loads(child.stdout)
    labels = {"docket.name": name}
    assert out["before"] == {}  # nothing measured yet
    assert out["measured"] == {
        "docket_queue_depth": [3, labels],
        "docket_schedule_depth": [2, labels],
    }
    assert out["again"] == {
        "docket_queue_depth": [4, labels],
        "docket_schedule_depth": [2, labels],
    }
    assert out["after"] == {}  # forgotten once nothing measures it

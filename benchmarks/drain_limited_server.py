"""A limited drain beside many limit keys that have waiters.

    python benchmarks/drain_limited_server.py --waiting 20,10000 --tasks 5000 --repeat 3

Each run makes a fresh docket on a private ``redis-server`` (or ``--url``,
``--client glide``, or ``--url memory://``) and first sets up ``--waiting``
limit keys that have a waiter: each key's one slot is held by a holder that
renews nothing (a worker elsewhere, as far as this docket can tell), and one
task of the key is parked behind it.  Then one worker (concurrency 100,
5 ms check interval) drains ``--tasks`` tasks that carry
``ConcurrencyLimit("customer", 1)`` over ``--customers`` customers, and,
for comparison, as many tasks without a limit.  Every read of the drains
looks for stale slots; how much that costs with many waiting keys is what the
figures show: wall time per task of each drain, and (on a private server)
the server's CPU per task.  The medians close the report.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

import anyio
import redis
from drain_server import private_server

from docket_core import ConcurrencyLimit, Docket, Worker
from docket_core.running import LOOPS, loop_options
from docket_core.sansio.effects import AcquireSlot
from docket_core.sansio.values import TaskMessage

#: slots of the waiting keys go stale far after a run (the worker's
#: redelivery timeout is the read's cutoff)
REDELIVERY = timedelta(minutes=10)


async def blocked(customer: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer", 1)) -> None:
    """Parked behind a holder that never releases: never runs."""


async def limited(customer: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer", 1)) -> None:
    return None


async def unlimited(customer: int) -> None:
    return None


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


async def drain(docket: Docket, function: Any, tasks: int, customers: int) -> float:
    """Wall seconds one worker takes to run ``tasks`` calls of ``function``."""
    async with docket.batch() as batch:
        for i in range(tasks):
            batch.add(function)(i % customers)
    async with make_worker(docket) as worker, anyio.create_task_group() as group:
        started = time.perf_counter()
        group.start_soon(worker.run_forever)
        while worker.counters.get("succeeded", 0) < tasks:
            await anyio.sleep(0.002)
        elapsed = time.perf_counter() - started
        group.cancel_scope.cancel()
    return elapsed


def server_cpu(port: int | None) -> float:
    """The private server's CPU seconds so far (0 without one)."""
    if port is None:
        return 0.0
    info: Any = redis.Redis(port=port).info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def one_run(
    url: str, port: int | None, waiting: int, tasks: int, customers: int
) -> dict[str, tuple[float, float]]:
    """drain -> (wall us per task, server CPU us per task)."""
    name = f"bench-{uuid.uuid4().hex}"
    figures: dict[str, tuple[float, float]] = {}
    async with Docket(name=name, url=url, execution_ttl=timedelta(0)) as docket:
        for function in (blocked, limited, unlimited):
            docket.register(function)
        await park_waiters(docket, waiting)
        for label, function in (("limited", limited), ("unlimited", unlimited)):
            cpu = server_cpu(port)
            wall = await drain(docket, function, tasks, customers)
            cpu = server_cpu(port) - cpu
            figures[label] = (wall / tasks * 1e6, cpu / tasks * 1e6)
    return figures


def report(url: str, port: int | None, args: argparse.Namespace) -> None:
    counts = [int(n) for n in args.waiting.split(",")]
    print(
        f"{args.tasks} tasks per drain over {args.customers} customers on {url} "
        f"({args.backend}); per task: wall us, server CPU us"
    )
    print(f"{'run':>4} {'waiting':>8} {'limited':>16} {'unlimited':>16} {'ratio':>6}")
    rows: dict[int, list[dict[str, tuple[float, float]]]] = {n: [] for n in counts}
    options = loop_options(args.backend)
    for index in range(1, args.repeat + 1):
        for waiting in counts:
            run = anyio.run(one_run, url, port, waiting, args.tasks, args.customers, **options)
            rows[waiting].append(run)
            print(line(str(index), waiting, run))
    for waiting, runs in rows.items():
        median = {
            label: (
                statistics.median(r[label][0] for r in runs),
                statistics.median(r[label][1] for r in runs),
            )
            for label in ("limited", "unlimited")
        }
        print(line("med", waiting, median))


def line(label: str, waiting: int, run: dict[str, tuple[float, float]]) -> str:
    (lw, lc), (uw, uc) = run["limited"], run["unlimited"]
    return f"{label:>4} {waiting:>8} {lw:>8.1f} {lc:>7.1f} {uw:>8.1f} {uc:>7.1f} {uw / lw:>6.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a memory://, redis:// or glide:// URL")
    parser.add_argument("--waiting", default="20,10000", help="waiting limit keys, per run")
    parser.add_argument("--tasks", type=int, default=5000, help="tasks per drain")
    parser.add_argument("--customers", type=int, default=200, help="limit keys of the drain")
    parser.add_argument("--repeat", type=int, default=3, help="runs per waiting count")
    parser.add_argument("--backend", default="asyncio", choices=LOOPS)
    parser.add_argument("--client", default="redis", choices=("redis", "glide"))
    parser.add_argument("--server", default="redis-server", help="the server binary to start")
    args = parser.parse_args()
    if args.url:
        report(args.url, None, args)
        return
    with private_server(args.server) as port:
        report(f"{args.client}://127.0.0.1:{port}/0", port, args)


if __name__ == "__main__":
    main()

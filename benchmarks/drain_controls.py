"""A drain under each task control, beside the unlimited drain in the same run.

    python benchmarks/drain_controls.py --tasks 4000 --repeat 3

Each run makes a fresh docket on ``memory://`` and on a private
``redis-server`` (or ``--url`` alone) and drains ``--tasks`` no-op tasks with
one worker (concurrency 100, 5 ms check interval) once per control:

- ``unlimited``: no control (the baseline);
- ``debounce``: ``Annotated[int, Debounce(1 ms)]``, every task a distinct
  value, so each scope settles and runs once (nothing dropped);
- ``cooldown``: ``Annotated[int, Cooldown(60 s)]``, every task a distinct
  value, so each is the leading edge of its scope (nothing dropped);
- ``ratelimit``: ``RateLimit(10 * tasks, per=60 s)`` on the task, a limit
  no drain reaches, so nothing is rescheduled: the figure is the cost of
  the check and the bookkeeping of the window.

It prints the wall microseconds per task of each drain and its ratio to the
unlimited drain of the same run (control / unlimited: above 1 is slower);
the medians of the runs close the report.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

import anyio
from drain_server import private_server

from docket_core import Cooldown, Debounce, Docket, RateLimit, Worker
from docket_core.running import LOOPS, loop_options

#: the rate limit: far above any drain's starts, so nothing waits
GENEROUS = 10_000_000


async def unlimited(n: int) -> None:
    return None


async def debounced(n: Annotated[int, Debounce(timedelta(milliseconds=1))]) -> None:
    return None


async def cooled(n: Annotated[int, Cooldown(timedelta(seconds=60))]) -> None:
    return None


async def rate_limited(
    n: int, limit: RateLimit = RateLimit(GENEROUS, per=timedelta(seconds=60))
) -> None:
    return None


DRAINS: dict[str, Callable[..., Any]] = {
    "unlimited": unlimited,
    "debounce": debounced,
    "cooldown": cooled,
    "ratelimit": rate_limited,
}


def make_worker(docket: Docket) -> Worker:
    return Worker(
        docket,
        name=f"bench-{uuid.uuid4().hex[:8]}",
        concurrency=100,
        minimum_check_interval=timedelta(milliseconds=5),
        scheduling_resolution=timedelta(milliseconds=5),
        schedule_automatic_tasks=False,
    )


async def drain(docket: Docket, function: Callable[..., Any], tasks: int) -> float:
    """Wall seconds one worker takes to run ``tasks`` calls of ``function``."""
    async with docket.batch() as batch:
        for i in range(tasks):
            batch.add(function)(i)
    async with make_worker(docket) as worker, anyio.create_task_group() as group:
        started = time.perf_counter()
        group.start_soon(worker.run_forever)
        deadline = started + 120
        while worker.counters.get("succeeded", 0) < tasks:
            if time.perf_counter() > deadline:
                raise SystemExit(f"{function.__name__}: stuck at {worker.counters}")
            await anyio.sleep(0.002)
        elapsed = time.perf_counter() - started
        group.cancel_scope.cancel()
    return elapsed


async def one_run(url: str, tasks: int) -> dict[str, float]:
    """control -> wall us per task."""
    name = f"bench-{uuid.uuid4().hex}"
    if url.startswith("memory://"):
        url = f"memory://{name}"
    figures: dict[str, float] = {}
    async with Docket(name=name, url=url, execution_ttl=timedelta(0)) as docket:
        for function in DRAINS.values():
            docket.register(function)
        for label, function in DRAINS.items():
            figures[label] = await drain(docket, function, tasks) / tasks * 1e6
    return figures


def line(label: str, run: dict[str, float]) -> str:
    base = run["unlimited"]
    cells = " ".join(f"{run[c]:>8.1f} {run[c] / base:>5.2f}" for c in DRAINS)
    return f"{label:>4} {cells}"


def report(url: str, args: argparse.Namespace) -> None:
    print(f"{args.tasks} no-op tasks per drain on {url} ({args.backend}); us per task, ratio")
    print(f"{'run':>4} " + " ".join(f"{c:>14}" for c in DRAINS))
    runs: list[dict[str, float]] = []
    for index in range(1, args.repeat + 1):
        run = anyio.run(one_run, url, args.tasks, **loop_options(args.backend))
        runs.append(run)
        print(line(str(index), run))
    median = {c: statistics.median(r[c] for r in runs) for c in DRAINS}
    print(line("med", median))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="one memory://, redis:// or glide:// URL only")
    parser.add_argument("--tasks", type=int, default=4000, help="tasks per drain")
    parser.add_argument("--repeat", type=int, default=3, help="runs per store")
    parser.add_argument("--backend", default="asyncio", choices=LOOPS)
    parser.add_argument("--client", default="redis", choices=("redis", "glide"))
    parser.add_argument("--server", default="redis-server", help="the server binary to start")
    args = parser.parse_args()
    if args.url:
        report(args.url, args)
        return
    report("memory://", args)
    with private_server(args.server) as port:
        report(f"{args.client}://127.0.0.1:{port}/0", args)


if __name__ == "__main__":
    main()

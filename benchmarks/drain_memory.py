"""Enqueue N no-op tasks on ``memory://`` and drain them with one worker.

Run with ``python benchmarks/drain_memory.py --tasks 10000 --concurrency 100 --repeat 3``.
Each run uses a fresh in-process docket and prints the time to enqueue, the
wall-clock and CPU time to drain, and the drain throughput; the median of the
runs closes the report.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import timedelta

import anyio

from docket_core import Docket, Worker


async def noop() -> None:
    """The task: does nothing, so the figures measure docket itself."""


async def one_run(tasks: int, concurrency: int) -> tuple[float, float, float]:
    """Returns (enqueue seconds, drain wall seconds, drain CPU seconds)."""
    name = f"bench-{uuid.uuid4().hex}"
    async with Docket(name=name, url=f"memory://{name}") as docket:
        docket.register(noop)
        started = time.perf_counter()
        for _ in range(tasks):
            await docket.add(noop)()
        enqueue = time.perf_counter() - started

        worker = Worker(
            docket,
            name=f"{name}-worker",
            concurrency=concurrency,
            minimum_check_interval=timedelta(milliseconds=5),
            schedule_automatic_tasks=False,
        )
        wall_started = time.perf_counter()
        cpu_started = time.process_time()
        async with worker:
            await worker.run_until_finished()
        drain_cpu = time.process_time() - cpu_started
        drain_wall = time.perf_counter() - wall_started
        completed = worker.counters.get("succeeded", 0)
        if completed != tasks:
            raise SystemExit(f"only {completed} of {tasks} tasks completed: {worker.counters}")
    return enqueue, drain_wall, drain_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks per run")
    parser.add_argument("--concurrency", type=int, default=100, help="the worker's concurrency")
    parser.add_argument("--repeat", type=int, default=3, help="how many runs")
    parser.add_argument("--backend", default="asyncio", choices=("asyncio", "trio"))
    args = parser.parse_args()

    print(
        f"draining {args.tasks} no-op tasks on memory:// "
        f"(concurrency {args.concurrency}, {args.backend})"
    )
    print(f"{'run':>4} {'enqueue s':>10} {'drain s':>10} {'drain cpu s':>12} {'tasks/s':>10}")
    rows: list[tuple[float, float, float, float]] = []
    for index in range(1, args.repeat + 1):
        enqueue, wall, cpu = anyio.run(one_run, args.tasks, args.concurrency, backend=args.backend)
        rate = args.tasks / wall
        rows.append((enqueue, wall, cpu, rate))
        print(f"{index:>4} {enqueue:>10.3f} {wall:>10.3f} {cpu:>12.3f} {rate:>10.0f}")
    medians = [statistics.median(column) for column in zip(*rows, strict=True)]
    print(
        f"{'med':>4} {medians[0]:>10.3f} {medians[1]:>10.3f} {medians[2]:>12.3f} "
        f"{medians[3]:>10.0f}"
    )


if __name__ == "__main__":
    main()

"""Drain no-op tasks on memory:// with a per-customer concurrency limit, next
to the same run without a limit.

    python benchmarks/drain_limited_memory.py --tasks 2000 --repeat 3

One Worker (concurrency 100, minimum_check_interval 5 ms) drains ``--tasks``
tasks spread over ``--customers`` customers; the limited task carries
``ConcurrencyLimit("customer", max_concurrent=5)``.  Prints the wall time and
tasks/s of each run and the median ratio limited/unlimited (of wall times).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from datetime import timedelta

import anyio

from docket_core import ConcurrencyLimit, Docket, Worker


async def limited(customer: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer", 5)) -> None:
    return None


async def unlimited(customer: int) -> None:
    return None


async def drain(limit: bool, tasks: int, customers: int) -> float:
    name = f"bench-{uuid.uuid4().hex}"
    async with Docket(name=name, url=f"memory://{name}", execution_ttl=timedelta(0)) as docket:
        function = limited if limit else unlimited
        docket.register(function)
        for i in range(tasks):
            await docket.add(function)(customer=i % customers)
        worker = Worker(
            docket,
            name="bench",
            concurrency=100,
            minimum_check_interval=timedelta(milliseconds=5),
            scheduling_resolution=timedelta(milliseconds=5),
        )
        started = time.perf_counter()
        await worker.run_until_finished()
        elapsed = time.perf_counter() - started
        completed = worker.counters.get("succeeded", 0)
        if completed != tasks:
            raise SystemExit(f"only {completed} of {tasks} tasks completed: {worker.counters}")
        return elapsed


async def main(tasks: int, customers: int, repeat: int) -> None:
    ratios: list[float] = []
    for run in range(1, repeat + 1):
        times: dict[str, float] = {}
        for label, limit in (("unlimited", False), ("limited", True)):
            elapsed = times[label] = await drain(limit, tasks, customers)
            print(
                f"run {run} {label:>9}: {elapsed:7.3f} s  {tasks / elapsed:9,.0f} tasks/s",
                flush=True,
            )
        ratios.append(times["limited"] / times["unlimited"])
    print(
        f"median ratio limited/unlimited (wall time): {statistics.median(ratios):.2f} "
        f"(runs: {', '.join(f'{r:.2f}' for r in ratios)})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--customers", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    anyio.run(main, options.tasks, options.customers, options.repeat)
    sys.exit(0)

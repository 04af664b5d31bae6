"""Enqueue N no-op tasks on ``memory://`` and drain them with one worker.

Run with ``python benchmarks/drain_memory.py --tasks 10000 --concurrency 100 --repeat 3``.
Each run uses a fresh in-process docket and prints the time to enqueue, the
wall-clock and CPU time to drain, and the drain throughput; the median of the
runs closes the report.  ``--logging info`` drains with the ``docket.worker``
logger at INFO (its lines formatted and written to a null stream), ``--logging
both`` alternates runs with it off and at INFO and closes with their ratio.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
import uuid
from datetime import timedelta

import anyio

from docket_core import Docket, Worker
from docket_core.cli.logs import LogFormat, LogLevel, configure_logging
from docket_core.running import LOOPS, loop_options


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


class _Dropped(logging.Handler):
    """A handler that drops every record: what is left is docket's own cost."""

    def emit(self, record: logging.LogRecord) -> None:
        pass


def worker_logging(mode: str) -> None:
    """``off``: the ``docket.worker`` logger at WARNING (a drain logs nothing);
    ``info``: at INFO, every line formatted and written to a null stream;
    ``dropped``: at INFO, to a handler that drops every record unformatted;
    ``cli``: as ``docket worker --logging-format plain`` logs (``configure_logging``,
    on the root logger), as ``run.py``'s ``+logs``, written to a null stream (or to
    the file named by the environment's ``DRAIN_LOG``)."""
    worker = logging.getLogger("docket.worker")
    for old in list(worker.handlers):
        worker.removeHandler(old)
        old.close()
        if isinstance(old, logging.StreamHandler):
            old.stream.close()
    worker.propagate = False
    if mode == "cli":
        handler = configure_logging(LogLevel.INFO, LogFormat.PLAIN)
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(open(os.environ.get("DRAIN_LOG", os.devnull), "w", encoding="utf-8"))
        worker.propagate = True
        worker.setLevel(logging.NOTSET)
    elif mode == "info":
        handler = logging.StreamHandler(open(os.devnull, "w"))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        worker.addHandler(handler)
        worker.setLevel(logging.INFO)
    elif mode == "dropped":
        worker.addHandler(_Dropped())
        worker.setLevel(logging.INFO)
    else:
        worker.setLevel(logging.WARNING)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks per run")
    parser.add_argument("--concurrency", type=int, default=100, help="the worker's concurrency")
    parser.add_argument("--repeat", type=int, default=3, help="how many runs")
    parser.add_argument(
        "--backend",
        default="asyncio",
        choices=LOOPS,
        help="the event loop: asyncio, uvloop (asyncio on uvloop: the uvloop extra) or trio",
    )
    parser.add_argument(
        "--logging",
        default="off",
        choices=("off", "info", "dropped", "both"),
        help="the docket.worker logger: off, at INFO to a null stream, at INFO to a handler "
        "that drops the records, or both off and INFO, alternately",
    )
    args = parser.parse_args()

    modes = ("off", "info") if args.logging == "both" else (args.logging,)
    print(
        f"draining {args.tasks} no-op tasks on memory:// "
        f"(concurrency {args.concurrency}, {args.backend}, worker logging {args.logging})"
    )
    print(
        f"{'run':>4} {'log':>4} {'enqueue s':>10} {'drain s':>10} {'drain cpu s':>12} "
        f"{'tasks/s':>10}"
    )
    rows: dict[str, list[tuple[float, float, float, float]]] = {mode: [] for mode in modes}
    for index in range(1, args.repeat + 1):
        for mode in modes:
            worker_logging(mode)
            enqueue, wall, cpu = anyio.run(
                one_run, args.tasks, args.concurrency, **loop_options(args.backend)
            )
            rate = args.tasks / wall
            rows[mode].append((enqueue, wall, cpu, rate))
            print(f"{index:>4} {mode:>4} {enqueue:>10.3f} {wall:>10.3f} {cpu:>12.3f} {rate:>10.0f}")
    medians = {
        mode: [statistics.median(column) for column in zip(*runs, strict=True)]
        for mode, runs in rows.items()
    }
    for mode, median in medians.items():
        print(
            f"{'med':>4} {mode:>4} {median[0]:>10.3f} {median[1]:>10.3f} {median[2]:>12.3f} "
            f"{median[3]:>10.0f}"
        )
    if len(medians) == 2:
        ratio = medians["info"][3] / medians["off"][3]
        print(f"drain rate with INFO logging / without: {ratio:.2f}")


if __name__ == "__main__":
    main()

"""What the worker's per-run INFO lines cost a drain, on ``memory://`` and Redis.

    python benchmarks/drain_logging.py                       # 20,000 tasks, both backends
    python benchmarks/drain_logging.py --backends memory --repeat 5
    python benchmarks/drain_logging.py --profile file --backends memory
    python benchmarks/drain_logging.py --backends glide --modes off file

Each run enqueues N no-op tasks on a fresh docket and drains them with one
worker (concurrency 100); the figure is the drain rate.  Logging is set up
as ``docket worker --logging-format plain`` sets it up (``configure_logging``:
one handler on the root logger, the CLI's formatter), in one of these modes:

- ``off``: the root logger at WARNING: no run logs a line (the baseline);
- ``file``: at INFO, every line formatted and written to a temporary file;
- ``devnull``: at INFO, every line formatted and written to ``/dev/null``;
- ``null``: at INFO, to a ``logging.NullHandler``: the records are made and
  handed to the logger, nothing is formatted or written (docket's own cost).

The modes alternate run by run (``--repeat`` rounds); the medians close the
report with each mode's drain rate (and CPU time per task) as a fraction of
``off``'s, then the same for the best drain of each mode (on a busy machine
the steadier figure: other processes only ever slow a drain down).  The Redis
backends (``redis``: redis-py, ``glide``: GLIDE) use a private
``redis-server`` on a free port each (``drain_server``).
``--profile MODE`` instead drains once per backend in MODE under cProfile and
prints the functions with the most own time, and the per-line cost of the
logging functions (in microseconds per line, two lines a run).
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import IO

import anyio
from drain_server import private_server

from docket_core import Docket, Worker
from docket_core.cli.logs import LogFormat, LogLevel, configure_logging

MODES = ("off", "file", "devnull", "null")


async def noop() -> None:
    """The task: does nothing, so the figures measure docket and its logging."""


async def one_drain(
    url: str, tasks: int, concurrency: int, profiler: cProfile.Profile | None
) -> tuple[float, float]:
    """Enqueue ``tasks`` no-op runs on ``url`` and drain them; returns the
    drain's wall-clock and CPU seconds."""
    name = f"bench-{uuid.uuid4().hex}"
    if url == "memory":
        url = f"memory://{name}"
    async with Docket(name=name, url=url) as docket:
        docket.register(noop)
        for _ in range(tasks):
            await docket.add(noop)()
        worker = Worker(
            docket,
            name=f"{name}-worker",
            concurrency=concurrency,
            minimum_check_interval=timedelta(milliseconds=5),
            scheduling_resolution=timedelta(milliseconds=5),
            schedule_automatic_tasks=False,
        )
        async with worker:
            started, cpu_started = time.perf_counter(), time.process_time()
            if profiler is not None:
                profiler.enable()
            try:
                await worker.run_until_finished()
            finally:
                if profiler is not None:
                    profiler.disable()
            seconds = time.perf_counter() - started
            cpu = time.process_time() - cpu_started
        completed = worker.counters.get("succeeded", 0)
        if completed != tasks:
            raise SystemExit(
                f"only {completed} of {tasks} tasks completed: {dict(worker.counters)}"
            )
    return seconds, cpu


@contextmanager
def logging_mode(mode: str, directory: str) -> Iterator[None]:
    """The root logger set up as the CLI does, in ``mode`` (see the module's doc)."""
    root = logging.getLogger()
    saved = root.level
    with ExitStack() as stack:
        if mode == "null":
            handler: logging.Handler = logging.NullHandler()
            root.addHandler(handler)
            root.setLevel(logging.INFO)
        else:
            level = LogLevel.WARNING if mode == "off" else LogLevel.INFO
            handler = configure_logging(level, LogFormat.PLAIN)
            target: IO[str]
            if mode == "file":
                target = open(os.path.join(directory, "worker.log"), "w", encoding="utf-8")
            else:
                target = open(os.devnull, "w", encoding="utf-8")
            stack.callback(target.close)
            assert isinstance(handler, logging.StreamHandler)
            handler.setStream(target)
        try:
            yield
        finally:
            root.removeHandler(handler)
            handler.close()
            root.setLevel(saved)


def backend_urls(backends: list[str], stack: ExitStack) -> dict[str, str]:
    urls: dict[str, str] = {}
    for backend in backends:
        if backend == "memory":
            urls[backend] = "memory"
        else:
            port = stack.enter_context(private_server("redis-server"))
            scheme = "glide" if backend == "glide" else "redis"
            urls[backend] = f"{scheme}://127.0.0.1:{port}/0"
    return urls


def compare(
    urls: dict[str, str], modes: list[str], args: argparse.Namespace, directory: str
) -> None:
    """Drain in every mode, alternately, and print the rates and their ratios to ``off``'s.

    Two figures per drain: the drain rate (tasks per wall-clock second) and
    the drain's CPU time per task in this process (steadier on a busy machine:
    other processes' load does not count)."""
    for backend, url in urls.items():
        print(f"{backend}: {args.tasks} no-op tasks, concurrency {args.concurrency}")
        print(f"{'round':>6} " + " ".join(f"{mode:>16}" for mode in modes))
        print(f"{'':>6} " + " ".join(f"{'tasks/s  cpu-us':>16}" for _ in modes))
        rates: dict[str, list[float]] = {mode: [] for mode in modes}
        costs: dict[str, list[float]] = {mode: [] for mode in modes}
        for index in range(1, args.repeat + 1):
            for mode in modes:
                with logging_mode(mode, directory):
                    wall, cpu = anyio.run(one_drain, url, args.tasks, args.concurrency, None)
                rates[mode].append(args.tasks / wall)
                costs[mode].append(cpu / args.tasks * 1e6)
            cells = (f"{rates[mode][-1]:>8.0f} {costs[mode][-1]:>7.1f}" for mode in modes)
            print(f"{index:>6} " + " ".join(cells))
        rate = {mode: statistics.median(values) for mode, values in rates.items()}
        cost = {mode: statistics.median(values) for mode, values in costs.items()}
        print(f"{'median':>6} " + " ".join(f"{rate[m]:>8.0f} {cost[m]:>7.1f}" for m in modes))
        if "off" in rate:
            ratios = (f"{rate[m] / rate['off']:>8.2f} {cost['off'] / cost[m]:>7.2f}" for m in modes)
            print(f"{'/ off':>6} " + " ".join(ratios) + "   (rate ratio, CPU-rate ratio)")
            # the best drains: other processes only ever slow a drain down
            best = {mode: max(values) for mode, values in rates.items()}
            least = {mode: min(values) for mode, values in costs.items()}
            cells = (f"{best[m]:>8.0f} {least[m]:>7.1f}" for m in modes)
            print(f"{'best':>6} " + " ".join(cells))
            ratios = (
                f"{best[m] / best['off']:>8.2f} {least['off'] / least[m]:>7.2f}" for m in modes
            )
            print(f"{'/ off':>6} " + " ".join(ratios) + "   (best rate ratio, best CPU-rate ratio)")
        print()


#: the functions on the logging's path, docket's and ``logging``'s
_LOGGING = (
    "log_start",
    "log_end",
    "_call_text",
    "_when_text",
    "_shown",
    "_hand_over",
    "call_repr",
    "isEnabledFor",
    "callHandlers",
    "handle",
    "emit",
    "format",
    "formatTime",
    "getMessage",
    "flush",
)


def profile(urls: dict[str, str], mode: str, args: argparse.Namespace, directory: str) -> None:
    for backend, url in urls.items():
        profiler = cProfile.Profile()
        with logging_mode(mode, directory):
            seconds, _ = anyio.run(one_drain, url, args.tasks, args.concurrency, profiler)
        stats = pstats.Stats(profiler)
        print(f"== {backend}, mode {mode}: {args.tasks / seconds:.0f} tasks/s under cProfile")
        if args.top:
            stats.sort_stats("tottime").print_stats(args.top)
        print("the logging's path: cumulative microseconds per call and per task (cProfile's)")
        entries = stats.stats  # type: ignore[attr-defined]
        for (path, lineno, function), (_, calls, _tt, cumulative, _) in sorted(
            entries.items(), key=lambda item: -item[1][3]
        ):
            if function in _LOGGING and calls >= args.tasks:
                where = f"{os.path.basename(path)}:{lineno}"
                per_call, per_task = cumulative / calls * 1e6, cumulative / args.tasks * 1e6
                figures = f"{calls:>8} calls {per_call:>7.2f} {per_task:>7.2f}"
                print(f"  {function:<14} {where:<24} {figures}")
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per drain")
    parser.add_argument("--concurrency", type=int, default=100, help="the worker's concurrency")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the modes")
    parser.add_argument(
        "--backends", nargs="+", default=["memory", "redis"], choices=("memory", "redis", "glide")
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--profile", choices=MODES, help="profile one drain in this mode instead")
    parser.add_argument("--top", type=int, default=30, help="with --profile: functions shown")
    args = parser.parse_args()
    with ExitStack() as stack:
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="docket-logs-"))
        urls = backend_urls(args.backends, stack)
        if args.profile:
            profile(urls, args.profile, args, directory)
        else:
            compare(urls, args.modes, args, directory)


if __name__ == "__main__":
    main()

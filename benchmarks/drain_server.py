"""Enqueue N no-op tasks on a Redis/Valkey server and drain them with one worker.

Run with ``python benchmarks/drain_server.py --tasks 20000 --concurrency 100 --repeat 3``
(a private ``redis-server`` is started on a free port and removed afterwards),
or point it at a server with ``--url redis://host:6379/0`` / ``--url
glide://host:6379/0``.  ``--client glide`` uses GLIDE on the private server.
Each run uses a fresh docket name and prints the enqueue rate (tasks added one
by one, one ``await docket.add(...)()`` after the other) and the drain rate
(``run_until_finished`` of one worker); the median of the runs closes the report.
``--logging info`` drains with the ``docket.worker`` logger at INFO (to a null
stream); ``--logging both`` alternates runs with it off and at INFO and closes
with the ratio of their drain rates.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import anyio
from drain_memory import worker_logging

from docket_core import Docket, Worker
from docket_core.running import LOOPS, loop_options


async def noop() -> None:
    """The task: does nothing, so the figures measure docket and the server."""


async def one_run(url: str, tasks: int, concurrency: int) -> tuple[float, float, float]:
    """Returns (enqueue seconds, drain wall seconds, drain CPU seconds)."""
    name = f"bench-{uuid.uuid4().hex}"
    async with Docket(name=name, url=url) as docket:
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
            scheduling_resolution=timedelta(milliseconds=5),
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
            counters = dict(worker.counters)
            raise SystemExit(f"only {completed} of {tasks} tasks completed: {counters}")
    return enqueue, drain_wall, drain_cpu


def drain_worker(docket: Docket) -> Worker:
    """One worker as the sampling drains run it (``drain_phases.py``,
    ``drain_timeline.py``): concurrency 100, a 10 ms check interval and a
    frozen heap, as ``run.py``'s tuned profile."""
    return Worker(
        docket,
        concurrency=100,
        minimum_check_interval=timedelta(milliseconds=10),
        schedule_automatic_tasks=False,
        freeze_gc=True,
    )


# -- a private server (the minimal part of tests/servers.py; benchmarks don't import tests) --


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def private_server(binary: str) -> Iterator[int]:
    """A server on a free loopback port that persists nothing; yields the port."""
    path = shutil.which(binary) or binary
    if not os.path.exists(path):
        raise SystemExit(f"{binary} not found: install it or pass --url")
    port = _free_port()
    directory = tempfile.mkdtemp(prefix="docket-bench-")
    process = subprocess.Popen(
        [path, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", directory, "--logfile", os.path.join(directory, "server.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not _ping(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{binary} did not start on port {port}")
            time.sleep(0.02)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def line(label: str, mode: str, row: tuple[float, ...]) -> str:
    enqueue, enqueue_rate, wall, drain_rate, cpu = row
    return (
        f"{label:>4} {mode:>4} {enqueue:>10.3f} {enqueue_rate:>10.0f} {wall:>9.3f} "
        f"{drain_rate:>9.0f} {cpu:>12.3f}"
    )


def report(url: str, args: argparse.Namespace) -> None:
    modes = ("off", "info") if args.logging == "both" else (args.logging,)
    print(
        f"{args.tasks} no-op tasks on {url} (one worker, concurrency {args.concurrency}, "
        f"{args.backend}, worker logging {args.logging})"
    )
    header = f"{'run':>4} {'log':>4} {'enqueue s':>10} {'enqueue/s':>10} {'drain s':>9}"
    print(f"{header} {'drain/s':>9} {'drain cpu s':>12}")
    rows: dict[str, list[tuple[float, float, float, float, float]]] = {m: [] for m in modes}
    for index in range(1, args.repeat + 1):
        for mode in modes:
            worker_logging(mode)
            enqueue, wall, cpu = anyio.run(
                one_run, url, args.tasks, args.concurrency, **loop_options(args.backend)
            )
            row = (enqueue, args.tasks / enqueue, wall, args.tasks / wall, cpu)
            rows[mode].append(row)
            print(line(str(index), mode, row))
    medians = {
        mode: tuple(statistics.median(column) for column in zip(*runs, strict=True))
        for mode, runs in rows.items()
    }
    for mode, median in medians.items():
        print(line("med", mode, median))
    if len(medians) == 2:
        ratio = medians["info"][3] / medians["off"][3]
        print(f"drain rate with INFO logging / without: {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a redis://, rediss://, unix://, glide:// or glides:// URL")
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per run")
    parser.add_argument("--concurrency", type=int, default=100, help="the worker's concurrency")
    parser.add_argument("--repeat", type=int, default=3, help="how many runs")
    parser.add_argument(
        "--backend",
        default="asyncio",
        choices=LOOPS,
        help="the event loop: asyncio, uvloop (asyncio on uvloop: the uvloop extra) or trio",
    )
    parser.add_argument(
        "--client",
        default="redis",
        choices=("redis", "glide"),
        help="without --url: reach the private server through redis-py or GLIDE",
    )
    parser.add_argument(
        "--server", default="redis-server", help="without --url: the server binary to start"
    )
    parser.add_argument(
        "--logging",
        default="off",
        choices=("off", "info", "dropped", "both"),
        help="the docket.worker logger: off, at INFO to a null stream, at INFO to a handler "
        "that drops the records, or both off and INFO, alternately",
    )
    args = parser.parse_args()
    if args.url:
        report(args.url, args)
        return
    with private_server(args.server) as port:
        scheme = "glide" if args.client == "glide" else "redis"
        report(f"{scheme}://127.0.0.1:{port}/0", args)


if __name__ == "__main__":
    main()

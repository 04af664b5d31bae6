"""Count the instructions docket's own process runs per task, under valgrind.

    python benchmarks/instructions.py --tasks 2000                     # memory://
    python benchmarks/instructions.py --client redis --tree /tmp/old --tree .
    python benchmarks/instructions.py --client glide --logs     # INFO lines on

Timings on a shared machine move by 15-30% from run to run; an instruction
count moves by a fraction of a percent.  This runs the process that adds N
no-op tasks one by one and then drains them with one worker (``drain_worker``:
concurrency 100, a 10 ms check interval, a frozen heap) under valgrind's
``cachegrind`` (``--cache-sim=no``: instruction counts only; ``apt-get install
valgrind``; a run is about 50 times slower than a bare one), three times a
tree: with no task (start-up and shut-down), with the adds alone, and with the
adds and the drain (``--sleep-ms``: tasks that sleep, so that runs wait
in the worker as its 10 ms drain's do).  The differences, over N, are the instructions of an add
and of a drained task.  On ``--client redis`` or ``glide`` a private
``redis-server`` is started (``drain_server.private_server``): the counts are
then the client's process only, not the server's (``server_cost.py`` counts
the server's time).  The slowed worker always finds full batches, as a
worker does under load.

With several ``--tree`` folders (each holding a ``docket_core``), each count
runs once for each, the child's ``PYTHONPATH`` starting with its tree, and
the report closes with each tree's ratio to the first.  Counts are of the
whole process: the interpreter's work on docket's behalf (allocation, garbage
collection, the event loop) is included, GLIDE's native threads too.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from contextlib import nullcontext

import anyio
from drain_server import drain_worker, private_server

from docket_core import Docket
from docket_core.cli.logs import LogFormat, LogLevel, configure_logging

HERE = os.path.dirname(os.path.abspath(__file__))


async def noop() -> None:
    """The drained task."""


async def sleeper(seconds: float) -> None:
    """The drained task of ``--sleep-ms``."""
    await anyio.sleep(seconds)


def log_to_file(path: str) -> None:
    """Log the worker's INFO lines to ``path``, as ``docket worker
    --logging-format plain`` logs them (``configure_logging``)."""
    handler = configure_logging(LogLevel.INFO, LogFormat.PLAIN)
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(open(path, "w", encoding="utf-8"))


async def child(url: str, tasks: int, drain: bool, sleep_ms: float) -> None:
    """Add ``tasks`` no-op tasks one by one, then (``drain``) drain them."""
    async with Docket(name=f"instructions-{uuid.uuid4().hex}", url=url) as docket:
        docket.register(noop)
        docket.register(sleeper)
        for _ in range(tasks):
            if sleep_ms:
                await docket.add(sleeper)(sleep_ms / 1000)
            else:
                await docket.add(noop)()
        if drain:
            async with drain_worker(docket) as worker:
                await worker.run_until_finished()
            if worker.counters["succeeded"] != tasks:
                raise SystemExit(f"drained {worker.counters['succeeded']} of {tasks}")


def count(tree: str, url: str, tasks: int, drain: bool, sleep_ms: float, logs: bool) -> int:
    """The instructions valgrind counts for one child process."""
    path = os.pathsep.join([os.path.abspath(tree), HERE])
    environment = dict(os.environ, PYTHONPATH=path, PYTHONHASHSEED="0")
    command = [
        "valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
        sys.executable, os.path.abspath(__file__), "--child", url, "--tasks", str(tasks),
        "--sleep-ms", str(sleep_ms),
    ] + (["--drain"] if drain else [])  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="docket-instructions-") as folder:
        if logs:
            command += ["--log-file", os.path.join(folder, "worker.log")]
        done = subprocess.run(command, env=environment, capture_output=True, text=True)
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"valgrind run failed ({tree}):\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", help="a folder holding docket_core")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--client", default="memory", choices=("memory", "redis", "glide"))
    parser.add_argument("--server", default="redis-server", help="the server binary to start")
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="each task sleeps so long")
    parser.add_argument(
        "--logs", action="store_true", help="the worker logs its INFO lines to a file"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a counted process's URL
    parser.add_argument("--drain", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--log-file", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child is not None:
        if options.log_file is not None:
            log_to_file(options.log_file)
        anyio.run(child, options.child, options.tasks, options.drain, options.sleep_ms)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found: apt-get install valgrind")
    trees = options.tree or ["."]
    server = nullcontext(0) if options.client == "memory" else private_server(options.server)
    with server as port:
        url = {
            "memory": "memory://",
            "redis": f"redis://127.0.0.1:{port}/0",
            "glide": f"glide://127.0.0.1:{port}/0",
        }[options.client]
        n = options.tasks
        task = f"{options.sleep_ms:g} ms" if options.sleep_ms else "no-op"
        logs = ", INFO lines to a file" if options.logs else ""
        print(f"{n} {task} tasks on {options.client}{logs}; instructions per task (thousands)")
        print(f"{'tree':<24}{'add':>10}{'drain':>10}{'total':>10}")
        first: tuple[float, float] | None = None
        for tree in trees:
            empty = count(tree, url, 0, False, options.sleep_ms, options.logs)
            added = count(tree, url, n, False, options.sleep_ms, options.logs)
            drained = count(tree, url, n, True, options.sleep_ms, options.logs)
            add, drain = (added - empty) / n / 1000, (drained - added) / n / 1000
            first = first or (add, drain)
            ratio = f"  add x{add / first[0]:.3f} drain x{drain / first[1]:.3f}"
            print(f"{tree:<24}{add:>10.1f}{drain:>10.1f}{add + drain:>10.1f}{ratio}", flush=True)


if __name__ == "__main__":
    main()

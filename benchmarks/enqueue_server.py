"""Enqueue no-op tasks one by one on a private server, through redis-py and GLIDE.

    python benchmarks/enqueue_server.py --tasks 5000 --repeat 3

Starts a private ``redis-server`` on a free port; each run makes a fresh
docket on one client and times ``--tasks`` sequential ``await
docket.add(noop)()`` calls (wall time and this process's CPU time).  Runs
alternate between the clients; the medians close the report, with GLIDE's
rate as a fraction of redis-py's.  ``--profile FILE`` writes a cProfile of
one GLIDE run instead.
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import time
import uuid

import anyio
from drain_server import private_server

from docket_core import Docket
from docket_core.running import LOOPS, loop_options

CLIENTS = ("redis", "glide")


async def noop() -> None:
    """The task: never runs here."""


async def one_run(url: str, tasks: int) -> tuple[float, float]:
    """Returns (wall seconds, CPU seconds) of ``tasks`` sequential adds."""
    name = f"bench-{uuid.uuid4().hex}"
    async with Docket(name=name, url=url) as docket:
        docket.register(noop)
        add = docket.add(noop)
        for _ in range(100):  # warm up: connect, load the scripts
            await add()
        wall_started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(tasks):
            await add()
        return time.perf_counter() - wall_started, time.process_time() - cpu_started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000, help="adds per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per client")
    parser.add_argument("--backend", default="asyncio", choices=LOOPS)
    parser.add_argument("--server", default="redis-server", help="the server binary to start")
    parser.add_argument("--profile", help="write a cProfile of one GLIDE run to this file")
    args = parser.parse_args()
    options = loop_options(args.backend)
    with private_server(args.server) as port:
        urls = {client: f"{client}://127.0.0.1:{port}/0" for client in CLIENTS}
        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(anyio.run, one_run, urls["glide"], args.tasks, **options)
            profiler.dump_stats(args.profile)
            return
        print(f"{args.tasks} sequential adds per run on {args.server} ({args.backend})")
        print(f"{'run':>4} {'client':>6} {'adds/s':>9} {'CPU us/add':>11}")
        rates: dict[str, list[float]] = {client: [] for client in CLIENTS}
        cpus: dict[str, list[float]] = {client: [] for client in CLIENTS}
        for index in range(1, args.repeat + 1):
            for client in CLIENTS:
                wall, cpu = anyio.run(one_run, urls[client], args.tasks, **options)
                rates[client].append(args.tasks / wall)
                cpus[client].append(cpu / args.tasks * 1e6)
                print(f"{index:>4} {client:>6} {rates[client][-1]:>9.0f} {cpus[client][-1]:>11.1f}")
        for client in CLIENTS:
            rate, cpu = statistics.median(rates[client]), statistics.median(cpus[client])
            print(f"{'med':>4} {client:>6} {rate:>9.0f} {cpu:>11.1f}")
        ratio = statistics.median(rates["glide"]) / statistics.median(rates["redis"])
        print(f"GLIDE / redis-py enqueue rate: {ratio:.2f}")


if __name__ == "__main__":
    main()

"""Enqueue no-op tasks one by one on a private server, through redis-py and GLIDE.

    python benchmarks/enqueue_server.py --tasks 20000 --repeat 5

Starts a private ``redis-server`` on a free port.  Each run is its own
process, as in ``run.py``'s harness (GLIDE's native threads, and where the
kernel puts them, are a process's: runs in one process would share their
luck), on a fresh docket after a ``FLUSHALL``, and times ``--tasks``
sequential ``await docket.add(noop)(time.time())`` calls, the harness's
"enqueue 1-by-1" (wall time; and this process's CPU time, GLIDE's threads
included, and the event loop thread's alone).  The runs are paired and
interleaved: each round runs both clients, which one first alternating; the
medians close the report, with GLIDE's enqueue time over redis-py's (the
harness's ratio) and each round's own ratio.  ``--inline`` runs everything
in this process instead; ``--profile FILE`` writes a cProfile of one GLIDE
run.  ``--bare`` times the clients without docket: the same number of
sequential ``EVALSHA`` calls of ``return 1`` (with ``--spin N``, of a loop
of N additions, to give the server work), through redis-py and through GLIDE,
so docket's own share of the GLIDE/redis-py gap shows beside the clients'.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import statistics
import subprocess
import sys
import time
import uuid

import anyio
import redis
from drain_server import private_server

from docket_core import Docket
from docket_core.running import LOOPS, loop_options

CLIENTS = ("redis", "glide")


async def noop(t: float) -> None:
    """The task (the harness's no-op takes the enqueue time): never runs here."""


async def one_run(url: str, tasks: int) -> dict[str, float]:
    """Wall, process CPU and main-thread CPU seconds of ``tasks`` sequential adds."""
    name = f"bench-{uuid.uuid4().hex}"
    async with Docket(name=name, url=url) as docket:
        docket.register(noop)
        for _ in range(100):  # warm up: connect, load the scripts
            await docket.add(noop)(time.time())
        wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
        for _ in range(tasks):
            await docket.add(noop)(time.time())
        return {
            "wall": time.perf_counter() - wall,
            "cpu": time.process_time() - cpu,
            "thread": time.thread_time() - thread,
        }


#: ``--bare``'s script: ``return 1`` when ARGV[1] is 0, else a loop of ARGV[1] additions
BARE_SCRIPT = "local x = 0 for i = 1, tonumber(ARGV[1]) do x = x + i end return 1"


async def bare_run(url: str, tasks: int, spin: int) -> dict[str, float]:
    """``one_run``'s figures for ``tasks`` sequential ``EVALSHA`` calls of the
    client alone (no docket): redis-py's ``evalsha``, GLIDE's ``invoke_script``."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    arg = str(spin)
    if url.startswith("glide"):
        from glide import GlideClient, GlideClientConfiguration, NodeAddress, Script

        client = await GlideClient.create(
            GlideClientConfiguration([NodeAddress("127.0.0.1", port)])
        )
        script = Script(BARE_SCRIPT)

        async def call() -> None:
            await client.invoke_script(script, keys=["k"], args=[arg])

    else:
        import redis.asyncio

        connection = redis.asyncio.Redis(port=port)
        sha = await connection.script_load(BARE_SCRIPT)

        async def call() -> None:
            await connection.evalsha(sha, 1, "k", arg)

    for _ in range(100):
        await call()
    wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(tasks):
        await call()
    return {
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
        "thread": time.thread_time() - thread,
    }


def run(
    url: str, tasks: int, backend: str, inline: bool, bare: int | None = None
) -> dict[str, float]:
    if inline:
        if bare is not None:
            return anyio.run(bare_run, url, tasks, bare, **loop_options(backend))
        return anyio.run(one_run, url, tasks, **loop_options(backend))
    command = [sys.executable, __file__, "--one", url, "--tasks", str(tasks), "--backend", backend]
    if bare is not None:
        command += ["--bare", "--spin", str(bare)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20000, help="adds per run")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (one run per client each)")
    parser.add_argument("--backend", default="asyncio", choices=LOOPS)
    parser.add_argument("--server", default="redis-server", help="the server binary to start")
    parser.add_argument("--inline", action="store_true", help="every run in this process")
    parser.add_argument("--profile", help="write a cProfile of one GLIDE run to this file")
    parser.add_argument("--bare", action="store_true", help="the clients alone, no docket")
    parser.add_argument("--spin", type=int, default=0, help="--bare: additions the script loops")
    parser.add_argument("--one", metavar="URL", help=argparse.SUPPRESS)  # a run's own process
    args = parser.parse_args()
    bare = args.spin if args.bare else None
    if args.one:
        if bare is not None:
            result = anyio.run(bare_run, args.one, args.tasks, bare, **loop_options(args.backend))
        else:
            result = anyio.run(one_run, args.one, args.tasks, **loop_options(args.backend))
        print(json.dumps(result))
        return
    with private_server(args.server) as port:
        urls = {client: f"{client}://127.0.0.1:{port}/0" for client in CLIENTS}
        admin = redis.Redis(port=port)
        if args.profile:
            profiler = cProfile.Profile()
            options = loop_options(args.backend)
            profiler.runcall(anyio.run, one_run, urls["glide"], args.tasks, **options)
            profiler.dump_stats(args.profile)
            return
        where = "in this process" if args.inline else "a process each"
        what = "adds" if bare is None else f"bare EVALSHA calls (spin {bare})"
        print(f"{args.tasks} sequential {what} per run on {args.server} ({args.backend}, {where})")
        header = ("round", 5), ("client", 6), ("seconds", 8), ("us/add", 7), ("CPU us/add", 10)
        print(" ".join(f"{title:>{width}}" for title, width in header), f"{'loop':>6}")
        times: dict[str, list[float]] = {client: [] for client in CLIENTS}
        cpus: dict[str, list[float]] = {client: [] for client in CLIENTS}
        loops: dict[str, list[float]] = {client: [] for client in CLIENTS}
        for index in range(1, args.repeat + 1):
            order = CLIENTS if index % 2 else CLIENTS[::-1]
            for client in order:
                admin.flushall()
                result = run(urls[client], args.tasks, args.backend, args.inline, bare)
                times[client].append(result["wall"])
                cpus[client].append(result["cpu"] / args.tasks * 1e6)
                loops[client].append(result["thread"] / args.tasks * 1e6)
                print(
                    f"{index:>5} {client:>6} {result['wall']:>8.3f}"
                    f" {result['wall'] / args.tasks * 1e6:>7.1f}"
                    f" {cpus[client][-1]:>10.1f} {loops[client][-1]:>6.1f}",
                    flush=True,
                )
        admin.close()
        for client in CLIENTS:
            wall = statistics.median(times[client])
            cpu, loop = statistics.median(cpus[client]), statistics.median(loops[client])
            print(
                f"{'med':>5} {client:>6} {wall:>8.3f} {wall / args.tasks * 1e6:>7.1f}"
                f" {cpu:>10.1f} {loop:>6.1f}"
            )
        ratio = statistics.median(times["glide"]) / statistics.median(times["redis"])
        rounds = [g / r for g, r in zip(times["glide"], times["redis"], strict=True)]
        print(f"GLIDE / redis-py enqueue time (medians): {ratio:.3f} (rate {1 / ratio:.2f}x)")
        print("per round: " + " ".join(f"{r:.3f}" for r in rounds))


if __name__ == "__main__":
    main()

"""Where the Redis server's CPU goes per task: N no-op tasks added one by one,
then drained by one worker, with the server's CPU time and INFO commandstats
read around each phase.

    python benchmarks/server_cost.py --tasks 20000               # one tree
    python benchmarks/server_cost.py --tree /tmp/old --tree .    # paired runs

Starts a private ``redis-server`` (``drain_server.private_server``).  With
several ``--tree`` folders (each holding a ``docket_core``), the runs
alternate between them on the same server, each in a child process whose
``PYTHONPATH`` starts with its tree, and the medians close the report with
each tree's ratio to the first: compare those, not figures from separate
runs (the machine is shared).  ``--commands`` prints, per phase, the server
microseconds and calls per task of every command (the scripts' own commands
included: Redis 7 counts them).  ``--scripts`` prints, for the drain, each
script's calls and microseconds per task and its median call, from SLOWLOG
(every command logged while the drain runs; the logging costs a little).
``--limit-keys K`` gives every task ``ConcurrencyLimit("customer", ceil(C / K))``
over K customers (task i gets customer i mod K), as ``run.py``'s limited drains.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

from drain_server import private_server


async def noop() -> None:
    """The task: does nothing."""


def limited_task(per_key: int) -> Any:
    """The limited workload's task: does nothing, under a per-customer limit."""
    from docket_core import ConcurrencyLimit

    async def limited(
        customer: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer", per_key)
    ) -> None:
        """Does nothing, holding one of its customer's slots."""

    return limited


def info(port: int, section: str) -> dict[str, str]:
    """INFO ``section`` of the server on ``port`` as field -> value."""
    command = f"*2\r\n$4\r\nINFO\r\n${len(section)}\r\n{section}\r\n".encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(command)
        data = b""
        while True:
            chunk = sock.recv(65536)
            data += chunk
            header, _, rest = data.partition(b"\r\n")
            if not chunk or (header.startswith(b"$") and len(rest) >= int(header[1:])):
                break
    fields: dict[str, str] = {}
    for line in data.decode().splitlines()[1:]:
        name, _, value = line.partition(":")
        if value:
            fields[name] = value
    return fields


def snapshot(port: int) -> tuple[float, dict[str, tuple[int, int]]]:
    """(server CPU seconds, command -> (calls, usec))."""
    cpu = info(port, "cpu")
    seconds = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    commands: dict[str, tuple[int, int]] = {}
    for name, value in info(port, "commandstats").items():
        parts = dict(part.split("=") for part in value.split(","))
        commands[name.removeprefix("cmdstat_")] = (int(parts["calls"]), int(parts["usec"]))
    return seconds, commands


Sample = tuple[float, dict[str, tuple[int, int]]]


def delta(before: Sample, after: Sample) -> dict[str, Any]:
    commands = {}
    for name, (calls, usec) in after[1].items():
        old = before[1].get(name, (0, 0))
        if calls - old[0]:
            commands[name] = (calls - old[0], usec - old[1])
    return {"cpu": after[0] - before[0], "commands": commands}


def slowlog(port: int, command: list[str]) -> Any:
    import redis

    with redis.Redis(port=port) as client:
        return client.execute_command(*command)


def script_times(port: int) -> dict[str, list[int]]:
    """The drain's script calls from SLOWLOG: script name -> microseconds a call."""
    from docket_core.lua import SCRIPTS

    names = {hashlib.sha1(source.encode()).hexdigest(): n for n, source in SCRIPTS.items()}
    times: dict[str, list[int]] = {}
    for entry in slowlog(port, ["SLOWLOG", "GET", "-1"]):
        arguments = [a.decode() if isinstance(a, bytes) else str(a) for a in entry[3]]
        name = arguments[0].lower()
        if name == "evalsha" and len(arguments) > 1:
            name = names.get(arguments[1], arguments[1][:8])
        times.setdefault(name, []).append(int(entry[2]))
    return times


async def one_run(
    port: int, tasks: int, concurrency: int, scripts: bool, keys: int
) -> dict[str, Any]:
    from docket_core import Docket, Worker

    url = f"redis://127.0.0.1:{port}/0"
    name = f"cost-{uuid.uuid4().hex[:8]}"
    result: dict[str, Any] = {}
    async with Docket(name=name, url=url) as docket:
        task = limited_task(max(1, -(-concurrency // keys))) if keys else noop
        docket.register(task)
        arguments: list[tuple[int, ...]] = [(i % keys,) if keys else () for i in range(tasks)]
        # a warm-up task, so script loading and the group's creation are not counted
        await docket.add(task)(*arguments[0])
        warm = Worker(docket, concurrency=concurrency, schedule_automatic_tasks=False)
        async with warm:
            await warm.run_until_finished()
        first = snapshot(port)
        started = time.perf_counter()
        for each in arguments:
            await docket.add(task)(*each)
        result["enqueue_s"] = time.perf_counter() - started
        second = snapshot(port)
        worker = Worker(
            docket,
            concurrency=concurrency,
            minimum_check_interval=timedelta(milliseconds=10),
            scheduling_resolution=timedelta(milliseconds=10),
            schedule_automatic_tasks=False,
        )
        if scripts:
            slowlog(port, ["CONFIG", "SET", "slowlog-log-slower-than", "0"])
            slowlog(port, ["CONFIG", "SET", "slowlog-max-len", "1000000"])
            slowlog(port, ["SLOWLOG", "RESET"])
        started = time.perf_counter()
        cpu = time.process_time()
        async with worker:
            await worker.run_until_finished()
        result["drain_s"] = time.perf_counter() - started
        result["worker_cpu_s"] = time.process_time() - cpu
        third = snapshot(port)
        if scripts:
            slowlog(port, ["CONFIG", "SET", "slowlog-log-slower-than", "-1"])
            result["scripts"] = script_times(port)
            slowlog(port, ["SLOWLOG", "RESET"])
        done = worker.counters.get("succeeded", 0)
        if done != tasks:
            raise SystemExit(f"only {done} of {tasks} tasks completed")
    result["enqueue"] = delta(first, second)
    result["drain"] = delta(second, third)
    return result


def child(port: int, tasks: int, concurrency: int, scripts: bool, keys: int) -> None:
    import anyio

    print(json.dumps(anyio.run(one_run, port, tasks, concurrency, scripts, keys)))


def run_tree(tree: str, port: int, args: argparse.Namespace) -> dict[str, Any]:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [os.path.abspath(tree), environment.get("PYTHONPATH", "")]
    )
    command = [sys.executable, os.path.abspath(__file__), "--child", str(port)]
    command += ["--tasks", str(args.tasks), "--concurrency", str(args.concurrency)]
    command += ["--scripts"] if args.scripts else []
    command += ["--limit-keys", str(args.limit_keys)]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{tree}: {done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def show_commands(tree: str, runs: list[dict[str, Any]], tasks: int) -> None:
    for phase in ("enqueue", "drain"):
        names = sorted({n for run in runs for n in run[phase]["commands"]})
        rows = []
        for name in names:
            calls = statistics.median(run[phase]["commands"].get(name, (0, 0))[0] for run in runs)
            usec = statistics.median(run[phase]["commands"].get(name, (0, 0))[1] for run in runs)
            rows.append((usec, name, calls))
        print(f"  {tree} {phase}: command, calls/task, us/task (commandstats)")
        for usec, name, calls in sorted(rows, reverse=True):
            print(f"    {name:<22} {calls / tasks:>8.3f} {usec / tasks:>8.2f}")


def show_scripts(tree: str, runs: list[dict[str, Any]], tasks: int) -> None:
    names = sorted({n for run in runs for n in run["scripts"]})
    rows = []
    for name in names:
        each = [run["scripts"].get(name, []) for run in runs]
        calls = statistics.median(len(times) for times in each)
        usec = statistics.median(sum(times) for times in each)
        call = statistics.median(t for times in each for t in times)
        rows.append((usec, name, calls, call))
    print(f"  {tree} drain: script, calls/task, us/task, median us/call (SLOWLOG)")
    for usec, name, calls, call in sorted(rows, reverse=True):
        print(f"    {name:<22} {calls / tasks:>8.3f} {usec / tasks:>8.2f} {call:>8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", help="a folder holding docket_core")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--commands", action="store_true", help="per-command figures too")
    parser.add_argument("--scripts", action="store_true", help="per-script figures too")
    parser.add_argument("--server", default="redis-server")
    parser.add_argument(
        "--limit-keys", type=int, default=0, help="tasks under a per-customer limit over K keys"
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.tasks, args.concurrency, args.scripts, args.limit_keys)
        return
    trees = args.tree or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    runs: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    limited = f" under a limit over {args.limit_keys} keys" if args.limit_keys else ""
    print(
        f"{args.tasks} no-op tasks{limited}, concurrency {args.concurrency};"
        " us = server CPU per task"
    )
    print(
        f"{'tree':<24} {'enq us':>7} {'drain us':>9} {'total us':>9}"
        f" {'drain s':>8} {'wcpu s':>7}"
    )

    def row(tree: str, values: tuple[float, ...]) -> str:
        enq, drain, wall, wcpu = values
        return (
            f"{tree[-24:]:<24} {enq:>7.1f} {drain:>9.1f} {enq + drain:>9.1f} "
            f"{wall:>8.3f} {wcpu:>7.3f}"
        )

    def figures(run: dict[str, Any]) -> tuple[float, ...]:
        per = 1e6 / args.tasks
        return (
            run["enqueue"]["cpu"] * per,
            run["drain"]["cpu"] * per,
            run["drain_s"],
            run["worker_cpu_s"],
        )

    with private_server(args.server) as port:
        for _ in range(args.repeat):
            for tree in trees:
                run = run_tree(tree, port, args)
                runs[tree].append(run)
                print(row(tree, figures(run)), flush=True)
    medians = {
        tree: tuple(statistics.median(c) for c in zip(*map(figures, r), strict=True))
        for tree, r in runs.items()
    }
    print("medians:")
    base = medians[trees[0]]
    for tree, values in medians.items():
        total = (values[0] + values[1]) / (base[0] + base[1])
        print(f"{row(tree, values)}  server x{total:.2f} drain x{values[2] / base[2]:.2f}")
    if args.commands:
        for tree in trees:
            show_commands(tree, runs[tree], args.tasks)
    if args.scripts:
        for tree in trees:
            show_scripts(tree, runs[tree], args.tasks)


if __name__ == "__main__":
    main()

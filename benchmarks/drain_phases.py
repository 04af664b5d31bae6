"""Where a drain's deliveries stand, sampled: how many run, wait for a slot
step's or an end's answer, wait in the worker, and how much room is left.

    python benchmarks/drain_phases.py                      # 20 keys, 5 slots a key, 10 ms
    python benchmarks/drain_phases.py --per-key 0          # the same drain without a limit
    python benchmarks/drain_phases.py --keys 10000 --per-key 1 --client glide

Starts a private ``redis-server`` (or takes ``--url``), fills a fresh docket
with ``--tasks`` tasks (one ``Docket.batch()``; task i gets customer i mod
``--keys``), then drains it with one worker (concurrency 100, 10 ms check
interval, frozen heap: ``run.py``'s tuned profile), with a
``ConcurrencyLimit("customer", --per-key)`` unless that is 0.  Every 2 ms a
sampler in the worker's event loop counts the worker machine's deliveries by
phase (``waiting-here``: waiting in the worker for a slot its own runs hold),
the runs going, the room left for a read (``capacity``) and whether a read is
out; it prints the rate and the mean of each.  A drain whose runs at once stay
well under the concurrency while room is left waits on its reads; one whose
``claiming`` is large waits on its slot steps' answers.  The sampler reads the
machine's private state, so it belongs to this tool only.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import Counter

import anyio
from drain_server import drain_worker, private_server

from docket_core import ConcurrencyLimit, Docket


async def drain(url: str, args: argparse.Namespace) -> None:
    seconds = args.sleep_ms / 1000

    async def plain(customer: int) -> None:
        if seconds:
            await anyio.sleep(seconds)

    async def limited(
        customer: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer", max(args.per_key, 1))
    ) -> None:
        if seconds:
            await anyio.sleep(seconds)

    function = limited if args.per_key else plain
    async with Docket(name=f"phases-{uuid.uuid4().hex}", url=url) as docket:
        docket.register(function)
        async with docket.batch() as batch:
            for n in range(args.tasks):
                batch.add(function)(n % args.keys)
        worker = drain_worker(docket)
        samples: Counter[str] = Counter()
        taken = 0

        async def sample() -> None:
            nonlocal taken
            while True:
                await anyio.sleep(0.002)
                machine = worker._machine
                if machine is None:
                    continue
                taken += 1
                waits = machine.local.waits
                for delivery_id, flight in machine.in_flight.items():
                    samples["waiting-here" if delivery_id in waits else flight.phase.value] += 1
                samples["(runs)"] += machine._runs
                samples["(room)"] += machine.capacity
                samples["(reading)"] += machine._reading

        began = time.perf_counter()
        async with anyio.create_task_group() as group:
            group.start_soon(sample)
            await worker.run_until_finished()
            group.cancel_scope.cancel()
        wall = time.perf_counter() - began
    label = f"{args.keys} keys, {args.per_key} a key" if args.per_key else "no limit"
    means = ", ".join(
        f"{name} {count / max(taken, 1):.1f}" for name, count in sorted(samples.items())
    )
    print(f"{label}, {args.sleep_ms:g} ms tasks: {args.tasks / wall:,.0f} tasks/s; mean {means}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--keys", type=int, default=20, help="customers of the limit")
    parser.add_argument("--per-key", type=int, default=5, help="slots a customer (0: no limit)")
    parser.add_argument("--sleep-ms", type=float, default=10.0, help="each task sleeps so long")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--client", default="redis", choices=("redis", "glide"))
    parser.add_argument("--server", default="redis-server", help="the server binary to start")
    parser.add_argument("--url", help="an existing server (or memory://) instead")
    args = parser.parse_args()
    if args.url:
        for _ in range(args.repeat):
            anyio.run(drain, args.url, args)
        return
    with private_server(args.server) as port:
        for _ in range(args.repeat):
            anyio.run(drain, f"{args.client}://127.0.0.1:{port}/0", args)


if __name__ == "__main__":
    main()

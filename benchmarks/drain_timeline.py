"""Where a delivery's time goes in a drain: the legs of its way through one worker.

    python benchmarks/drain_timeline.py      # limited (10,000 keys) and unlimited, 10 ms tasks
    python benchmarks/drain_timeline.py --keys 20 --per-key 5 --client glide
    python benchmarks/drain_timeline.py --sleep-ms 0 --tasks 30000  # no-op tasks

Starts a private ``redis-server`` on a free loopback port, fills a fresh docket
with ``--tasks`` tasks (one ``Docket.batch()``), then drains it with one worker
(concurrency 100, 10 ms check interval, frozen heap: ``benchmarks/run.py``'s
tuned profile), once with a ``ConcurrencyLimit("customer", --per-key)`` over
``--keys`` customers and once without a limit.  Wrappers around the store's
``read`` and ``execute`` and the runner's ``start`` mark, per delivery, when
the read that brought it came back, when its claim (or slot step) went out
and came back, when it started, and when its end went out and came back.  Per
drain it prints the rate and the worker's CPU per task (the wrappers cost a
few µs a task), the median and p90 of each leg, and the batches: how many,
their median size and how long one is out.  Read a leg against the others:
a delivery whose claim waits for the batch in flight shows in
``read back -> claim sent``; the store's turn in ``claim sent -> claim back``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import anyio
from drain_server import drain_worker, private_server

from docket_core import ConcurrencyLimit, Docket, running
from docket_core.sansio.effects import Claim, Finish, StoreEffect
from docket_core.sansio.local_slots import SlotStep

#: the legs printed: (from, to)
LEGS = (
    ("read back", "claim sent"),
    ("claim sent", "claim back"),
    ("claim back", "start"),
    ("read back", "start"),
    ("start", "end sent"),
    ("end sent", "end back"),
)


class Timeline:
    """The marks of one drain: delivery id -> mark -> perf_counter."""

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, float]] = defaultdict(dict)
        #: (sent, answered, effects) of each batch
        self.batches: list[tuple[float, float, int]] = []

    def mark(self, delivery_id: str, what: str, at: float) -> None:
        self.marks[delivery_id].setdefault(what, at)

    def effects(self, effects: Sequence[StoreEffect], phase: str, at: float) -> None:
        """Mark the claims and ends among ``effects`` as ``sent`` or ``back``."""
        for effect in effects:
            if isinstance(effect, SlotStep):
                if effect.finish is not None:
                    self.mark(effect.finish.delivery_id, f"end {phase}", at)
                for take in effect.takes:
                    self.mark(take.delivery_id, f"claim {phase}", at)
            elif isinstance(effect, Claim):
                for item in effect.items:
                    self.mark(item.delivery_id, f"claim {phase}", at)
            elif isinstance(effect, Finish):
                self.mark(effect.delivery_id, f"end {phase}", at)

    def report(self, label: str, tasks: int, wall: float, cpu: float) -> None:
        print(
            f"{label}: {tasks / wall:,.0f} tasks/s, {wall / tasks * 1e6:.0f} us/task wall, "
            f"{cpu / tasks * 1e6:.0f} us/task worker CPU"
        )
        for start, end in LEGS:
            legs = [m[end] - m[start] for m in self.marks.values() if start in m and end in m]
            if len(legs) < 10:
                continue
            p90 = statistics.quantiles(legs, n=10)[8]
            print(
                f"  {start:>10} -> {end:<10} p50 {statistics.median(legs) * 1e3:6.2f} ms"
                f"  p90 {p90 * 1e3:6.2f} ms  ({len(legs)} deliveries)"
            )
        sizes = [n for _, _, n in self.batches]
        out = [answered - sent for sent, answered, _ in self.batches]
        if out:
            print(
                f"  batches: {len(out)}, {statistics.median(sizes):.0f} effects each (median), "
                f"out {statistics.median(out) * 1e3:.2f} ms (median), "
                f"{statistics.quantiles(out, n=10)[8] * 1e3:.2f} ms (p90)"
            )


def watch(docket: Docket, timeline: Timeline) -> None:
    """Wrap the docket's store and the runner's start to mark ``timeline``."""
    adapter: Any = docket.adapter
    read = adapter.read

    def timed(execute: Any) -> Any:
        async def timed_execute(effects: Sequence[StoreEffect]) -> Any:
            sent = time.perf_counter()
            timeline.effects(effects, "sent", sent)
            try:
                return await execute(effects)
            finally:
                answered = time.perf_counter()
                timeline.batches.append((sent, answered, len(effects)))
                timeline.effects(effects, "back", answered)

        return timed_execute

    async def timed_read(**options: Any) -> Any:
        result = await read(**options)
        back = time.perf_counter()
        for delivery in result.deliveries:
            timeline.mark(delivery.delivery_id, "read back", back)
        return result

    adapter.execute = timed(adapter.execute)
    adapter.execute_in_order = timed(adapter.execute_in_order)
    adapter.read = timed_read


async def drain(url: str, args: argparse.Namespace, limited: bool) -> None:
    seconds = args.sleep_ms / 1000

    async def task(customer: int) -> None:
        if seconds:
            await anyio.sleep(seconds)

    async def limited_task(
        customer: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer", args.per_key)
    ) -> None:
        if seconds:
            await anyio.sleep(seconds)

    function = limited_task if limited else task
    timeline = Timeline()
    start = running.Runner.start

    def timed_start(self: running.Runner, delivery_id: str, *rest: Any) -> None:
        timeline.mark(delivery_id, "start", time.perf_counter())
        start(self, delivery_id, *rest)

    async with Docket(name=f"timeline-{uuid.uuid4().hex}", url=url) as docket:
        docket.register(function)
        async with docket.batch() as batch:
            for n in range(args.tasks):
                batch.add(function)(n % args.keys)
        watch(docket, timeline)
        worker = drain_worker(docket)
        running.Runner.start = timed_start  # type: ignore[method-assign]
        try:
            began, cpu = time.perf_counter(), time.process_time()
            await worker.run_until_finished()
            wall, cpu = time.perf_counter() - began, time.process_time() - cpu
        finally:
            running.Runner.start = start  # type: ignore[method-assign]
    label = f"limited ({args.keys} keys, {args.per_key} a key)" if limited else "unlimited"
    timeline.report(f"{label}, {args.sleep_ms:g} ms tasks", args.tasks, wall, cpu)
    counted = {name: count for name, count in sorted(worker.counters.items()) if count}
    print(f"  the worker's counters: {counted}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks per drain")
    parser.add_argument("--keys", type=int, default=10_000, help="customers of the limit")
    parser.add_argument("--per-key", type=int, default=1, help="the limit per customer")
    parser.add_argument("--sleep-ms", type=float, default=10.0, help="each task sleeps so long")
    parser.add_argument("--client", default="redis", choices=("redis", "glide"))
    parser.add_argument("--server", default="redis-server", help="the server binary to start")
    args = parser.parse_args()
    with private_server(args.server) as port:
        url = f"{args.client}://127.0.0.1:{port}/0"
        for limited in (True, False):
            anyio.run(drain, url, args, limited)


if __name__ == "__main__":
    main()

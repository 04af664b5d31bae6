"""Profile docket's worker draining N no-op tasks from Redis (or Valkey).

    python benchmarks/profile_drain.py --tasks 20000 --concurrency 100
    python benchmarks/profile_drain.py --client glide
    python benchmarks/profile_drain.py --html /tmp/drain.html   # pyinstrument's tree

Starts a private ``redis-server`` (see ``drain_server.py``), fills the queue with
N no-op tasks (32 concurrent ``docket.add`` calls, not profiled), then drains it
with one ``Worker`` (10 ms intervals, as the harness's tuned profile) under
pyinstrument (a sampling profiler: ``pip install pyinstrument``; it is a dev tool,
not a dependency of docket). It prints where the worker's time goes:

- **by docket operation**: each sample goes to the innermost docket frame on its
  stack (``Worker._prepare``, ``Runner._run``, a ``WorkerMachine`` method, a
  store primitive, ...), so time spent inside redis-py or anyio on behalf of a
  docket call counts to that call; samples with no docket frame are the event
  loop's own work (``selectors``, ``asyncio`` callbacks, task switches);
- **by library** (self time): which package's code was on the CPU.

Shares are of the drain's sampled time; the CPU seconds per 1,000 tasks are from
``time.process_time`` over the same drain.
"""

from __future__ import annotations

import argparse
import collections
import signal
import time
import uuid
from datetime import timedelta
from typing import Any

import anyio
from drain_memory import worker_logging
from drain_server import private_server

from docket_core import ConcurrencyLimit, Docket, Worker
from docket_core.running import LOOPS, loop_options

SLEEP = [0.0]  # --sleep-ms


async def noop() -> None:
    """The task: does nothing (or sleeps ``--sleep-ms``)."""
    if SLEEP[0]:
        await anyio.sleep(SLEEP[0])


def limited_task(per_key: int) -> Any:
    """The task with ``ConcurrencyLimit("customer", per_key)`` (``--limit-keys``)."""

    async def limited(
        customer: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer", per_key)
    ) -> None:
        if SLEEP[0]:
            await anyio.sleep(SLEEP[0])

    return limited


def docket_frame(frame: str) -> str | None:
    """'function\\x00path\\x00line...' -> a label when the frame is docket's own code."""
    function, path = frame.split("\x00")[:2]
    for package in ("docket_core/", "docket_redis/", "docket_glide/"):
        if package in path:
            short = path[path.index(package) :]
            return f"{short}:{function}"
    return None


def library(frame: str) -> str:
    path = frame.split("\x00")[1]
    for marker, name in (
        ("docket_core/sansio/", "docket_core.sansio"),
        ("docket_core/lua/", "docket_core.lua"),
        ("docket_core/", "docket_core (runtime)"),
        ("docket_redis/", "docket_redis"),
        ("docket_glide/", "docket_glide"),
        ("/redis/", "redis-py"),
        ("/glide", "glide"),
        ("/anyio/", "anyio"),
        ("/asyncio/", "asyncio"),
        ("selectors.py", "selectors (epoll)"),
        ("/attr/", "attrs"),
        ("/attrs/", "attrs"),
        ("pickle", "pickle"),
        ("/enum.py", "enum"),
    ):
        if marker in path:
            return name
    if path.startswith("<"):
        return path  # built-ins: <built-in>, <frozen ...>
    return path.rsplit("/", 1)[-1]


async def fill(docket: Docket, n: int, task: Any, keys: int) -> None:
    left = n

    async def producer() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            if keys:
                await docket.add(task)(left % keys)
            else:
                await docket.add(task)()

    async with anyio.create_task_group() as group:
        for _ in range(32):
            group.start_soon(producer)


class CpuSampler:
    """A low-overhead sampler: ``ITIMER_PROF`` (process CPU time) fires SIGPROF
    every ``interval`` CPU seconds and the handler records the Python stack.
    Unlike pyinstrument (whose setprofile hook runs on every call and return, and
    so inflates call-heavy code), it costs only the samples; time in C code goes
    to the Python frame that called it."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.samples: collections.Counter[tuple[str, ...]] = collections.Counter()
        self.last_session = self

    def _handler(self, signum: int, frame: Any) -> None:
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append(f"{code.co_name}\x00{code.co_filename}\x00{frame.f_lineno}")
            frame = frame.f_back
        self.samples[tuple(reversed(stack))] += 1

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self._handler)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)

    @property
    def frame_records(self) -> list[tuple[list[str], float]]:
        return [(list(k), n * self.interval) for k, n in self.samples.items()]

    def output_html(self) -> str:
        raise SystemExit("--html needs --sampler pyinstrument")


ROUND_TRIPS: collections.Counter[str] = collections.Counter()


def count_round_trips() -> None:
    """Count the worker's script round trips by batch size and script names."""
    try:
        from docket_redis.store import RedisStore
    except ImportError:
        return
    original = RedisStore._evalsha

    async def counted(self: Any, calls: Any) -> Any:
        names = collections.Counter(call.name for call in calls)
        ROUND_TRIPS[" + ".join(f"{n}x{name}" for name, n in sorted(names.items()))] += 1
        return await original(self, calls)

    RedisStore._evalsha = counted  # type: ignore[method-assign]


async def main(args: argparse.Namespace, url: str) -> None:
    if args.sampler == "pyinstrument":
        from pyinstrument import Profiler

    name = f"profile-{uuid.uuid4().hex[:8]}"
    async with Docket(name=name, url=url, partitions=args.partitions) as docket:
        keys = args.limit_keys
        task = limited_task(max(1, -(-args.concurrency // keys))) if keys else noop
        docket.register(task)
        await fill(docket, args.tasks, task, keys)
        if args.round_trips:
            count_round_trips()
        worker = Worker(
            docket,
            concurrency=args.concurrency,
            minimum_check_interval=timedelta(milliseconds=10),
            scheduling_resolution=timedelta(milliseconds=10),
            schedule_automatic_tasks=False,
            freeze_gc=args.freeze_gc,
        )
        profiler: Any = (
            Profiler(interval=args.interval, async_mode="disabled")
            if args.sampler == "pyinstrument"
            else CpuSampler(args.interval)
        )
        if args.interval <= 0:  # no profiler: the same drain's plain CPU time
            async with worker:
                cpu, wall = time.process_time(), time.perf_counter()
                await worker.run_until_finished()
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            per_task = cpu / args.tasks * 1e6
            print(f"unprofiled: {wall:.2f} s wall, {cpu:.2f} s CPU, {per_task:.0f} us/task")
            return
        async with worker:
            cpu, wall = time.process_time(), time.perf_counter()
            profiler.start()
            await worker.run_until_finished()
            profiler.stop()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        done = worker.counters.get("succeeded", 0)
    session = profiler.last_session
    assert session is not None
    sampled = sum(seconds for _, seconds in session.frame_records)
    # the kernel's timer ticks (often 4 ms) limit how often SIGPROF really fires:
    # spread the measured CPU over the samples rather than trust the interval
    scale = cpu / sampled if args.sampler == "signal" and sampled else 1.0
    if args.html:
        with open(args.html, "w") as out:
            out.write(profiler.output_html())
    by_op: collections.Counter[str] = collections.Counter()
    by_lib: collections.Counter[str] = collections.Counter()
    by_leaf: collections.Counter[str] = collections.Counter()
    # under each docket operation: the first frame it called (what it spent on)
    callees: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    total = 0.0
    for stack, seconds in session.frame_records:
        seconds *= scale
        total += seconds
        innermost = None
        callee = "(self)"
        for depth in range(len(stack) - 1, -1, -1):
            innermost = docket_frame(stack[depth])
            if innermost:
                if depth + 1 < len(stack):
                    function, path = stack[depth + 1].split("\x00")[:2]
                    callee = f"{path.rsplit('/', 2)[-2:][-1]}:{function}"
                    if depth + 2 < len(stack):  # and what that spent on
                        function2, path2 = stack[depth + 2].split("\x00")[:2]
                        callee += f" > {path2.rsplit('/', 1)[-1]}:{function2}"
                break
        label = innermost or "(no docket frame: event loop, task switching)"
        by_op[label] += seconds
        callees[label][callee] += seconds
        by_lib[library(stack[-1])] += seconds
        leaf_function, leaf_path = stack[-1].split("\x00")[:2]
        by_leaf[f"{'/'.join(leaf_path.split('/')[-2:])}:{leaf_function}"] += seconds
    print(
        f"{done} of {args.tasks} no-op tasks drained from {url} at concurrency "
        f"{args.concurrency}: {wall:.2f} s wall, {cpu:.2f} s CPU "
        f"({cpu / done * 1000:.3f} s / 1k tasks, {cpu / done * 1e6:.0f} us per task); "
        f"{len(session.frame_records)} distinct stacks, {sampled / args.interval:.0f} samples "
        f"({args.sampler})"
    )
    print("\nby docket operation (innermost docket frame), share of sampled time:")
    for label, seconds in by_op.most_common(args.top):
        print(f"  {seconds / total:6.1%}  {seconds / done * 1e6:6.1f} us/task  {label}")
    for label, _ in by_op.most_common(args.detail):
        print(f"\n  under {label}:")
        for callee, seconds in callees[label].most_common(8):
            print(f"    {seconds / total:6.1%}  {seconds / done * 1e6:6.1f} us/task  {callee}")
    if ROUND_TRIPS:
        print(f"\nscript round trips: {sum(ROUND_TRIPS.values())} in all; most common:")
        for calls, n in ROUND_TRIPS.most_common(10):
            print(f"  {n:7d}  {calls}")
    print("\nby function (self time):")
    for label, seconds in by_leaf.most_common(args.top):
        print(f"  {seconds / total:6.1%}  {seconds / done * 1e6:6.1f} us/task  {label}")
    print("\nby library (self time):")
    for label, seconds in by_lib.most_common(args.top):
        print(f"  {seconds / total:6.1%}  {seconds / done * 1e6:6.1f} us/task  {label}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--client", choices=("redis", "glide"), default="redis")
    parser.add_argument("--server", default="redis-server", help="server binary")
    parser.add_argument("--url", help="an existing server instead of a private one")
    parser.add_argument(
        "--sampler", choices=("signal", "pyinstrument"), default="signal", help="see above"
    )
    parser.add_argument(
        "--interval", type=float, default=0.001, help="sampling interval (s); 0: no profiler"
    )
    parser.add_argument("--backend", default="asyncio", choices=LOOPS, help="the event loop")
    parser.add_argument("--partitions", type=int, default=1, help="the docket's partitions")
    parser.add_argument(
        "--freeze-gc", action="store_true", help="Worker(freeze_gc=True), as docket worker runs"
    )
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="each task sleeps so long")
    parser.add_argument(
        "--limit-keys",
        type=int,
        default=0,
        help="K > 0: tasks carry ConcurrencyLimit('customer', ceil(C / K)) over K customers",
    )
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--detail", type=int, default=4, help="operations to break down")
    parser.add_argument(
        "--round-trips", action="store_true", help="count script round trips (adds overhead)"
    )
    parser.add_argument("--html", help="also write pyinstrument's HTML report here")
    parser.add_argument(
        "--logging",
        default="off",
        choices=("off", "info", "dropped", "cli"),
        help="the docket.worker logger: off, at INFO to a null stream, at INFO to a "
        "handler that drops the records, or as docket worker --logging-format plain logs "
        "(drain_memory.py)",
    )
    args = parser.parse_args()
    SLEEP[0] = args.sleep_ms / 1000
    worker_logging(args.logging)
    loop = loop_options(args.backend)
    if args.url:
        anyio.run(main, args, args.url, **loop)
        return
    with private_server(args.server) as port:
        anyio.run(main, args, f"{args.client}://127.0.0.1:{port}/0", **loop)


if __name__ == "__main__":
    cli()

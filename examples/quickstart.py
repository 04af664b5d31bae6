"""docket in one process: a producer and a worker sharing ``memory://quickstart``.

Run it with ``python examples/quickstart.py``.  It schedules a handful of tasks
(async and sync, now and later, keyed, retried, perpetual), runs a worker until
nothing is left to do, and prints what ran and when, relative to the start.

With a shared store (``redis://...``), the producer and the workers would be
separate processes on separate machines; the code stays the same.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import anyio

from docket_core import Disposition, Docket, Perpetual, Retry, Worker

STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:5.2f}s] {message}", flush=True)


# -- tasks: plain functions, async or sync ------------------------------------------------------


async def greet(name: str) -> str:
    log(f"greet({name!r})")
    return f"Hello, {name}!"


def add_numbers(a: int, b: int) -> int:
    """A sync task: docket runs it without blocking the worker's event loop."""
    log(f"add_numbers({a}, {b}) = {a + b}")
    return a + b


async def send_report(customer_id: int) -> None:
    log(f"send_report(customer_id={customer_id})")


async def flaky(retry: Retry = Retry(attempts=3, delay=timedelta(milliseconds=100))) -> str:
    """Fails on its first two attempts; ``Retry`` runs it again 100 ms later each time."""
    if retry.attempt < 3:
        log(f"flaky: attempt {retry.attempt} of {retry.attempts} fails")
        raise ConnectionError("the service is not ready yet")
    log(f"flaky: attempt {retry.attempt} succeeds")
    return "ok"


ticks = 0


async def tick(perpetual: Perpetual = Perpetual(every=timedelta(milliseconds=300))) -> None:
    """Runs again every 300 ms until it cancels itself on its third run."""
    global ticks
    ticks += 1
    log(f"tick #{ticks}")
    if ticks == 3:
        perpetual.cancel()


# -- producer and worker -----------------------------------------------------------------------


async def main() -> None:
    async with Docket(name="quickstart", url="memory://quickstart") as docket:
        for task in (greet, add_numbers, send_report, flaky, tick):
            docket.register(task)

        greeting = await docket.add(greet)("world")
        log(f"added greet now: key={greeting.key}")

        later = datetime.now(UTC) + timedelta(seconds=1)
        await docket.add(add_numbers, when=later)(2, 3)
        log("added add_numbers(2, 3) for 1 s from now")

        first = await docket.add(send_report, when=later, key="report-42")(42)
        second = await docket.add(send_report, when=later, key="report-42")(42)
        log(f"send_report key=report-42: first {first.disposition.name}, "
            f"second {second.disposition.name}")  # fmt: skip
        assert first.disposition is Disposition.SCHEDULED
        assert second.disposition is Disposition.ALREADY_SCHEDULED

        await docket.add(flaky)()
        await docket.add(tick)()
        log("added flaky() with Retry(attempts=3) and tick() with Perpetual(every=300 ms)")

        async with Worker(docket, concurrency=4) as worker:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(worker.run_until_finished)
                result = await greeting.get_result(timeout=timedelta(seconds=5))
                log(f"greet's result: {result!r}")
        log("the worker finished: nothing is scheduled, queued or running")


if __name__ == "__main__":
    anyio.run(main)

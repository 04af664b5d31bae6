"""The chaos run's shared settings, its ledger, its tasks and its worker process.

The same functions run in the driver (which registers them to add tasks) and in
the worker processes (``chaos.py worker ...`` calls ``worker_main``).  Every run
of a task body appends a ``start`` and an ``end`` line to the ledger; a task that
raises ``SystemExit`` appends a ``sysexit`` line first, so the driver knows the
worker's exit was asked for.  See ``chaos.py`` for the overview.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

import anyio

from docket_core import (
    ConcurrencyLimit,
    CurrentExecution,
    Docket,
    Execution,
    Retry,
    StoreError,
    Worker,
)

#: the limit every ``chaos_limited`` run shares with the other runs of its customer
MAX_PER_CUSTOMER = 2
CUSTOMERS = ("c0", "c1", "c2")
RETRY_ATTEMPTS = 3
RETRY_DELAY = timedelta(milliseconds=150)
#: the workers' settings
CONCURRENCY = 8
REDELIVERY_TIMEOUT = timedelta(seconds=3)
RECONNECTION_DELAY = timedelta(milliseconds=150)
CHECK_INTERVAL = timedelta(milliseconds=25)
#: the drain stops waiting when every key is settled but pending stays above 0 this long
STUCK_SECONDS = 5.0
#: "stall-kill" is a CLIENT KILL sent while a side connection's 50 ms script holds
#: the server: the kill waits behind the commands that queued meanwhile, so it
#: usually closes connections whose commands ran and whose replies are not sent yet
#: "claim-kill" aims that at a concurrency-slot request: a MONITOR connection waits
#: for a worker's claim of a limited task, the stall starts at once, so the slot
#: request the worker sends on the claim's reply queues behind it and runs just
#: before the kill closes its connection: the worker gets no reply and resends it
#: "poison" XADDs a malformed entry straight into the docket's stream
FAULT_KINDS = (
    "worker-kill",
    "worker-term",
    "server-kill",
    "client-kill",
    "stall-kill",
    "claim-kill",
    "poison",
)
FAULT_WEIGHTS = (0.09, 0.09, 0.18, 0.09, 0.09, 0.36, 0.1)
STALL_MS = 50
STALL_SCRIPT = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= tonumber(ARGV[1])
return 1
"""
#: the exit status of the ``exits`` tasks' ``SystemExit`` (the worker still exits 0)
TASK_EXIT_CODE = 3

# -- the ledger -------------------------------------------------------------------------

#: set in worker processes: the ledger's descriptor and the worker's name
_ledger_fd: int | None = None
_worker_name = "?"
_runs = 0


def append(fd: int, *fields: object) -> None:
    """One ledger line, in one write to a file opened with O_APPEND."""
    os.write(fd, (" ".join(str(f) for f in fields) + "\n").encode())


def now_text() -> str:
    return f"{time.time():.6f}"


# -- the tasks (the same functions in the driver and in the workers) -----------------


async def _body(
    execution: Execution, customer: str, ms: int, raises: BaseException | None = None
) -> None:
    """Ledger a run that sleeps ``ms`` then raises ``raises`` (if any).  Its
    ``end`` line says ``ok``, ``raised`` (it raised on purpose, even a
    ``CancelledError`` of its own), ``cancelled`` (docket cancelled it) or
    ``error`` (anything else)."""
    global _runs
    fd = _ledger_fd
    assert fd is not None, "task bodies run in worker processes only"
    _runs += 1
    run = f"{os.getpid()}.{_runs}"
    fields = (execution.key, execution.attempt, execution.generation, customer)
    append(fd, "start", run, *fields, _worker_name, os.getpid(), now_text())
    outcome = "ok"
    try:
        await anyio.sleep(ms / 1000)
        if raises is not None:
            outcome = "raised"
            if isinstance(raises, SystemExit):
                # the driver's monitor reads this: the worker's coming exit is asked
                append(fd, "sysexit", _worker_name, os.getpid(), now_text(), execution.key)
            raise raises
    except anyio.get_cancelled_exc_class():
        if outcome == "ok":  # a cancellation from outside, not the task's own raise
            outcome = "cancelled"
        raise
    except BaseException:
        if outcome == "ok":
            outcome = "error"
        raise
    finally:
        append(fd, "end", run, *fields, _worker_name, os.getpid(), now_text(), outcome)


async def chaos_plain(ms: int, execution: Execution = CurrentExecution()) -> None:
    await _body(execution, "-", ms)


async def chaos_limited(
    customer: str,
    ms: int,
    execution: Execution = CurrentExecution(),
    limit: ConcurrencyLimit = ConcurrencyLimit("customer", max_concurrent=MAX_PER_CUSTOMER),
) -> None:
    await _body(execution, customer, ms)


async def chaos_flaky(
    ms: int,
    succeed_on: int,
    execution: Execution = CurrentExecution(),
    retry: Retry = Retry(attempts=RETRY_ATTEMPTS, delay=RETRY_DELAY),
) -> None:
    """Fails until attempt ``succeed_on`` (beyond the attempts: fails for good)."""
    failure = None
    if execution.attempt < succeed_on:
        failure = RuntimeError(f"attempt {execution.attempt} fails on purpose")
    await _body(execution, "-", ms, failure)


async def chaos_rogue(ms: int, execution: Execution = CurrentExecution()) -> None:
    """Raises ``CancelledError`` by itself (docket did not cancel it): a failure,
    and the worker goes on."""
    await _body(execution, "-", ms, asyncio.CancelledError())


async def chaos_exits(ms: int, execution: Execution = CurrentExecution()) -> None:
    """Raises ``SystemExit``: the run fails, then its worker stops after draining
    its other runs (exit status 0)."""
    await _body(execution, "-", ms, SystemExit(TASK_EXIT_CODE))


TASKS: tuple[Callable[..., Any], ...] = (
    chaos_plain,
    chaos_limited,
    chaos_flaky,
    chaos_rogue,
    chaos_exits,
)


# -- the worker process ---------------------------------------------------------------


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def trace_failed_batches(docket: Docket) -> None:
    """Ledger a ``batch-error`` line (the scripts it called) for every batch of
    script calls that fails in this worker: the batches a worker then resends."""
    adapter: Any = docket.adapter
    run_calls = adapter.run_calls

    async def traced(calls: Any) -> Any:
        try:
            return await run_calls(calls)
        except StoreError as error:
            names = ",".join(call.name for call in calls) or "-"
            keys = sorted(
                {
                    found.decode()
                    for call in calls
                    if call.name == "acquire"
                    for arg in call.args
                    for found in re.findall(rb"(?:limited|future)-[0-9-]+", _bytes(arg))
                }
            )
            assert _ledger_fd is not None
            append(
                _ledger_fd,
                "batch-error",
                _worker_name,
                os.getpid(),
                now_text(),
                names,
                ",".join(keys) or "-",
                type(error).__name__,
            )
            raise error

    adapter.run_calls = traced


async def worker_main(url: str, docket_name: str, worker_name: str, ledger: str) -> None:
    global _ledger_fd, _worker_name
    _ledger_fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    _worker_name = worker_name
    stop_early = False

    def early_term(signum: int, frame: object) -> None:
        nonlocal stop_early
        stop_early = True

    # a SIGTERM before the worker listens for it still means "stop cleanly"
    signal.signal(signal.SIGTERM, early_term)
    # from here on a SIGTERM is this process's to handle (before it, Python's
    # default kills a process that has not started: it held nothing)
    append(_ledger_fd, "up", worker_name, os.getpid(), now_text())
    async with AsyncExitStack() as stack:
        deadline = time.monotonic() + 60
        while True:  # the server may be restarting as this worker starts
            try:
                docket = await stack.enter_async_context(Docket(name=docket_name, url=url))
                break
            except StoreError as error:
                if time.monotonic() > deadline or stop_early:
                    raise
                print(f"cannot open the docket yet: {error}", flush=True)
                await anyio.sleep(0.2)
        for task in TASKS:
            docket.register(task)
        trace_failed_batches(docket)
        worker = Worker(
            docket,
            name=worker_name,
            concurrency=CONCURRENCY,
            redelivery_timeout=REDELIVERY_TIMEOUT,
            reconnection_delay=RECONNECTION_DELAY,
            minimum_check_interval=CHECK_INTERVAL,
            scheduling_resolution=CHECK_INTERVAL,
            schedule_automatic_tasks=False,
        )
        if stop_early:
            return
        async with worker:
            await worker.run_forever()
        print(f"{worker_name} stopped: {dict(worker.counters)}", flush=True)


def quiet_glide() -> None:
    """GLIDE logs every lost connection as a warning; the faults make many."""
    from glide import Logger, LogLevel

    Logger.set_logger_config(LogLevel.ERROR)

"""Chaos run: worker processes, a producer and random faults on a private redis-server.

Run it as a script::

    python tests/chaos/chaos.py --client redis --seconds 60 --workers 4 --seed 1
    python tests/chaos/chaos.py --client glide --seconds 60 --workers 4 --seed 1

or call ``run_chaos(...)`` (``tests/chaos/test_chaos.py`` does, briefly).

The driver (this process) starts a redis-server with AOF on and ``--appendfsync
always`` on a free loopback port, starts worker subprocesses (this same file,
``worker`` subcommand, on asyncio), adds a stream of tasks (plain, limited to two
at a time per customer, retried after failures, due a little later) and, for a
fixed time, injects faults at random from a seed: worker SIGKILL, worker
SIGTERM (each followed by a replacement worker), server SIGKILL and restart on
the same port and directory (the AOF reloads), ``CLIENT KILL TYPE normal``, and
two sharper kinds of it: ``stall-kill`` sends the kill while a side connection's
50 ms script holds the server, so it lands right after the commands that queued
meanwhile ran (their replies are lost); ``claim-kill`` starts that stall as soon
as MONITOR shows a worker claiming a limited task, so the concurrency-slot request
that follows is what runs without a reply.  Worker processes also ledger every
batch of script calls that fails (``batch-error``: the batches they resend).

Every run of a task body appends a ``start`` line and, in a ``finally``, an
``end`` line to one ledger file opened with O_APPEND (one ``os.write`` a line,
so a line survives a SIGKILL); the driver appends its faults to the same file.
After the faults stop, the surviving workers drain, are stopped with SIGTERM,
and the run checks:

- nothing lost: every added key ends ``completed`` (``failed`` for the tasks
  meant to fail for good), after a finished run of its own;
- nothing left over: pending is 0, ``{NAME}:parked`` is empty, no record keeps
  ``parked``/``pin``, no wait list is left, and no slot is held by a worker that
  was not SIGKILLed (a SIGKILLed holder's slot expires by itself);
- no key ran in two worker processes at once (a SIGKILLed worker's open runs end
  at its kill time), nor twice at once in one process;
- no customer had more than two runs at once;
- no worker died unasked, and every worker told to stop exited cleanly.

Keys that ran more than once (at-least-once redeliveries) are counted, not
failed on.  The exit status is non-zero when an invariant fails; the run's
directory (ledger, worker logs, server log) is kept then.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
for _path in (str(ROOT), str(TESTS)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import anyio  # noqa: E402
import redis  # noqa: E402
from servers import Server, free_port, redis_server_binary  # noqa: E402

from docket_core import (  # noqa: E402
    ConcurrencyLimit,
    CurrentExecution,
    Docket,
    Execution,
    ExecutionState,
    Retry,
    StoreError,
    Worker,
)
from docket_core.lua import SCRIPTS  # noqa: E402

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
FAULT_KINDS = (
    "worker-kill",
    "worker-term",
    "server-kill",
    "client-kill",
    "stall-kill",
    "claim-kill",
)
FAULT_WEIGHTS = (0.1, 0.1, 0.2, 0.1, 0.1, 0.4)
STALL_MS = 50
STALL_SCRIPT = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= tonumber(ARGV[1])
return 1
"""

# -- the tasks (the same functions in the driver and in the workers) -----------------

#: set in worker processes: the ledger's descriptor and the worker's name
_ledger_fd: int | None = None
_worker_name = "?"
_runs = 0


def append(fd: int, *fields: object) -> None:
    """One ledger line, in one write to a file opened with O_APPEND."""
    os.write(fd, (" ".join(str(f) for f in fields) + "\n").encode())


def now_text() -> str:
    return f"{time.time():.6f}"


async def _body(execution: Execution, customer: str, ms: int, fail: bool) -> None:
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
        if fail:
            outcome = "raised"
            raise RuntimeError(f"attempt {execution.attempt} fails on purpose")
    except anyio.get_cancelled_exc_class():
        outcome = "cancelled"
        raise
    except BaseException:
        if outcome == "ok":
            outcome = "error"
        raise
    finally:
        append(fd, "end", run, *fields, _worker_name, os.getpid(), now_text(), outcome)


async def chaos_plain(ms: int, execution: Execution = CurrentExecution()) -> None:
    await _body(execution, "-", ms, fail=False)


async def chaos_limited(
    customer: str,
    ms: int,
    execution: Execution = CurrentExecution(),
    limit: ConcurrencyLimit = ConcurrencyLimit("customer", max_concurrent=MAX_PER_CUSTOMER),
) -> None:
    await _body(execution, customer, ms, fail=False)


async def chaos_flaky(
    ms: int,
    succeed_on: int,
    execution: Execution = CurrentExecution(),
    retry: Retry = Retry(attempts=RETRY_ATTEMPTS, delay=RETRY_DELAY),
) -> None:
    """Fails until attempt ``succeed_on`` (beyond the attempts: fails for good)."""
    await _body(execution, "-", ms, fail=execution.attempt < succeed_on)


TASKS: tuple[Callable[..., Any], ...] = (chaos_plain, chaos_limited, chaos_flaky)


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


# -- the driver -----------------------------------------------------------------------


@dataclass
class Spec:
    """One task the producer added."""

    key: str
    kind: str  # plain | limited | flaky | doomed | future
    customer: str
    added: bool = False
    #: the add raised at least once (a retry checks the record first)
    retried: bool = False

    @property
    def expected(self) -> ExecutionState:
        return ExecutionState.FAILED if self.kind == "doomed" else ExecutionState.COMPLETED


@dataclass
class WorkerProcess:
    name: str
    process: subprocess.Popen[bytes]
    started: float
    log: Path
    #: "kill" or "term" once the driver told it to stop
    told: str | None = None
    told_at: float | None = None
    exited: int | None = None
    exited_at: float | None = None


@dataclass
class Run:
    run: str
    key: str
    attempt: int
    generation: int
    customer: str
    worker: str
    pid: int
    start: float
    end: float | None = None
    outcome: str = "open"


@dataclass
class Report:
    client: str
    seed: int
    seconds: float
    directory: str
    faults: Counter[str] = field(default_factory=Counter)
    added: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    add_errors: int = 0
    not_added: list[str] = field(default_factory=list)
    runs: int = 0
    duplicates: int = 0
    redelivered_runs: int = 0
    overlaps: list[str] = field(default_factory=list)
    self_overlaps: list[str] = field(default_factory=list)
    limit_violations: list[str] = field(default_factory=list)
    max_per_customer: int = 0
    wrong_states: list[str] = field(default_factory=list)
    never_ran: list[str] = field(default_factory=list)
    open_runs: list[str] = field(default_factory=list)
    pending: int = -1
    leftovers: list[str] = field(default_factory=list)
    stale_killed_slots: int = 0
    died: list[str] = field(default_factory=list)
    unclean_stops: list[str] = field(default_factory=list)
    drained: bool = False
    #: the drain gave up early: every key settled, pending stayed above 0
    stuck: bool = False
    drain_seconds: float = 0.0
    workers_started: int = 0
    failures: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Turn the measurements into the list of failed invariants."""
        self.failures = []

        def fail(what: str, items: list[str]) -> None:
            if items:
                shown = "\n    ".join(items[:12])
                more = f"\n    ... {len(items) - 12} more" if len(items) > 12 else ""
                self.failures.append(f"{what} ({len(items)}):\n    {shown}{more}")

        fail("keys not in their expected final state", self.wrong_states)
        fail("adds that kept failing until the producer gave up", self.not_added)
        fail("keys whose record concluded without a finished run", self.never_ran)
        if not self.drained:
            self.failures.append(f"not drained ({self.drain_end}; pending {self.pending})")
        if self.pending != 0:
            self.failures.append(f"pending is {self.pending}, not 0, after the drain")
        fail("leftover keys and fields", self.leftovers)
        fail("one key running in two worker processes at once", self.overlaps)
        fail("one key running twice at once in one worker process", self.self_overlaps)
        fail(f"more than {MAX_PER_CUSTOMER} runs of one customer at once", self.limit_violations)
        fail("runs that never ended in a worker that was not killed", self.open_runs)
        fail("workers that died without being told to", self.died)
        fail("workers told to stop that did not stop cleanly", self.unclean_stops)

    @property
    def drain_end(self) -> str:
        if self.drained:
            return "drained"
        return "stuck: all keys settled, pending > 0" if self.stuck else "deadline hit"

    @property
    def ok(self) -> bool:
        return not self.failures

    def table(self) -> str:
        faults = ", ".join(f"{kind} {self.faults[kind]}" for kind in FAULT_KINDS)
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(self.kinds.items()))
        rows = [
            ("client / seed / seconds", f"{self.client} / {self.seed} / {self.seconds:g}"),
            ("faults", f"{sum(self.faults.values())} ({faults})"),
            ("workers started", str(self.workers_started)),
            ("tasks added", f"{self.added} ({kinds}); add errors retried {self.add_errors}"),
            ("runs (task bodies started)", str(self.runs)),
            ("duplicates (key+attempt run >1)", f"{self.duplicates} keys"),
            ("overlaps across workers", str(len(self.overlaps))),
            ("overlaps in one worker", str(len(self.self_overlaps))),
            (
                f"limit violations (>{MAX_PER_CUSTOMER}/customer)",
                f"{len(self.limit_violations)} (max seen {self.max_per_customer})",
            ),
            ("wrong final states", str(len(self.wrong_states))),
            ("concluded without a run", str(len(self.never_ran))),
            ("pending after drain", str(self.pending)),
            ("leftovers", str(len(self.leftovers))),
            ("stale slots of killed workers", str(self.stale_killed_slots)),
            ("open runs (not killed)", str(len(self.open_runs))),
            ("workers died / unclean stops", f"{len(self.died)} / {len(self.unclean_stops)}"),
            (
                "drain time",
                f"{self.drain_seconds:.1f} s" + ("" if self.drained else f" ({self.drain_end})"),
            ),
            ("result", "PASS" if self.ok else f"FAIL ({len(self.failures)} invariants)"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" for name, value in rows]
        rule = "-" * max(len(line) for line in lines)
        return "\n".join([rule, *lines, rule])


class Chaos:
    """One chaos run; ``await Chaos(...).run()`` returns its report."""

    def __init__(
        self,
        *,
        client: str,
        seconds: float,
        workers: int,
        seed: int,
        drain_seconds: float,
        rate: float,
        verbose: bool,
    ) -> None:
        if client not in ("redis", "glide"):
            raise ValueError(f"client must be redis or glide, not {client!r}")
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.client = client
        self.seconds = seconds
        self.worker_count = workers
        self.seed = seed
        self.drain_limit = drain_seconds
        self.rate = rate
        self.verbose = verbose
        self.rng = random.Random(seed)
        self.directory = Path(tempfile.mkdtemp(prefix="docket-chaos-"))
        self.server = Server(
            binary,
            port=free_port(),
            directory=str(self.directory / "server"),
            extra_args=["--appendonly", "yes", "--appendfsync", "always"],
        )
        os.makedirs(self.server.directory)
        self.name = f"chaos-{seed}-{os.getpid()}"
        scheme = "glide" if client == "glide" else "redis"
        self.url = f"{scheme}://127.0.0.1:{self.server.port}/0"
        self.ledger = self.directory / "ledger.txt"
        self.fd = os.open(self.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.workers: list[WorkerProcess] = []
        self.specs: dict[str, Spec] = {}
        self.report = Report(client, seed, seconds, str(self.directory))
        self.spawned = 0
        #: the driver stops replacing workers once it stops them all
        self.replacing = True
        self.server_lock = anyio.Lock()

    def log(self, message: str) -> None:
        if self.verbose:
            print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    # -- worker processes ------------------------------------------------------------

    def spawn(self) -> WorkerProcess:
        self.spawned += 1
        name = f"w{self.spawned}"
        log = self.directory / f"{name}.log"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1",
        }
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "worker",
                    self.url,
                    self.name,
                    name,
                    str(self.ledger),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        worker = WorkerProcess(name, process, time.time(), log)
        self.workers.append(worker)
        append(self.fd, "spawn", name, process.pid, now_text())
        return worker

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.told is None and w.exited is None]

    def tell(self, worker: WorkerProcess, how: str) -> None:
        worker.told = how
        os.kill(worker.process.pid, signal.SIGKILL if how == "kill" else signal.SIGTERM)
        worker.told_at = time.time()
        append(self.fd, how, worker.name, worker.process.pid, f"{worker.told_at:.6f}")

    async def monitor(self) -> None:
        """Notice exits; a worker that dies unasked is recorded and replaced."""
        while True:
            for worker in self.workers:
                if worker.exited is not None:
                    continue
                code = worker.process.poll()
                if code is None:
                    continue
                worker.exited, worker.exited_at = code, time.time()
                append(self.fd, "exit", worker.name, worker.process.pid, now_text(), code)
                if worker.told is None:
                    tail = worker.log.read_text(errors="replace")[-1500:]
                    self.report.died.append(
                        f"{worker.name} (pid {worker.process.pid}) exited {code} unasked:\n{tail}"
                    )
                    self.log(f"{worker.name} died by itself ({code})")
                    if self.replacing:
                        self.spawn()
                elif worker.told == "term" and code != 0:
                    tail = worker.log.read_text(errors="replace")[-1500:]
                    self.report.unclean_stops.append(
                        f"{worker.name} (pid {worker.process.pid}) exited {code} "
                        f"after SIGTERM:\n{tail}"
                    )
            await anyio.sleep(0.05)

    # -- faults -----------------------------------------------------------------------

    async def fault(self, kind: str) -> bool:
        """Inject one fault; False if it could not be injected now."""
        rng = self.rng
        if kind in ("worker-kill", "worker-term"):
            # a worker gets a moment to start before it is asked to drain
            candidates = [
                w for w in self.live() if kind == "worker-kill" or time.time() - w.started > 1.5
            ]
            if not candidates:
                return False
            victim = rng.choice(candidates)
            self.tell(victim, "kill" if kind == "worker-kill" else "term")
            self.log(f"{kind} {victim.name} (pid {victim.process.pid})")
            self.spawn()
        elif kind == "server-kill":
            downtime = rng.uniform(0.05, 0.5)
            async with self.server_lock:
                await anyio.to_thread.run_sync(self.server.kill)
                append(self.fd, "server-kill", "-", "-", now_text())
                await anyio.sleep(downtime)
                await anyio.to_thread.run_sync(self.server.start)
                append(self.fd, "server-up", "-", "-", now_text())
            self.log(f"server killed and restarted ({downtime:.2f} s down)")
        elif kind == "client-kill":
            killed = await anyio.to_thread.run_sync(self.client_kill)
            append(self.fd, "client-kill", "-", "-", now_text(), killed)
            self.log(f"client kill: {killed} connections")
        elif kind == "stall-kill":
            killed = await anyio.to_thread.run_sync(self.stall_kill)
            append(self.fd, "stall-kill", "-", "-", now_text(), killed)
            self.log(f"client kill after a stall: {killed} connections")
        else:
            killed = await anyio.to_thread.run_sync(self.claim_kill)
            if killed < 0:
                return False  # no limited claim within the time
            append(self.fd, "claim-kill", "-", "-", now_text(), killed)
            self.log(f"client kill after a limited claim: {killed} connections")
        self.report.faults[kind] += 1
        return True

    def client_kill(self) -> int:
        side: Any = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=5)
        try:
            killed: int = side.execute_command("CLIENT", "KILL", "TYPE", "normal")
            return killed
        finally:
            side.close()

    def stall_kill(self, after_claim: bool = False) -> int:
        """Hold the server with a busy script on one side connection and send
        CLIENT KILL TYPE normal on another meanwhile; with ``after_claim``, start
        the stall as soon as a worker claims a limited task (-1: none did)."""
        stall: Any = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=5)
        side: Any = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=5)
        try:
            side.ping()
            stall.ping()
            if after_claim and not self.await_limited_claim():
                return -1
            done: list[int] = []

            def hold() -> None:
                try:
                    stall.eval(STALL_SCRIPT, 0, STALL_MS * 1000)
                except redis.RedisError:
                    pass  # the kill closes this connection too

            holder = threading.Thread(target=hold)
            holder.start()
            time.sleep(STALL_MS * 0.8 / 1000)
            done.append(side.execute_command("CLIENT", "KILL", "TYPE", "normal"))
            holder.join(5)
            return done[0]
        finally:
            side.close()
            stall.close()

    def claim_kill(self) -> int:
        return self.stall_kill(after_claim=True)

    def await_limited_claim(self, within: float = 2.0) -> bool:
        """Watch the server (MONITOR) until a worker claims a limited task."""
        claim = hashlib.sha1(SCRIPTS["claim"].encode()).hexdigest()
        watcher: Any = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=within)
        deadline = time.time() + within
        try:
            with watcher.monitor() as monitor:
                while time.time() < deadline:
                    command = str(monitor.next_command().get("command", ""))
                    if claim in command.lower() and "limited-" in command:
                        return True
        except redis.RedisError:
            pass
        finally:
            watcher.close()
        return False

    async def inject(self, until: float) -> None:
        while time.time() < until:
            await anyio.sleep(self.rng.uniform(0.2, 0.8))
            if time.time() >= until:
                return
            kind = self.rng.choices(FAULT_KINDS, FAULT_WEIGHTS)[0]
            await self.fault(kind)

    # -- the producer -----------------------------------------------------------------

    async def produce(self, docket: Docket, until: float) -> None:
        rng = random.Random(self.seed + 1)
        number = 0
        while time.time() < until:
            choice = rng.random()
            batch: list[tuple[Spec, Callable[..., Any], tuple[Any, ...], datetime | None]] = []
            if choice < 0.35:
                spec = Spec(f"plain-{number}", "plain", "-")
                batch.append((spec, chaos_plain, (rng.randint(5, 100),), None))
            elif choice < 0.65:
                customer = rng.choice(CUSTOMERS)
                for _ in range(rng.randint(1, 4)):  # bursts, so that runs park
                    spec = Spec(f"limited-{number}-{len(batch)}", "limited", customer)
                    batch.append((spec, chaos_limited, (customer, rng.randint(10, 60)), None))
            elif choice < 0.75:
                spec = Spec(f"flaky-{number}", "flaky", "-")
                batch.append((spec, chaos_flaky, (rng.randint(5, 50), rng.randint(2, 3)), None))
            elif choice < 0.80:
                spec = Spec(f"doomed-{number}", "doomed", "-")
                doomed = (rng.randint(5, 50), RETRY_ATTEMPTS + 1)
                batch.append((spec, chaos_flaky, doomed, None))
            else:
                when = datetime.now(UTC) + timedelta(seconds=rng.uniform(0.1, 3.0))
                if rng.random() < 0.5:
                    spec = Spec(f"future-{number}", "future", "-")
                    batch.append((spec, chaos_plain, (rng.randint(5, 100),), when))
                else:
                    customer = rng.choice(CUSTOMERS)
                    spec = Spec(f"future-{number}", "future", customer)
                    batch.append((spec, chaos_limited, (customer, rng.randint(10, 60)), when))
            number += 1
            for task_spec, function, task_args, task_when in batch:
                self.specs[task_spec.key] = task_spec
                await self.add(docket, task_spec, function, task_args, task_when, until + 15)
            await anyio.sleep(rng.expovariate(self.rate))

    async def add(
        self,
        docket: Docket,
        spec: Spec,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        when: datetime | None,
        give_up_at: float,
    ) -> None:
        """Add once, retrying through faults; a retry first looks for the record,
        since the failed attempt may have reached the store."""
        while time.time() < give_up_at:
            try:
                if spec.retried and await docket.get_execution(spec.key) is not None:
                    spec.added = True
                    return
                await docket.add(function, key=spec.key, when=when)(*args)
                spec.added = True
                return
            except Exception as error:  # every failure of an add is retried
                spec.retried = True
                self.report.add_errors += 1
                self.log(f"add {spec.key} failed: {type(error).__name__}: {error}")
                await anyio.sleep(0.1)
        self.report.not_added.append(spec.key)

    # -- the run ----------------------------------------------------------------------

    async def run(self) -> Report:
        report = self.report
        await anyio.to_thread.run_sync(self.server.start)
        append(self.fd, "server-up", "-", "-", now_text())
        self.log(f"server on port {self.server.port}, directory {self.directory}")
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self.monitor)
                for _ in range(self.worker_count):
                    self.spawn()
                async with Docket(name=self.name, url=self.url) as docket:
                    for task in TASKS:
                        docket.register(task)
                    until = time.time() + self.seconds
                    async with anyio.create_task_group() as chaos:
                        chaos.start_soon(self.produce, docket, until)
                        chaos.start_soon(self.inject, until)
                    self.log("faults stopped; draining")
                    await self.drain(docket)
                    await self.stop_workers()
                    report.pending = await docket.adapter.pending()
                    await self.check_records(docket)
                group.cancel_scope.cancel()
            self.check_server()
            self.check_ledger()
        finally:
            for worker in self.workers:
                if worker.process.poll() is None:
                    worker.process.kill()
                    worker.process.wait()
            os.close(self.fd)
            self.server.stop()
        report.workers_started = self.spawned
        report.added = sum(1 for s in self.specs.values() if s.added)
        report.kinds = Counter(s.kind for s in self.specs.values() if s.added)
        report.check()
        return report

    async def drain(self, docket: Docket) -> None:
        """Wait until pending is 0 and every key is settled, up to the deadline; give
        up early when every key is settled but pending stays above 0 (stuck)."""
        started = time.time()
        deadline = started + self.drain_limit
        unsettled = {key for key, spec in self.specs.items() if spec.added}
        terminal = {ExecutionState.COMPLETED, ExecutionState.FAILED, ExecutionState.CANCELLED}
        settled_since: float | None = None
        checked = 0.0
        while time.time() < deadline:
            try:
                pending = await docket.adapter.pending()
                if pending == 0 or time.time() - checked > 1.0:
                    checked = time.time()
                    for key in list(unsettled):
                        execution = await docket.get_execution(key)
                        if execution is not None and execution.state in terminal:
                            unsettled.discard(key)
                if not unsettled and pending == 0:
                    self.report.drained = True
                    break
                if unsettled or settled_since is None:
                    settled_since = None if unsettled else time.time()
                elif time.time() - settled_since > STUCK_SECONDS:
                    self.log(f"every key is settled, yet pending stays {pending}: stuck")
                    self.report.stuck = True
                    break
            except StoreError as error:
                self.log(f"drain: {error}")
            await anyio.sleep(0.25)
        self.report.drain_seconds = time.time() - started
        self.log(f"drained: {self.report.drained} in {self.report.drain_seconds:.1f} s")

    async def stop_workers(self) -> None:
        self.replacing = False
        for worker in self.live():
            self.tell(worker, "term")
        deadline = time.time() + 30
        while time.time() < deadline and any(w.exited is None for w in self.workers):
            await anyio.sleep(0.1)
        for worker in self.workers:
            if worker.exited is None:
                self.report.unclean_stops.append(
                    f"{worker.name} (pid {worker.process.pid}) still running 30 s after SIGTERM"
                )

    async def check_records(self, docket: Docket) -> None:
        for key, spec in sorted(self.specs.items()):
            if not spec.added:
                continue
            execution = await docket.get_execution(key)
            state = execution.state.value if execution is not None else "missing"
            if execution is None or execution.state is not spec.expected:
                error = f" ({execution.error})" if execution is not None and execution.error else ""
                self.report.wrong_states.append(
                    f"{key} ({spec.kind}): {state}, expected {spec.expected.value}{error}"
                )

    def check_server(self) -> None:
        """Look at the docket's keys directly."""
        report = self.report
        prefix = "{" + self.name + "}"
        side: Any = redis.Redis(host="127.0.0.1", port=self.server.port, decode_responses=True)
        killed = {w.name for w in self.workers if w.told == "kill"}
        try:
            parked = sorted(side.smembers(f"{prefix}:parked"))
            for key in parked:
                report.leftovers.append(f"{prefix}:parked holds {key}")
            for run_key in side.scan_iter(match=f"{prefix}:run:*", count=1000):
                state, parked_on, pin = side.hmget(run_key, "state", "parked", "pin")
                if parked_on is not None or pin is not None:
                    report.leftovers.append(
                        f"{run_key}: state={state} parked={parked_on} pin={pin}"
                    )
            for wait_key in side.scan_iter(match=f"{prefix}:wait:*", count=1000):
                entries = side.lrange(wait_key, 0, -1)
                report.leftovers.append(f"{wait_key}: {len(entries)} waiters {entries[:4]}")
            for slots_key in side.scan_iter(match=f"{prefix}:slots:*", count=1000):
                for holder, score in side.zrange(slots_key, 0, -1, withscores=True):
                    worker = holder.removeprefix(f"{self.name}/").split("/", 1)[0]
                    if worker in killed:
                        report.stale_killed_slots += 1
                    else:
                        report.leftovers.append(
                            f"{slots_key}: held by {holder} (worker {worker} not killed, "
                            f"renewed {score:.3f})"
                        )
        finally:
            side.close()

    def check_ledger(self) -> None:
        report = self.report
        runs: dict[str, Run] = {}
        killed_at: dict[int, float] = {}
        exited_at: dict[int, float] = {}
        for line in self.ledger.read_text().splitlines():
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "start":
                run_id, key, attempt, gen, customer, worker, pid, t = parts[1:9]
                runs[run_id] = Run(
                    run_id, key, int(attempt), int(gen), customer, worker, int(pid), float(t)
                )
            elif parts[0] == "end" and parts[1] in runs:
                runs[parts[1]].end = float(parts[8])
                runs[parts[1]].outcome = parts[9]
            elif parts[0] == "kill":
                killed_at[int(parts[2])] = float(parts[3])
            elif parts[0] == "exit":
                exited_at[int(parts[2])] = float(parts[3])
        report.runs = len(runs)
        faults = self.fault_times()
        for run in runs.values():
            if run.end is not None:
                continue
            if run.pid in killed_at:
                run.end, run.outcome = max(killed_at[run.pid], run.start), "killed"
            else:
                run.end = exited_at.get(run.pid, time.time())
                report.open_runs.append(self.describe(run, faults))

        by_key: dict[str, list[Run]] = defaultdict(list)
        for run in runs.values():
            by_key[run.key].append(run)
        for key, spec in self.specs.items():
            if not spec.added:
                continue
            finished = [r for r in by_key.get(key, []) if r.outcome in ("ok", "raised")]
            wanted = "raised" if spec.kind == "doomed" else "ok"
            if not any(r.outcome == wanted for r in finished):
                report.never_ran.append(
                    f"{key} ({spec.kind}): runs {[self.describe(r, faults) for r in by_key[key]]}"
                )
        for key, key_runs in by_key.items():
            attempts = Counter((r.attempt, r.generation) for r in key_runs)
            if any(count > 1 for count in attempts.values()):
                report.duplicates += 1
            key_runs.sort(key=lambda r: r.start)
            for i, first in enumerate(key_runs):
                for second in key_runs[i + 1 :]:
                    assert first.end is not None and second.end is not None
                    if second.start >= first.end:
                        continue
                    text = (
                        f"{key}: {self.describe(first, faults)} | {self.describe(second, faults)}"
                    )
                    if first.pid != second.pid:
                        report.overlaps.append(text)
                    else:
                        report.self_overlaps.append(text)
        self.check_limits(runs.values(), faults)

    def check_limits(self, runs: Iterable[Run], faults: list[tuple[float, str]]) -> None:
        report = self.report
        by_customer: dict[str, list[Run]] = defaultdict(list)
        for run in runs:
            if run.customer != "-":
                by_customer[run.customer].append(run)
        for customer, customer_runs in sorted(by_customer.items()):
            # ends before starts at the same instant: touching runs do not overlap
            events = sorted(
                [(r.start, 1, r) for r in customer_runs]
                + [(r.end or r.start, -1, r) for r in customer_runs],
                key=lambda e: (e[0], e[1]),
            )
            active: dict[str, Run] = {}
            for _, step, run in events:
                if step > 0:
                    active[run.run] = run
                    report.max_per_customer = max(report.max_per_customer, len(active))
                    if len(active) > MAX_PER_CUSTOMER:
                        together = " | ".join(self.describe(r, faults) for r in active.values())
                        report.limit_violations.append(
                            f"customer {customer}: {len(active)} at once: {together}"
                        )
                else:
                    active.pop(run.run, None)

    def fault_times(self) -> list[tuple[float, str]]:
        faults = []
        for line in self.ledger.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] in ("kill", "term", "server-kill", "server-up", "client-kill"):
                faults.append((float(parts[3]), f"{parts[0]} {parts[1]}".rstrip(" -")))
        return sorted(faults)

    def describe(self, run: Run, faults: list[tuple[float, str]]) -> str:
        """A run, with the last fault before it started (what likely caused it)."""
        before = [f for f in faults if f[0] <= run.start]
        cause = f", {run.start - before[-1][0]:.2f}s after {before[-1][1]}" if before else ""
        end = f"{run.end:.3f}" if run.end is not None else "?"
        return (
            f"[{run.worker} pid {run.pid} attempt {run.attempt} gen {run.generation} "
            f"{run.start:.3f}-{end} {run.outcome}{cause}]"
        )


def quiet_glide() -> None:
    """GLIDE logs every lost connection as a warning; the faults make many."""
    from glide import Logger, LogLevel

    Logger.set_logger_config(LogLevel.ERROR)


def run_chaos(
    client: str = "redis",
    seconds: float = 20.0,
    workers: int = 4,
    seed: int = 1,
    drain_seconds: float = 60.0,
    rate: float = 40.0,
    verbose: bool = False,
    keep: bool = False,
) -> Report:
    """One chaos run on asyncio; the run's directory is removed unless it failed
    (or ``keep``)."""
    chaos = Chaos(
        client=client,
        seconds=seconds,
        workers=workers,
        seed=seed,
        drain_seconds=drain_seconds,
        rate=rate,
        verbose=verbose,
    )
    if client == "glide":
        quiet_glide()
    report = anyio.run(chaos.run, backend="asyncio")
    if report.ok and not keep:
        shutil.rmtree(chaos.directory, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        url, docket_name, worker_name, ledger = argv[1:5]
        if url.startswith("glide"):
            quiet_glide()
        anyio.run(worker_main, url, docket_name, worker_name, ledger, backend="asyncio")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", choices=("redis", "glide"), default="redis")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long faults go on")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--drain", type=float, default=60.0, help="the drain's deadline (s)")
    parser.add_argument("--rate", type=float, default=40.0, help="producer adds per second")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")
    parser.add_argument("--quiet", action="store_true")
    options = parser.parse_args(argv)
    report = run_chaos(
        client=options.client,
        seconds=options.seconds,
        workers=options.workers,
        seed=options.seed,
        drain_seconds=options.drain,
        rate=options.rate,
        verbose=not options.quiet,
        keep=options.keep,
    )
    print(report.table())
    for failure in report.failures:
        print(f"FAILED: {failure}")
    if not report.ok or options.keep:
        print(f"run directory (ledger, worker logs, server log): {report.directory}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

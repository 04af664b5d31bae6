"""Chaos run: worker processes, a producer and random faults on a private redis-server.

Run it as a script::

    python tests/chaos/chaos.py --client redis --seconds 60 --workers 4 --seed 1
    python tests/chaos/chaos.py --client glide --seconds 60 --workers 4 --seed 1

or call ``run_chaos(...)`` (``tests/chaos/test_chaos.py`` does, briefly).

The driver (this module) starts a redis-server with AOF on and ``--appendfsync
always`` on a free loopback port, starts worker subprocesses (this same file,
``worker`` subcommand, on asyncio), adds a stream of tasks (plain, limited to two
at a time per customer, retried after failures, due a little later, and now and
then a ``rogue`` task that raises ``CancelledError`` by itself, or an ``exits``
task that raises ``SystemExit``: its run fails, then its worker stops after
draining its other runs and the driver replaces it) and, for a fixed time,
injects faults at random from a seed: worker SIGKILL, worker SIGTERM (each
followed by a replacement worker), server SIGKILL and restart on the same port
and directory (the AOF reloads), ``CLIENT KILL TYPE normal``, and two sharper
kinds of it: ``stall-kill`` sends the kill while a side connection's 50 ms
script holds the server, so it lands right after the commands that queued
meanwhile ran (their replies are lost); ``claim-kill`` starts that stall as soon
as MONITOR shows a worker claiming a limited task, so the concurrency-slot request
that follows is what runs without a reply.  ``poison`` XADDs a malformed entry
straight into the docket's stream ``{NAME}:q`` (one lacking the field ``g``, one
whose ``w`` is ``soon``, one of junk fields only), which the workers must move to
the dead letters.  Worker processes also ledger every batch of script calls that
fails (``batch-error``: the batches they resend).

The modules: ``chaos_tasks.py`` (the settings, the ledger, the tasks and the
worker process), ``chaos_faults.py`` (the faults sent on side connections),
``chaos_report.py`` (the report and the checks) and this one (the driver,
``run_chaos`` and the command line).

Every run of a task body appends a ``start`` line and, in a ``finally``, an
``end`` line to one ledger file opened with O_APPEND (one ``os.write`` a line,
so a line survives a SIGKILL); a task raising ``SystemExit`` appends a
``sysexit`` line first; the driver appends its faults to the same file.  After
the faults stop, the surviving workers drain, are stopped with SIGTERM, and the
run checks:

- nothing lost: every added key ends ``completed`` (``failed`` for the tasks
  meant to fail for good: doomed, rogue, exits), after a finished run of its own
  (one that ended ``ok``, or ``raised`` for those meant to fail);
- nothing left over: pending is 0 (no poison entry stays in the queue either),
  ``{NAME}:parked`` is empty, no record keeps ``parked``/``pin``, no wait list is
  left, and no slot is held by a worker that was not SIGKILLed (a SIGKILLed
  holder's slot expires by itself);
- every poison entry is set aside exactly once: the dead-letter total equals the
  number injected, and each injected entry's id is one letter's original id;
- no key ran in two worker processes at once (a SIGKILLed worker's open runs end
  at its kill time), nor twice at once in one process;
- no customer had more than two runs at once;
- no worker died unasked (a worker whose task raised ``SystemExit`` was asked,
  and must exit 0 having logged that it stops), and every worker told to stop
  exited cleanly.

Keys that ran more than once (at-least-once redeliveries) are counted, not
failed on.  The exit status is non-zero when an invariant fails; the run's
directory (ledger, worker logs, server log) is kept then.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
for _path in (str(ROOT), str(TESTS), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import anyio  # noqa: E402
from chaos_faults import SideFaults  # noqa: E402
from chaos_report import LedgerChecks, Report, Spec, StoreChecks, WorkerProcess  # noqa: E402
from chaos_tasks import (  # noqa: E402
    CUSTOMERS,
    FAULT_KINDS,
    FAULT_WEIGHTS,
    RETRY_ATTEMPTS,
    STUCK_SECONDS,
    TASKS,
    append,
    chaos_exits,
    chaos_flaky,
    chaos_limited,
    chaos_plain,
    chaos_rogue,
    now_text,
    quiet_glide,
    worker_main,
)
from servers import Server, free_port, redis_server_binary  # noqa: E402

from docket_core import Docket, ExecutionState, StoreError  # noqa: E402

#: the producer's chances (out of 1) of adding a ``rogue`` and an ``exits`` task:
#: a few of each in 20 s at the default rate
ROGUE_CHANCE = 0.006
EXITS_CHANCE = 0.005


class Chaos(SideFaults, LedgerChecks, StoreChecks):
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
        #: the poison entries in the stream: their entry id, what they are, their key
        self.poison_ids: dict[str, tuple[str, str | None]] = {}
        self.poison_tries = 0
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
        """Notice exits: a worker that dies unasked is recorded and replaced; one
        its task asked to stop (by raising ``SystemExit``) is checked and replaced."""
        while True:
            for worker in self.workers:
                if worker.exited is not None:
                    continue
                code = worker.process.poll()
                if code is None:
                    continue
                worker.exited, worker.exited_at = code, time.time()
                append(self.fd, "exit", worker.name, worker.process.pid, now_text(), code)
                asked_by = self.asked_exits().get(worker.process.pid)
                if worker.told is None and asked_by is not None:
                    self.task_exit(worker, code, asked_by)
                    if self.replacing:
                        self.spawn()
                elif worker.told is None:
                    tail = worker.log.read_text(errors="replace")[-1500:]
                    self.report.died.append(
                        f"{worker.name} (pid {worker.process.pid}) exited {code} unasked:\n{tail}"
                    )
                    self.log(f"{worker.name} died by itself ({code})")
                    if self.replacing:
                        self.spawn()
                elif worker.told == "term" and code != 0 and not self.stopped_first(worker, code):
                    tail = worker.log.read_text(errors="replace")[-1500:]
                    self.report.unclean_stops.append(
                        f"{worker.name} (pid {worker.process.pid}) exited {code} "
                        f"after SIGTERM:\n{tail}"
                    )
            await anyio.sleep(0.05)

    def stopped_first(self, worker: WorkerProcess, code: int) -> bool:
        """Whether a SIGTERM killed a worker that had already stopped cleanly
        (it printed its counters: a task's ``SystemExit`` stopped it) while
        its interpreter shut down, where Python restores the default handler,
        or one that had not yet started (no ``up`` line in the ledger)."""
        if code != -signal.SIGTERM:
            return False
        up = f"up {worker.name} {worker.process.pid} "
        if not any(line.startswith(up) for line in self.ledger.read_text().splitlines()):
            return True  # killed while its interpreter started: it never held a task
        text = worker.log.read_text(errors="replace")
        return any(line.startswith(f"{worker.name} stopped: ") for line in text.splitlines())

    def task_exit(self, worker: WorkerProcess, code: int, key: str) -> None:
        """A worker stopped after its task ``key`` raised ``SystemExit``: it must
        exit 0, having logged that it stops after draining."""
        self.report.task_exits += 1
        self.log(f"{worker.name} stopped after {key} raised SystemExit ({code})")
        text = worker.log.read_text(errors="replace")
        said = any(
            "raised SystemExit" in line and "stops after draining" in line
            for line in text.splitlines()
        )
        if code != 0 or not said:
            why = f"exited {code}" if code != 0 else "did not log that it stops after draining"
            self.report.unclean_stops.append(
                f"{worker.name} (pid {worker.process.pid}) {why} after {key} raised "
                f"SystemExit:\n{text[-1500:]}"
            )

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
        elif kind == "poison":
            entry = await anyio.to_thread.run_sync(self.poison)
            if entry is None:
                return False  # the server did not answer
            self.log(f"poison entry {entry}")
        else:
            killed = await anyio.to_thread.run_sync(self.claim_kill)
            if killed < 0:
                return False  # no limited claim within the time
            append(self.fd, "claim-kill", "-", "-", now_text(), killed)
            self.log(f"client kill after a limited claim: {killed} connections")
        self.report.faults[kind] += 1
        return True

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
            elif choice < 0.80 + ROGUE_CHANCE:
                spec = Spec(f"rogue-{number}", "rogue", "-")
                batch.append((spec, chaos_rogue, (rng.randint(5, 50),), None))
            elif choice < 0.80 + ROGUE_CHANCE + EXITS_CHANCE:
                spec = Spec(f"exits-{number}", "exits", "-")
                batch.append((spec, chaos_exits, (rng.randint(5, 50),), None))
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
                    await self.check_dead_letters(docket)
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

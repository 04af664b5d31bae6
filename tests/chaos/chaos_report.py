"""What a chaos run measures: the tasks it added, its worker processes, the runs
the ledger shows, the report (its table and its failed invariants), and the
checks of the ledger (``LedgerChecks``) and of the store after the drain
(``StoreChecks``), which the driver ``chaos.Chaos`` inherits.
See ``chaos.py`` for the overview and the invariants.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from chaos_tasks import FAULT_KINDS, MAX_PER_CUSTOMER
from servers import Server

from docket_core import Docket, ExecutionState

#: the kinds of task meant to fail for good (their last run ends ``raised``)
FAILING_KINDS = ("doomed", "rogue", "exits")
#: the ledger lines ``describe`` names as a likely cause of what follows them
CAUSES = ("kill", "term", "server-kill", "server-up", "client-kill", "sysexit")


@dataclass
class Spec:
    """One task the producer added."""

    key: str
    kind: str  # plain | limited | flaky | doomed | future | rogue | exits
    customer: str
    added: bool = False
    #: the add raised at least once (a retry checks the record first)
    retried: bool = False

    @property
    def expected(self) -> ExecutionState:
        if self.kind in FAILING_KINDS:
            return ExecutionState.FAILED
        return ExecutionState.COMPLETED


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
    #: poison entries whose XADD succeeded, and those whose XADD raised after it
    #: was sent (it may or may not have reached the stream)
    poisoned: int = 0
    poison_uncertain: int = 0
    #: the dead-letter stream's total after the drain
    dead_letters: int = -1
    dead_letter_errors: list[str] = field(default_factory=list)
    #: workers that stopped by themselves after a task raised SystemExit
    task_exits: int = 0
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
        fail("poison entries not set aside exactly once", self.dead_letter_errors)
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
        uncertain = f" (+{self.poison_uncertain} uncertain)" if self.poison_uncertain else ""
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
            (
                "poison injected / dead letters",
                f"{self.poisoned}{uncertain} / {self.dead_letters}"
                f" ({len(self.dead_letter_errors)} mismatches)",
            ),
            (
                "BaseException tasks (rogue / exits)",
                f"{self.kinds['rogue']} / {self.kinds['exits']} added; "
                f"{self.task_exits} workers stopped by SystemExit",
            ),
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


class LedgerChecks:
    """The checks a chaos run makes on its ledger (mixed into ``chaos.Chaos``)."""

    report: Report
    ledger: Path
    specs: dict[str, Spec]

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
            wanted = "raised" if spec.kind in FAILING_KINDS else "ok"
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
            if parts and parts[0] in CAUSES:
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

    def asked_exits(self) -> dict[int, str]:
        """The worker processes (pid) a task asked to stop (a ``sysexit`` line),
        with the key of the first task that asked."""
        asked: dict[int, str] = {}
        for line in self.ledger.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "sysexit":
                asked.setdefault(int(parts[2]), parts[4])
        return asked


class StoreChecks:
    """The checks a chaos run makes on the store after the drain (mixed into
    ``chaos.Chaos``)."""

    report: Report
    specs: dict[str, Spec]
    name: str
    server: Server
    workers: list[WorkerProcess]
    #: the poison entries injected: their entry id, what they are and their key
    poison_ids: dict[str, tuple[str, str | None]]

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

    async def check_dead_letters(self, docket: Docket) -> None:
        """Every poison entry injected is set aside exactly once, and nothing else
        is (an XADD that failed once sent may or may not have added one)."""
        report = self.report
        total, letters = await docket.dead_letters(limit=100_000)
        report.dead_letters = total
        errors = report.dead_letter_errors
        seen = Counter(letter.original_id for letter in letters)
        for entry_id, (what, key) in sorted(self.poison_ids.items()):
            if seen[entry_id] != 1:
                errors.append(
                    f"poison entry {entry_id} ({what}, key {key}) set aside {seen[entry_id]} times"
                )
        for letter in letters:
            text = (
                f"dead letter {letter.entry_id} of {letter.original_id} "
                f"(key {letter.key}, {letter.reason})"
            )
            if letter.original_id in self.poison_ids:
                what, key = self.poison_ids[letter.original_id]
                if letter.key != key:
                    errors.append(f"{text}: not the key injected ({what}, key {key})")
            elif report.poison_uncertain == 0:
                errors.append(f"{text}: no poison entry injected has that id")
        low, high = report.poisoned, report.poisoned + report.poison_uncertain
        if not low <= total <= high:
            wanted = str(low) if low == high else f"{low} to {high}"
            errors.append(f"the dead-letter total is {total}, not {wanted} (poison injected)")
        if len(letters) != total:
            errors.append(f"{len(letters)} dead letters listed, the total says {total}")

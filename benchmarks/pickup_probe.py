"""Where the time of a pickup goes: enqueue to task start on an idle worker.

    .venv/bin/python benchmarks/pickup_probe.py                  # redis, glide, memory
    .venv/bin/python benchmarks/pickup_probe.py --urls glide --n 600 --slowest 3
    .venv/bin/python benchmarks/pickup_probe.py --baseline /tmp/before --repeat 5

Starts a private redis-server on a free loopback port (never 6379) and, per
client, a child process with one idle worker (concurrency 100, as
``benchmarks/run.py``'s timing workload) in the producer's event loop; it adds
N tasks ``--gap`` seconds apart, each timing its start against the moment
its ``add`` began (what the benchmark's ``tracker.delays`` measure).  Per
client it prints:

- pickup p50 / p90 / p99 / max (ms);
- the median timeline of a pickup: when, after the ``add`` began, the add
  returned, the blocked read returned, the claim went out and came back, the
  task started (wrappers around the store's primitives mark them), and the
  same event by event for the median pickup (and ``--slowest`` more);
- the round trips of a pickup: the client's calls by kind (the wrappers),
  and the server's commands within a pickup (``MONITOR``, the scripts' own
  commands left out), over a short phase of its own so MONITOR does not
  slow the timed one;
- the server's time for each script call and command over the timed phase
  (``SLOWLOG``, every command logged), the median per script by name.

``--baseline DIR`` compares: DIR mirrors the package layout
(``DIR/docket_core/worker.py``...), and every module found there replaces
the working tree's in one of two children per client and repeat
(alternating, on the same server), so before and after meet the same noise.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import hashlib
import importlib.abc
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: (perf_counter, label) of everything the wrappers saw, in order
EVENTS: list[tuple[float, str]] = []
#: pickup i -> [perf_counter when its add began, when its task started]
MARKS: dict[int, list[float]] = {}
#: set once every task of a phase started
DONE: asyncio.Event | None = None
EXPECTED = STARTED = 0


def mark(label: str) -> None:
    EVENTS.append((time.perf_counter(), label))


async def probe_task(i: int, began: float) -> None:
    """The task: note when it started."""
    global STARTED
    now = time.perf_counter()
    MARKS[i].append(now)
    EVENTS.append((now, "task starts"))
    STARTED += 1
    if DONE is not None and STARTED >= EXPECTED:
        DONE.set()


# -- the server ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(port: int, *parts: str) -> bytes:
    """One command to the server at ``port``, without a client library."""
    payload = f"*{len(parts)}\r\n".encode()
    for part in parts:
        payload += b"$%d\r\n%s\r\n" % (len(part), part.encode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        reply = b""
        while True:
            chunk = s.recv(65536)
            reply += chunk
            if not chunk or (reply.startswith((b"+", b"-", b":")) and reply.endswith(b"\r\n")):
                return reply
            header, _, rest = reply.partition(b"\r\n")
            if header.startswith(b"$") and len(rest) >= int(header[1:]) + 2:
                return reply


class Server:
    """A private redis-server: no persistence, a free port, a temp directory."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server not found")
        self.port = free_port()
        self.directory = tempfile.mkdtemp(prefix="pickup-probe-")
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.directory,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(100):
            with contextlib.suppress(OSError):
                if command(self.port, "PING").startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        self.stop()
        raise SystemExit("redis-server did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)


class Monitor:
    """``MONITOR`` on a thread: the server's commands (time, name), the
    scripts' inner commands left out."""

    def __init__(self, port: int) -> None:
        self.lines: list[tuple[float, str]] = []
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"MONITOR\r\n")
        self.sock.recv(64)  # +OK
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            *complete, buffer = buffer.split(b"\r\n")
            for raw in complete:
                # +1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" ...
                line = raw.decode(errors="replace")
                if not line.startswith("+") or " lua]" in line:
                    continue
                stamp, _, rest = line[1:].partition(" [")
                name = rest.partition("] ")[2].split(" ", 1)[0].strip('"').upper()
                if name == "XREADGROUP" and '"BLOCK"' in rest.upper():
                    name = "XREADGROUP BLOCK"
                self.lines.append((float(stamp), name))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class SlowLog:
    """The server's time for each command, from ``SLOWLOG`` with every
    command logged (its setting put back after): the median per script
    (by name) or command, in microseconds, each script's own commands in."""

    def __init__(self, port: int) -> None:
        import redis

        self.client = redis.Redis(port=port)
        self.before = self.client.config_get("slowlog-*")
        self.client.config_set("slowlog-log-slower-than", 0)
        self.client.config_set("slowlog-max-len", 100_000)
        self.client.slowlog_reset()

    def medians(self) -> dict[str, list[float]]:
        from docket_core.lua import SCRIPTS

        names = {hashlib.sha1(source.encode()).hexdigest(): n for n, source in SCRIPTS.items()}
        log = self.client.slowlog_get(100_000)
        for setting, value in self.before.items():
            self.client.config_set(setting, value)
        durations: dict[str, list[int]] = {}
        for entry in log:
            words = entry["command"].split()
            name = words[0].decode().upper()
            if name == "EVALSHA" and len(words) > 1:
                name = names.get(words[1].decode(), "a script")
            elif name in ("SLOWLOG", "CONFIG"):
                continue
            durations.setdefault(name, []).append(entry["duration"])
        self.client.close()
        return {
            name: [statistics.median(values), len(values)]
            for name, values in sorted(durations.items(), key=lambda kv: -sum(kv[1]))
        }


# -- module overrides (--baseline) -------------------------------------------------


class _Override(importlib.abc.MetaPathFinder):
    """Loads the modules found under a directory instead of the tree's."""

    #: the modules it loaded
    loaded: set[str] = set()

    def __init__(self, directory: Path) -> None:
        self.files = {
            ".".join(path.relative_to(directory).with_suffix("").parts): path
            for path in directory.rglob("*.py")
        }

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is not None:
            _Override.loaded.add(fullname)
        return None if file is None else importlib.util.spec_from_file_location(fullname, file)


# -- instrumentation ---------------------------------------------------------------


def instrument(store: Any) -> Counter[str]:
    """Wrap the store's primitives so each call leaves marks; returns the
    per-kind counts of client calls (one round trip each)."""
    from docket_core.lua.base import ScriptedStore

    calls: Counter[str] = Counter()
    if not isinstance(store, ScriptedStore):
        return calls

    def wrap(name: str, label: Callable[..., str]) -> None:
        original = getattr(store, name)

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            what = label(*args, **kwargs)
            calls[what] += 1
            mark(f"{what} sent")
            try:
                return await original(*args, **kwargs)
            finally:
                mark(f"{what} returned")

        setattr(store, name, wrapper)

    instrument_steps()
    wrap("run_calls", lambda calls_: "+".join(call.name for call in calls_))
    wrap("run_calls_in_order", lambda calls_: "+".join(call.name for call in calls_))
    wrap("read_blocking", lambda *a, **k: "blocked read")
    wrap("acknowledge", lambda stream, ids: f"ack {stream.rsplit(':', 1)[-1]}")
    wrap("strike_entries", lambda after: "strike entries")
    return calls


def instrument_steps() -> None:
    """Mark the worker's steps of a pickup too: the delivery decoded, the
    core's input and its effects, the run handed to a runner and begun, and
    (redis-py) each write to a connection."""
    from docket_core.running import Runner
    from docket_core.sansio.worker import WorkerMachine
    from docket_core.worker import Worker

    def steps(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        if getattr(original, "marked", False):
            return

        def marked(*args: Any, **kwargs: Any) -> Any:
            mark(f"{label} begins")
            try:
                return original(*args, **kwargs)
            finally:
                mark(f"{label} done")

        marked.marked = True  # type: ignore[attr-defined]
        setattr(owner, name, marked)

    steps(Worker, "_arrival", "decode")
    steps(WorkerMachine, "receive", "core input")
    steps(WorkerMachine, "effects", "core effects")
    steps(Runner, "start", "run handed")
    run = Runner._run
    if not getattr(run, "marked", False):

        async def begun(self: Any, *args: Any, **kwargs: Any) -> Any:
            mark("runner begins")
            return await run(self, *args, **kwargs)

        begun.marked = True  # type: ignore[attr-defined]
        Runner._run = begun  # type: ignore[method-assign]
    try:
        from redis.asyncio.connection import AbstractConnection
    except ImportError:
        return
    send = AbstractConnection.send_packed_command
    if not getattr(send, "marked", False):

        async def written(self: Any, *args: Any, **kwargs: Any) -> Any:
            mark("write begins")
            try:
                return await send(self, *args, **kwargs)
            finally:
                mark("write done")

        written.marked = True  # type: ignore[attr-defined]
        AbstractConnection.send_packed_command = written  # type: ignore[method-assign]


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000

    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": ordered[-1] * 1000}


def raw_timeline(i: int, after: float = 0.001) -> list[tuple[float, str]]:
    """Every event from pickup ``i``'s add to its start (and ``after`` s more)."""
    began, started = MARKS[i]
    return [((t - began) * 1000, label) for t, label in EVENTS if began <= t <= started + after]


#: the legs of a pickup (from, to), by the first time each event occurs in it
LEGS = (
    ("add begins", "schedule sent"),
    ("schedule sent", "blocked read returned"),
    ("blocked read returned", "claim sent"),
    ("claim sent", "claim returned"),
    ("claim returned", "task starts"),
)


def legs(indices: list[int]) -> dict[str, float]:
    """The median duration (ms) of each leg of ``LEGS``, over the pickups
    that have both of its ends (a pickup the read script brought has no
    blocked read)."""
    spans: dict[str, list[float]] = {}
    stamps = [t for t, _ in EVENTS]
    for i in indices:
        began, started = MARKS[i]
        first: dict[str, float] = {}
        at = bisect.bisect_left(stamps, began)
        while at < len(EVENTS) and EVENTS[at][0] <= started:
            first.setdefault(EVENTS[at][1], EVENTS[at][0])
            at += 1
        for start, end in LEGS:
            if start in first and end in first:
                spans.setdefault(f"{start} -> {end}", []).append(first[end] - first[start])
    return {leg: statistics.median(v) * 1000 for leg, v in spans.items()}


def timeline(indices: list[int]) -> list[tuple[str, float, int]]:
    """The median offset (ms after the add began) of each event's first
    occurrence within a pickup, and in how many pickups it occurred."""
    offsets: dict[str, list[float]] = {}
    stamps = [t for t, _ in EVENTS]
    for i in indices:
        began, started = MARKS[i]
        seen: set[str] = set()
        at = bisect.bisect_left(stamps, began)
        while at < len(EVENTS) and EVENTS[at][0] <= started:
            t, label = EVENTS[at]
            if label not in seen:
                seen.add(label)
                offsets.setdefault(label, []).append((t - began) * 1000)
            at += 1
    rows = [(label, statistics.median(v), len(v)) for label, v in offsets.items()]
    return sorted(rows, key=lambda row: row[1])


# -- one client, in a child process ----------------------------------------------


async def run_client(args: argparse.Namespace) -> dict[str, Any]:
    from docket_core import Docket, Worker

    name = f"probe-{uuid.uuid4().hex[:8]}"
    scheme = args.urls
    url = f"memory://{name}" if scheme == "memory" else f"{scheme}://127.0.0.1:{args.port}/0"
    docket = Docket(name=name, url=url)
    docket.register(probe_task)
    await docket.__aenter__()
    calls = instrument(docket.adapter)
    interval = timedelta(milliseconds=args.interval)
    worker = Worker(
        docket,
        concurrency=args.concurrency,
        minimum_check_interval=interval,
        scheduling_resolution=interval,
        schedule_automatic_tasks=False,
        handle_signals=False,
        freeze_gc=args.freeze_gc,
    )
    await worker.__aenter__()
    runner = asyncio.create_task(worker.run_forever())
    await asyncio.sleep(1.0)  # settle into the idle loop

    async def phase(count: int, first: int) -> list[int]:
        global DONE, EXPECTED, STARTED
        MARKS.clear()
        EVENTS.clear()
        DONE, EXPECTED, STARTED = asyncio.Event(), count, 0
        indices = list(range(first, first + count))
        start = time.perf_counter()
        for k, i in enumerate(indices):
            delay = start + k * args.gap - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            began = time.perf_counter()
            MARKS[i] = [began]
            mark("add begins")
            await docket.add(probe_task)(i, began)
            mark("add returned")
        await asyncio.wait_for(DONE.wait(), 30)
        return indices

    await phase(args.warmup, 10**6)  # (the first pickups pay for warming up)
    calls.clear()
    slowlog = SlowLog(args.port) if scheme != "memory" else None
    times = os.times()
    indices = await phase(args.n, 0)
    user = (os.times().user - times.user) / args.n * 1000
    system = (os.times().system - times.system) / args.n * 1000
    delays = [MARKS[i][1] - MARKS[i][0] for i in indices]
    by_delay = sorted(indices, key=lambda i: MARKS[i][1] - MARKS[i][0])
    picks = {"p50": by_delay[len(by_delay) // 2]}
    for k in range(1, args.slowest + 1):
        picks[f"slowest #{k}"] = by_delay[-k]
    result: dict[str, Any] = {
        "pickup": quantiles(delays) | {"cpu": user + system, "user": user, "system": system},
        "timeline": timeline(indices),
        "legs": legs(indices),
        "examples": {label: raw_timeline(i) for label, i in picks.items()},
        "client calls": {what: count / args.n for what, count in sorted(calls.items())},
    }
    if slowlog is not None:
        result["server time"] = slowlog.medians()
    result["modules"] = sorted(
        str(getattr(sys.modules.get(name), "__file__", "")) for name in _Override.loaded
    )
    if scheme != "memory" and args.monitor:
        await asyncio.sleep(0.3)
        monitor = Monitor(args.port)
        await asyncio.sleep(0.1)
        wall = time.time() - time.perf_counter()
        indices = await phase(args.monitor, args.n)
        await asyncio.sleep(0.05)
        monitor.close()
        commands: Counter[str] = Counter()
        for i in indices:
            began, started = MARKS[i]
            for stamp, name in monitor.lines:
                if wall + began - 0.0002 <= stamp <= wall + started:
                    commands[name] += 1
        result["server commands"] = {c: k / args.monitor for c, k in sorted(commands.items())}
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        await asyncio.wait_for(runner, 5)
    await worker.__aexit__(None, None, None)
    await docket.__aexit__(None, None, None)
    return result


def child(args: argparse.Namespace) -> None:
    if args.modules_from:
        sys.meta_path.insert(0, _Override(Path(args.modules_from)))
    sys.path.insert(0, str(ROOT))
    factory: Any = None
    if args.loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        result = runner.run(run_client(args))
    print("RESULT " + json.dumps(result), flush=True)


# -- the driver ----------------------------------------------------------------


def report(label: str, result: dict[str, Any], verbose: bool) -> None:
    p = result["pickup"]
    print(
        f"\n== {label}: pickup p50 {p['p50']:.3f} ms  p90 {p['p90']:.3f}  "
        f"p99 {p['p99']:.3f}  max {p['max']:.3f}  (CPU a pickup: user {p['user']:.3f} ms, "
        f"system {p['system']:.3f} ms)"
    )
    if not verbose:
        return
    if result["legs"]:
        print("   median legs (ms):", "; ".join(f"{k} {v:.3f}" for k, v in result["legs"].items()))
    print("   median timeline (ms after the add began; in how many pickups):")
    for what, at, count in result["timeline"]:
        print(f"     {at:7.3f}  {what}  ({count})")
    for which, rows in result["examples"].items():
        print(f"   the {which} pickup, event by event (ms after its add began):")
        print("     " + "; ".join(f"{at:.3f} {what}" for at, what in rows))
    if result["client calls"]:
        print(
            "   client calls per pickup (one round trip each):",
            ", ".join(f"{k} {v:.2f}" for k, v in result["client calls"].items()),
        )
    if result.get("server time"):
        print(
            "   server time a call (SLOWLOG, median us; calls): "
            + ", ".join(f"{k} {m:g} ({n})" for k, (m, n) in list(result["server time"].items())[:8])
        )
    if result.get("server commands"):
        print(
            "   server commands within a pickup (MONITOR):",
            ", ".join(f"{k} {v:.2f}" for k, v in result["server commands"].items()),
        )


def run_child(args: argparse.Namespace, scheme: str, port: int, modules_from: str) -> Any:
    argv = [
        sys.executable,
        __file__,
        "--child",
        "--urls",
        scheme,
        "--port",
        str(port),
        "--n",
        str(args.n),
        "--gap",
        str(args.gap),
        "--interval",
        str(args.interval),
        "--concurrency",
        str(args.concurrency),
        "--monitor",
        str(args.monitor),
        "--slowest",
        str(args.slowest),
        "--loop",
        args.loop,
        "--warmup",
        str(args.warmup),
    ]
    if modules_from:
        argv += ["--modules-from", modules_from]
    if args.freeze_gc:
        argv.append("--freeze-gc")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise SystemExit(f"{scheme} failed:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--urls", default="redis,glide,memory")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--gap", type=float, default=0.005, help="seconds between adds")
    parser.add_argument(
        "--interval",
        type=float,
        default=250,
        help="minimum_check_interval in ms (250: default, 10: tuned)",
    )
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--monitor", type=int, default=20, help="pickups watched with MONITOR")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=30, help="pickups before measuring")
    parser.add_argument(
        "--slowest",
        type=int,
        default=0,
        help="show this many of the slowest pickups event by event",
    )
    parser.add_argument("--loop", default="asyncio", choices=("asyncio", "uvloop"))
    parser.add_argument(
        "--freeze-gc", action="store_true", help="Worker(freeze_gc=True), as docket worker runs"
    )
    parser.add_argument("--baseline", default="", help="compare with the modules under DIR")
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--modules-from", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    server = Server()
    print(
        f"redis-server on :{server.port}; n={args.n} gap={args.gap}s "
        f"interval={args.interval}ms concurrency={args.concurrency}"
    )
    variants = [("before", args.baseline), ("after", "")] if args.baseline else [("", "")]
    figures: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        for _ in range(args.repeat):
            for scheme in args.urls.split(","):
                for variant, directory in variants:
                    result = run_child(args, scheme, server.port, directory)
                    label = f"{scheme} {variant}".strip()
                    report(label, result, verbose=args.repeat == 1)
                    figures.setdefault((scheme, variant), []).append(
                        result["pickup"] | {"legs": result["legs"]}
                    )
                    command(server.port, "FLUSHALL")
    finally:
        server.stop()
    if args.repeat > 1 or args.baseline:
        print("\nmedians over the repeats (ms): p50, p99, CPU a pickup [each run's p50 / p99]")
        for (scheme, variant), runs in figures.items():
            p50s = [r["p50"] for r in runs]
            p99s = [r["p99"] for r in runs]
            cpu = statistics.median(r["cpu"] for r in runs)
            leg_medians = [
                statistics.median(r["legs"][leg] for r in runs if leg in r["legs"])
                for leg in runs[0]["legs"]
            ]
            print(
                f"  {scheme:6} {variant:6} p50 {statistics.median(p50s):.3f}  "
                f"p99 {statistics.median(p99s):.3f}  cpu {cpu:.3f}   "
                f"[{' '.join(f'{a:.2f}/{b:.2f}' for a, b in zip(p50s, p99s, strict=True))}]"
            )
            if leg_medians:
                print(f"  {'':13} legs {' | '.join(f'{v:.3f}' for v in leg_medians)}")
        print("\nlegs: " + " | ".join(f"{a} -> {b}" for a, b in LEGS))


if __name__ == "__main__":
    main()

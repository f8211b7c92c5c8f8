"use strict";
// The control panel's "why a config wins" view (loaded before panel.js, which owns `state`):
// each knob's importance for the ranking metric (panel_rank.js: the experiment's, or the one
// picked) and the runs as lines across their knobs (parallel coordinates), both computed on
// the server by the report's own functions
// (trl_rapidfire/reports/why_wins.py, through /rapidfire/api/why). Asked only while the view
// is open, and then every WHY_EVERY refreshes (an importance takes a second or more at 500
// runs). A line is coloured as the run's curve is (the top k, the pinned, the hovered), and
// hovering or clicking it does what it does on the curve.

const WHY_EVERY = 10;
const PARALLEL = {height: 300, side: 70, top: 34, bottom: 30};
const parallelLines = new Map();

function whyOpen() {
  return document.getElementById("why-view").open;
}

async function loadWhy() {
  const exp = state.current;
  if (!exp || !whyOpen()) return;
  const note = document.getElementById("why-note");
  try {
    const metric = rankMetric();
    const query = new URLSearchParams({experiment: exp.eid, rfid: exp.rfid, metric: metric.key,
      mode: metric.mode});
    state.why = await call(`${PANEL_API}why?${query}`);
    state.whyAt = state.refreshes;
    const better = state.why.mode === "max" ? "higher" : "lower";
    note.textContent = `Objective: the latest ${state.why.objective} (${better} is better). ` +
      `Importance by ${state.why.method}.` + (state.why.note ? ` Read: ${state.why.note}.` : "");
  } catch (e) {
    note.textContent = `could not compute: ${e.message}`;
    return;
  }
  drawWhy();
}

function drawImportance(why) {
  const body = document.querySelector("#importance tbody");
  if (!why.importance.length) {
    body.replaceChildren(el("tr", {}, el("td", {colspan: 2,
      text: `no knob differs between runs with a ${why.objective} yet`})));
    return;
  }
  body.replaceChildren(...why.importance.map(([knob, share]) => el("tr", {},
    el("td", {text: knob, title: knob, className: "field-name"}),
    el("td", {}, el("span", {className: "bar", style: `width:${(share * 8).toFixed(2)}em`}),
      ` ${(share * 100).toFixed(0)}%`))));
}

function axisText(axis, at) {
  if (axis.kind === "category") {
    return axis.categories.length ? axis.categories[at ? axis.categories.length - 1 : 0] : "";
  }
  const value = axis.range[at ? 1 : 0];
  return Number(value).toPrecision(3);
}

// The objective as the last axis, scaled as the report scales a numeric knob (a log scale
// over a decade or more); a run without a value sits at the bottom.
function objectiveAxis(why) {
  const values = why.values.filter((v) => v !== null && Number.isFinite(v));
  if (!values.length) return null;
  let low = Infinity, high = -Infinity;
  for (const v of values) { low = Math.min(low, v); high = Math.max(high, v); }
  const log = low > 0 && high / low >= 10;
  const f = log ? Math.log10 : (v) => v;
  const span = f(high) - f(low) || 1;
  return {name: why.objective, kind: log ? "log" : "linear", range: [low, high], objective: true,
    positions: why.values.map((v) => (v === null ? 0 : (f(v) - f(low)) / span))};
}

function drawWhy() {
  const why = state.why;
  if (!why) return;
  drawImportance(why);
  const root = document.getElementById("parallel");
  const width = Math.max(root.parentNode.clientWidth, 320);
  root.setAttribute("width", width);
  root.setAttribute("height", PARALLEL.height);
  root.setAttribute("viewBox", `0 0 ${width} ${PARALLEL.height}`);
  const objective = why.axes.length ? objectiveAxis(why) : null;
  const axes = objective ? [...why.axes, objective] : why.axes;
  const h = PARALLEL.height - PARALLEL.top - PARALLEL.bottom;
  const gap = axes.length > 1 ? (width - 2 * PARALLEL.side) / (axes.length - 1) : 0;
  const ax = (i) => (axes.length > 1 ? PARALLEL.side + i * gap : width / 2);
  const ay = (p) => PARALLEL.top + (1 - p) * h;
  const parts = [];
  axes.forEach((axis, i) => {
    parts.push(svg("line", {x1: ax(i), x2: ax(i), y1: PARALLEL.top, y2: PARALLEL.top + h,
      class: "axis"}));
    const name = svg("text", {x: ax(i), y: PARALLEL.top - 18, "text-anchor": "middle",
      class: axis.objective ? "axis-name objective" : "axis-name"});
    name.textContent = axis.name + (axis.kind === "log" ? " (log)" : "");
    const high = svg("text", {x: ax(i), y: PARALLEL.top - 5, "text-anchor": "middle", class: "tick"});
    high.textContent = axisText(axis, 1);
    const low = svg("text", {x: ax(i), y: PARALLEL.top + h + 14, "text-anchor": "middle",
      class: "tick"});
    low.textContent = axisText(axis, 0);
    parts.push(name, high, low);
  });
  const lines = svg("g", {id: "parallel-lines"});
  parallelLines.clear();
  const byId = new Map(state.runs.map((r) => [r.id, r]));
  why.runs.forEach((id, k) => {
    const run = byId.get(id);
    if (!run || !axes.length) return;
    const points = axes.map((axis, i) => `${ax(i).toFixed(1)},${ay(axis.positions[k]).toFixed(1)}`);
    const line = svg("polyline", {points: points.join(" "), fill: "none", "data-run": run.name,
      class: "parallel-line"});
    // A line is 1-3 px wide: an invisible wide twin takes the pointer, so a line is hovered
    // and pinned from a few pixels away, as a curve is.
    const hit = svg("polyline", {points: points.join(" "), fill: "none", "data-run": run.name,
      class: "parallel-hit"});
    const pair = svg("g", {"data-run": run.name});
    pair.append(line, hit);
    pair.addEventListener("mouseenter", () => setHot(id));
    pair.addEventListener("mouseleave", () => setHot(null));
    pair.addEventListener("click", () => togglePin(id));
    parallelLines.set(id, line);
    lines.append(pair);
  });
  root.replaceChildren(...parts, lines);
  styleParallel();
}

// The look of each line, as its run's curve: the top k by the metric (of the runs shown) in their
// colours, the pinned and the hovered above them, the rest grey; filtered-out runs hidden.
function styleParallel() {
  if (!parallelLines.size) return;
  const shown = state.runs.filter((r) => parallelLines.has(r.id) && isShown(r));
  const visibleIds = new Set(shown.map((r) => r.id));
  const top = topRuns(shown, state.topK);
  const group = document.getElementById("parallel-lines");
  const raised = [];
  for (const run of state.runs) {
    const line = parallelLines.get(run.id);
    if (!line) continue;
    const visible = visibleIds.has(run.id);
    const strong = state.hot === run.id || state.pinned.has(run.id);
    const lit = visible && (top.has(run.id) || strong);
    line.parentNode.style.display = visible ? "" : "none";
    line.setAttribute("stroke", lit ? runStyle(run.index).colour : GREY);
    line.setAttribute("stroke-width", strong ? 3 : lit ? 1.8 : 1);
    line.classList.toggle("coloured", lit);
    if (lit) raised.push([strong ? 1 : 0, line]);
  }
  raised.sort((a, b) => a[0] - b[0]).forEach(([, line]) => group.append(line.parentNode));
}

function setUpWhy() {
  document.getElementById("why-view").addEventListener("toggle", () => {
    if (whyOpen()) loadWhy();
  });
}

// After a refresh: the view, open, asks again every WHY_EVERY refreshes; else restyled.
function refreshWhy() {
  if (!whyOpen()) return;
  if (!state.why || state.refreshes - (state.whyAt || 0) >= WHY_EVERY) loadWhy();
  else styleParallel();
}

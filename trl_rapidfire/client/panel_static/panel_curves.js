"use strict";
// The control panel's learning curves (loaded before panel.js, which owns `state`): one SVG
// path per run, so that a run can be hovered, clicked (pinned) and counted. With 30-500 runs
// a colour per run cannot be told apart, so only the top k runs by the ranking metric (the
// experiment's, or the one picked: panel_rank.js; the latest value, best first), the pinned
// ones and the one under the pointer are drawn in colour, each named at its line's end; the
// others are thin and grey.

// A run's look, by its run index, as in trl-rapidfire report's figures
// (trl_rapidfire/reports/plot_style.py: PALETTE, LINE_STYLES and run_style; a test holds them
// equal): 20 colours, and a line style that shifts with each round of 20 runs.
const PALETTE = [
  "#1f77b4", "#b4b41e", "#960000", "#ff78c3", "#005a1e",
  "#781e87", "#ff874b", "#00c3b4", "#785a00", "#a5b4ff",
  "#a56969", "#2da53c", "#00c3ff", "#007878", "#9669d2",
  "#c38700", "#a5004b", "#87875a", "#3c4b78", "#b45a1e",
];
const DASHES = [[], [6, 3], [6, 3, 1, 3], [1, 3]];  // "-", "--", "-.", ":"
const GREY = "#c4c9cf";
const SVG = "http://www.w3.org/2000/svg";
const PLOT = {height: 340, left: 56, right: 130, top: 10, bottom: 28, labelGap: 12};

function runStyle(index) {
  const i = Math.max(index, 0), rounds = Math.floor(i / PALETTE.length);
  return {colour: PALETTE[i % PALETTE.length], dash: DASHES[(i + rounds) % DASHES.length]};
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

// The runs drawn in colour: the top k shown runs by the ranking metric (those with a value).
function topRuns(runs, k) {
  const metric = rankMetric();
  const scored = bestFirst(runs.filter((r) => rankValue(r, metric) !== null), metric);
  return new Set(scored.slice(0, k).map((r) => r.id));
}

// Each run's path, made once and kept (by run id): a refresh updates its points, a hover only
// its look, so the element under the pointer is never replaced while it is hovered.
const curveLines = new Map();
let curveScale = null;

function lineOf(run, layers) {
  let line = curveLines.get(run.id);
  if (!line) {
    const path = svg("path", {class: "curve", "data-run": run.name, fill: "none"});
    const hit = svg("path", {class: "hit", "data-run": run.name, fill: "none"});
    hit.addEventListener("mouseenter", () => setHot(run.id));
    hit.addEventListener("mouseleave", () => setHot(null));
    hit.addEventListener("click", () => togglePin(run.id));
    line = {path, hit, drawnFrom: null};
    curveLines.set(run.id, line);
    layers.lines.append(path);
    layers.hits.append(hit);
  }
  return line;
}

function plotLayers() {
  const root = document.getElementById("curves");
  if (!root.firstChild) {
    for (const name of ["axes", "lines", "labels", "hits"]) root.append(svg("g", {id: `plot-${name}`}));
  }
  return {root, axes: root.children[0], lines: root.children[1], labels: root.children[2],
    hits: root.children[3]};
}

function drawAxes(layers, scale) {
  const {x, y, w, h, xMax, tMin, tMax} = scale;
  const parts = [svg("rect", {x: PLOT.left, y: PLOT.top, width: w, height: h, class: "frame"})];
  for (let k = 0; k <= 4; k++) {
    const v = scale.value(tMin + (k / 4) * (tMax - tMin)), s = Math.round((k / 4) * xMax);
    const yl = svg("text", {x: PLOT.left - 6, y: y(v) + 4, "text-anchor": "end", class: "tick"});
    yl.textContent = v.toPrecision(3);
    const xl = svg("text", {x: x(s), y: PLOT.top + h + 18, "text-anchor": "middle", class: "tick"});
    xl.textContent = String(s);
    parts.push(yl, xl);
  }
  const note = svg("text", {x: PLOT.left + 6, y: PLOT.top + 14, class: "tick"});
  note.textContent = scale.log ? "loss (log scale)" : "loss";
  parts.push(note);
  layers.axes.replaceChildren(...parts);
}

// Updates every run's path (their points and the scale), then their look.
function drawCurves() {
  const layers = plotLayers();
  const shown = state.runs.filter((r) => isShown(r) && (state.history[r.id] || {}).points);
  const empty = document.getElementById("curves-empty");
  let xMax = 1, yMin = Infinity, yMax = -Infinity;
  for (const run of shown) {  // a loop: spreading 100k+ points into Math.max overflows
    for (const [step, value] of state.history[run.id].points) {
      if (value === null) continue;
      if (step > xMax) xMax = step;
      if (value < yMin) yMin = value;
      if (value > yMax) yMax = value;
    }
  }
  empty.hidden = yMin !== Infinity;
  if (yMin === Infinity) { yMin = 0; yMax = 1; }
  // Losses falling over decades: on a log scale, else the best runs' curves (the coloured
  // ones) lie on top of each other along the bottom.
  const log = yMin > 0 && yMax / yMin >= 10;
  const f = log ? Math.log10 : (v) => v;
  let tMin = f(yMin), tMax = f(yMax);
  if (tMax - tMin < 1e-12) { tMin -= 0.5; tMax += 0.5; }
  const width = Math.max(layers.root.parentNode.clientWidth, 320);
  layers.root.setAttribute("viewBox", `0 0 ${width} ${PLOT.height}`);
  layers.root.setAttribute("width", width);
  layers.root.setAttribute("height", PLOT.height);
  const w = width - PLOT.left - PLOT.right, h = PLOT.height - PLOT.top - PLOT.bottom;
  const scale = {w, h, xMax, log, tMin, tMax, x: (s) => PLOT.left + (s / xMax) * w,
    y: (v) => PLOT.top + (1 - (f(v) - tMin) / (tMax - tMin)) * h,
    value: (t) => (log ? 10 ** t : t)};
  const key = `${width} ${xMax} ${tMin} ${tMax} ${log}`;
  const rescaled = key !== curveScale;
  curveScale = key;
  drawAxes(layers, scale);
  const ids = new Set(shown.map((r) => r.id));
  for (const [id, line] of curveLines) {
    if (!ids.has(id)) { line.path.remove(); line.hit.remove(); curveLines.delete(id); }
  }
  for (const run of shown) {
    const line = lineOf(run, layers);
    const points = state.history[run.id].points;
    if (rescaled || line.drawnFrom !== points.length) {
      let d = "";
      for (const [s, v] of points) {
        if (v === null) continue;
        d += `${d ? "L" : "M"}${scale.x(s).toFixed(1)} ${scale.y(v).toFixed(1)}`;
      }
      line.path.setAttribute("d", d);
      line.hit.setAttribute("d", d);
      line.drawnFrom = points.length;
    }
  }
  state.curveScale = scale;
  styleCurves();
}

// The look of every drawn path (colour or grey, width, what is on top) and the names at the
// ends of the coloured ones: after a refresh, a hover, a pin or a change of k.
function styleCurves() {
  const layers = plotLayers();
  const scale = state.curveScale;
  if (!scale) return;
  const shown = state.runs.filter((r) => curveLines.has(r.id));
  const top = topRuns(shown, state.topK);
  const coloured = shown.filter((r) => top.has(r.id) || state.pinned.has(r.id) || state.hot === r.id);
  const loud = new Set(coloured.map((r) => r.id));
  const onTop = [];
  for (const run of shown) {
    const {path} = curveLines.get(run.id);
    const style = runStyle(run.index);
    const lit = loud.has(run.id);
    const strong = state.hot === run.id || state.pinned.has(run.id);
    path.setAttribute("stroke", lit ? style.colour : GREY);
    path.setAttribute("stroke-width", strong ? 3 : lit ? 1.8 : 1);
    path.setAttribute("stroke-dasharray", lit ? style.dash.join(" ") : "");
    path.classList.toggle("coloured", lit);
    path.classList.toggle("hot", state.hot === run.id);
    path.classList.toggle("pinned", state.pinned.has(run.id));
    if (lit) onTop.push([strong ? 1 : 0, path]);
  }
  // Grey first, the coloured above, the hovered and pinned above all (moved, not remade).
  onTop.sort((a, b) => a[0] - b[0]).forEach(([, path]) => layers.lines.append(path));
  drawLabels(layers, scale, coloured);
}

function drawLabels(layers, scale, runs) {
  const labels = runs.map((run) => {
    const points = state.history[run.id].points.filter((p) => p[1] !== null);
    const [s, v] = points.length ? points[points.length - 1] : [0, scale.value(scale.tMin)];
    return {run, x: scale.x(s) + 4, y: scale.y(v) + 4};
  }).sort((a, b) => a.y - b.y);
  // Names pushed apart so that none covers another (top-down, then back up from the bottom).
  const low = PLOT.top + 8, high = PLOT.top + scale.h + 4;
  for (let i = 0; i < labels.length; i++) {
    labels[i].y = Math.max(labels[i].y, i ? labels[i - 1].y + PLOT.labelGap : low);
  }
  for (let i = labels.length - 1; i >= 0; i--) {
    labels[i].y = Math.min(labels[i].y, i < labels.length - 1 ? labels[i + 1].y - PLOT.labelGap : high);
  }
  layers.labels.replaceChildren(...labels.map(({run, x, y}) => {
    const text = svg("text", {x: Math.min(x, PLOT.left + scale.w + 4), y, "data-run": run.name,
      class: "end-label", fill: runStyle(run.index).colour});
    text.textContent = run.name;
    return text;
  }));
}

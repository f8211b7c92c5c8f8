"use strict";
// The control panel's runs table (loaded before panel.js, which owns `state`): a row per run,
// made once and updated in place, in the order panel_rank.js gives (best first by the ranking
// metric, or by the column whose header was clicked); the filters (text over names and knob
// values, and the statuses shown) that narrow the table and the curves; hovering and pinning
// a run, shared with the curves. Its columns fit the page and each row is one line: a fixed
// layout, a cell's text cut with an ellipsis (whole in its tooltip: a long op answer, a
// policy's reason), the buttons in one row in their own column.

const MAX_KNOB_COLUMNS = 8;
const DONE = new Set(["completed", "stopped", "failed", "deleted"]);

// The knobs that differ between the runs, first seen first: the rule of every runs table
// (trl_rapidfire/reports/display.py differing_keys, client/experiments.py tracked_knobs). A
// knob holding a config object comes as its fields (`peft_config.r`), so only the fields that
// differ get a column. Runs tracked before the rapidfire.knobs tag give all their params, less
// those holding the run's own name (output_dir: it differs but tunes nothing).
function knobColumns(runs) {
  const tagged = runs.every((r) => r.tagged);
  const names = [...new Set(runs.flatMap((r) => Object.keys(r.params)))];
  const value = (r, k) => (Object.hasOwn(r.params, k) ? r.params[k] : "\0missing");
  const differ = (k) => new Set(runs.map((r) => value(r, k))).size > 1;
  const ownName = (k) => !tagged && runs.some((r) => Object.hasOwn(r.params, k) && r.params[k].includes(r.name));
  return names.filter((k) => differ(k) && !ownName(k)).slice(0, MAX_KNOB_COLUMNS);
}

// The status a row shows: in the rotation of an experiment that is not training (a Ctrl-C, a
// kill), "running" is interrupted, as `trl-rapidfire status` and the report say
// (shared_state/runs.py shown_status).
function shownStatus(run) {
  return state.current && state.current.state !== "training" && run.status === "running"
    ? "interrupted" : run.status;
}

// Whether one word of the filter text lets a run through (lower case): `key=value` matches a
// knob named key (or ending in `.key`) whose value is value, numbers compared as numbers
// (learning_rate=0.001 is 1e-3, not 0.00102); any other word is looked for in the run's name
// and its key=value texts. The notebook panel's rule too (reports/notebook_rows.py).
function wordMatches(word, name, pairs) {
  const at = word.indexOf("=");
  const key = at > 0 ? word.slice(0, at) : "", want = at > 0 ? word.slice(at + 1) : "";
  if (!key || !want) return name.includes(word) || pairs.some(([k, v]) => `${k}=${v}`.includes(word));
  const same = (v) => v === want || (v.trim() !== "" && want.trim() !== "" && Number(v) === Number(want));
  return pairs.some(([k, v]) => (k === key || k.endsWith(`.${key}`)) && same(v));
}

// Whether the filters let a run through: every word of the text box matches (wordMatches),
// and its status ticked.
function isShown(run) {
  if (state.hiddenStatuses.has(shownStatus(run))) return false;
  const words = state.filter.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return true;
  const name = run.name.toLowerCase();
  const pairs = Object.entries(run.params).map(([k, v]) => [k.toLowerCase(), String(v).toLowerCase()]);
  return words.every((w) => wordMatches(w, name, pairs));
}

// What the panel sent on a run (by run id: names repeat across experiments) shows until the
// experiment answered it; an error of the panel's own check, until the run's op tags move.
function answerOf(run) {
  const sent = state.sent[run.id];
  if (sent && sent.error && run.seq === sent.seq && run.result === sent.result) {
    return {text: `error: ${sent.error}`, cls: "error"};
  }
  if (sent && !sent.error && run.seq <= sent.seq) {
    // An experiment that is not training applies it at its script's next train() (the engine
    // reads the ops left for it before that call ends): said as such, never as imminent.
    const when = state.current && state.current.state !== "training"
      ? "applied by its script's next train()" : "applied at the run's next chunk boundary";
    return {text: `sent: ${sent.op} (${when})`, cls: "waiting"};
  }
  if (sent) delete state.sent[run.id];
  if (run.pending) return {text: `waiting: ${run.pending}`, cls: "waiting"};
  if (run.result) return {text: run.result, cls: run.result.startsWith("error") ? "error" : ""};
  return {text: "", cls: ""};
}

function metricText(run, key) {
  const m = run.metrics[key];
  return m && m.value !== null ? Number(m.value).toPrecision(4) : "";
}

// A run's buttons act on the run as the latest refresh knows it (looked up at the click).
// Delete, which cannot be undone, asks first.
function opButton(id, name, label, op) {
  return el("button", {
    type: "button", "data-run": name, "data-op": op, "aria-label": `${label} ${name}`,
    text: label, className: op === "delete" ? "danger" : "",
    onclick: (event) => {
      event.stopPropagation();  // a button is not a click on the row (which pins it)
      const run = state.runs.find((r) => r.id === id);
      if (!run) return;
      if (op === "clone") { openClone(run); return; }
      if (op === "delete" && !window.confirm(`Delete ${run.name} for good? Its state and `
        + "checkpoints are removed; it cannot be resumed.")) return;
      sendOp(run, op);
    }});
}

function setCell(cell, text, className, title) {
  if (cell.textContent !== text) cell.textContent = text;
  if (className !== undefined && cell.className !== className) cell.className = className;
  if (title !== undefined && cell.title !== title) cell.title = title;
}

// One row per run (by run id), made once: its tr, its cells by column, its buttons by op.
const tableRows = new Map();
let drawnColumns = "";

function rowOf(run) {
  let row = tableRows.get(run.id);
  if (!row) {
    const link = el("a", {target: "_blank", rel: "noopener", text: run.name,
      onclick: (event) => event.stopPropagation()});
    const cells = {name: el("td", {className: "c-run"}, link), status: el("td"),
      progress: el("td", {className: "c-progress"}), metrics: [], knobs: [],
      answer: el("td", {"data-answer": run.name})};
    const button = (label, op) => opButton(run.id, run.name, label, op);
    // Delete last, away from Stop: the one that cannot be undone.
    const buttons = {stop: button("Stop", "stop"), resume: button("Resume", "resume"),
      clone: button("Clone", "clone"), delete: button("Delete", "delete")};
    const tr = el("tr", {"data-run": run.name, onmouseenter: () => setHot(run.id),
      onmouseleave: () => setHot(null), onclick: () => togglePin(run.id)});
    row = {tr, cells, link, buttons,
      ops: el("td", {className: "c-ops"}, el("div", {className: "ops"}, ...Object.values(buttons)))};
    tableRows.set(run.id, row);
  }
  return row;
}

// The metric columns: the losses, a trainer kind's own, and the metric ranked by when it is
// another (by the key its runs logged it under).
function metricColumns() {
  const ranked = shownKey(rankMetric(), state.runs);
  return [...new Set(["loss", "eval_loss", ...(state.kindMetric ? [state.kindMetric] : []),
    ranked])];
}

// A header per column; a click sorts by its column (panel_rank.js sortBy), the arrow says
// which way. The knob columns share a width that keeps the page from scrolling sideways.
function drawHead() {
  const heads = [["run", "c-run", "run"], ["status", "c-status", "status"],
    ["progress", "c-progress", "progress"],
    ...state.metricColumns.map((k) => [k.replace("rewards/", ""), "c-metric", `metric:${k}`]),
    ...state.knobs.map((k) => [k, "c-knob", `knob:${k}`]),
    ["answer", "c-answer", "answer"], ["", "c-ops", null]];
  const knobWidth = `${Math.max(3.5, Math.min(7.5, 22 / Math.max(state.knobs.length, 1)))}em`;
  const ranked = rankMetric();
  document.getElementById("head").replaceChildren(...heads.map(([h, cls, column]) => {
    const sorted = state.sort ? state.sort.column === column
      : column === `metric:${shownKey(ranked, state.runs)}`;
    const dir = state.sort ? state.sort.dir : (ranked.mode === "max" ? -1 : 1);
    const th = el("th", {text: h + (sorted ? (dir > 0 ? " ▲" : " ▼") : ""),
      className: cls + (column ? " sortable" : ""), "data-column": column || false,
      title: column ? `${h}: click to sort` : "",
      "aria-sort": sorted ? (dir > 0 ? "ascending" : "descending") : false,
      onclick: column ? () => sortBy(column) : undefined});
    if (cls === "c-knob") th.style.width = knobWidth;
    return th;
  }));
}

function drawTable() {
  const exp = state.current;
  state.kindMetric = kindMetric(state.runs);
  state.metricColumns = metricColumns();
  drawMetricSelector();
  const columns = JSON.stringify([state.metricColumns, state.knobs, state.sort,
    rankMetric().key]);
  if (columns !== drawnColumns) drawHead();
  const rows = sortedRuns(state.runs).map((run) => {
    const row = rowOf(run);
    const {cells, buttons} = row;
    row.link.href = `${ROOT}#/experiments/${exp.eid}/runs/${run.id}`;
    const shown = shownStatus(run);
    setCell(cells.status, shown, `c-status status status-${shown}`);
    setCell(cells.progress, run.progress, "c-progress", run.progress);
    // The share of its chunks a run has trained, as a bar behind its progress text.
    const done = progressFraction(run.progress);
    const bar = done === null ? "" : `linear-gradient(90deg, #dafbe1 ${(done * 100).toFixed(1)}%, transparent 0)`;
    if (cells.progress.style.backgroundImage !== bar) cells.progress.style.backgroundImage = bar;
    if (columns !== drawnColumns || cells.knobs.length !== state.knobs.length
        || cells.metrics.length !== state.metricColumns.length) {
      cells.metrics = state.metricColumns.map(() => el("td", {className: "c-metric"}));
      cells.knobs = state.knobs.map(() => el("td", {className: "c-knob"}));
      row.tr.replaceChildren(cells.name, cells.status, cells.progress, ...cells.metrics,
        ...cells.knobs, cells.answer, row.ops);
    }
    state.metricColumns.forEach((k, i) => setCell(cells.metrics[i], metricText(run, k)));
    state.knobs.forEach((k, i) => {
      const text = run.params[k] ?? "";
      setCell(cells.knobs[i], text, "c-knob", text);
    });
    const answer = answerOf(run);
    setCell(cells.answer, answer.text, `c-answer answer ${answer.cls}`, answer.text);
    buttons.stop.disabled = DONE.has(run.status);
    buttons.resume.disabled = run.status !== "stopped";
    buttons.delete.disabled = run.status === "deleted";
    row.tr.hidden = !isShown(run);
    row.tr.classList.toggle("pinned", state.pinned.has(run.id));
    row.tr.classList.toggle("hot", state.hot === run.id);
    return row.tr;
  });
  drawnColumns = columns;
  const present = new Set(state.runs.map((r) => r.id));
  for (const id of [...tableRows.keys()]) if (!present.has(id)) tableRows.delete(id);
  const body = document.getElementById("rows");
  const same = rows.length === body.children.length && rows.every((tr, i) => body.children[i] === tr);
  if (!same) body.replaceChildren(...rows);  // runs added, gone or reordered: the rows move
  drawStatusFilters();
  const count = rows.filter((tr) => !tr.hidden).length;
  document.getElementById("shown-count").textContent =
    count === rows.length ? `${count} runs` : `${count} of ${rows.length} runs shown`;
  document.getElementById("runs").setAttribute("data-refreshes", String(state.refreshes));
}

// A checkbox per status the runs have (all ticked at first): unticked, its runs leave the
// table and the curves.
function drawStatusFilters() {
  const statuses = [...new Set(state.runs.map(shownStatus))].sort();
  const box = document.getElementById("status-filters");
  if (box.dataset.statuses === statuses.join(",")) return;
  box.dataset.statuses = statuses.join(",");
  box.replaceChildren(...statuses.map((s) => el("label", {className: `chip status-${s}`},
    el("input", {type: "checkbox", "data-status": s, checked: !state.hiddenStatuses.has(s),
      onchange: (event) => {
        if (event.target.checked) state.hiddenStatuses.delete(s); else state.hiddenStatuses.add(s);
        redraw();
      }}), ` ${s}`)));
}

// Hovering a row or a curve lights the run in both; a click pins it (it stays lit, across
// refreshes, until clicked again).
function setHot(id) {
  if (state.hot === id) return;
  const before = state.hot;
  state.hot = id;
  for (const runId of [before, id]) {
    const row = runId && tableRows.get(runId);
    if (row) row.tr.classList.toggle("hot", state.hot === runId);
  }
  styleCurves();
  styleParallel();
}

function togglePin(id) {
  if (state.pinned.has(id)) state.pinned.delete(id); else state.pinned.add(id);
  const row = tableRows.get(id);
  if (row) row.tr.classList.toggle("pinned", state.pinned.has(id));
  styleCurves();
  styleParallel();
}

function redraw() {
  drawTable();
  drawCurves();
  styleParallel();
}

function setUpFilters() {
  document.getElementById("filter").addEventListener("input", (event) => {
    state.filter = event.target.value.slice(0, 200);
    redraw();
  });
  document.getElementById("top-k").addEventListener("change", (event) => {
    const k = parseInt(event.target.value, 10);
    state.topK = Number.isFinite(k) ? Math.min(Math.max(k, 0), 50) : 10;
    styleCurves();
    styleParallel();
  });
}

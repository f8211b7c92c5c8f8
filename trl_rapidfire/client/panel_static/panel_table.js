"use strict";
// The control panel's runs table (loaded before panel.js, which owns `state`): a row per run,
// made once and updated in place; the filters (text over names and knob values, and the
// statuses shown) that narrow the table and the curves; hovering and pinning a run, shared
// with the curves. Its columns fit the page: a fixed layout, a knob's text cut with an
// ellipsis (whole in its tooltip), the buttons wrapping inside their own column.

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

// Whether the filters let a run through: every word of the text box in its name or one of
// its knob values (case-insensitive), and its status ticked.
function isShown(run) {
  if (state.hiddenStatuses.has(shownStatus(run))) return false;
  const words = state.filter.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return true;
  const text = [run.name, ...Object.entries(run.params).map(([k, v]) => `${k}=${v}`)]
    .join(" ").toLowerCase();
  return words.every((w) => text.includes(w));
}

// What the panel sent on a run (by run id: names repeat across experiments) shows until the
// experiment answered it; an error of the panel's own check, until the run's op tags move.
function answerOf(run) {
  const sent = state.sent[run.id];
  if (sent && sent.error && run.seq === sent.seq && run.result === sent.result) {
    return {text: `error: ${sent.error}`, cls: "error"};
  }
  if (sent && !sent.error && run.seq <= sent.seq) {
    return {text: `sent: ${sent.op} (applied at the run's next chunk boundary)`, cls: "waiting"};
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
function opButton(id, name, label, op) {
  return el("button", {
    type: "button", "data-run": name, "data-op": op, "aria-label": `${label} ${name}`,
    text: label,
    onclick: (event) => {
      event.stopPropagation();  // a button is not a click on the row (which pins it)
      const run = state.runs.find((r) => r.id === id);
      if (run) (op === "clone" ? openClone(run) : sendOp(run, op));
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
      progress: el("td", {className: "c-progress"}), loss: el("td"), eval: el("td"),
      kind: el("td"), knobs: [],
      answer: el("td", {"data-answer": run.name})};
    const button = (label, op) => opButton(run.id, run.name, label, op);
    const buttons = {stop: button("Stop", "stop"), resume: button("Resume", "resume"),
      delete: button("Delete", "delete"), clone: button("Clone", "clone")};
    const tr = el("tr", {"data-run": run.name, onmouseenter: () => setHot(run.id),
      onmouseleave: () => setHot(null), onclick: () => togglePin(run.id)});
    row = {tr, cells, link, buttons,
      ops: el("td", {className: "c-ops"}, el("div", {className: "ops"}, ...Object.values(buttons)))};
    tableRows.set(run.id, row);
  }
  return row;
}

function drawHead() {
  const heads = [["run", "c-run"], ["status", "c-status"], ["progress", "c-progress"],
    ["loss", "c-metric"], ["eval_loss", "c-metric"],
    ...(state.kindMetric ? [[state.kindMetric.replace("rewards/", ""), "c-metric"]] : []),
    ...state.knobs.map((k) => [k, "c-knob"]),
    ["answer", "c-answer"], ["", "c-ops"]];
  document.getElementById("head").replaceChildren(...heads.map(([h, cls]) =>
    el("th", {text: h, className: cls, title: h})));
}

function drawTable() {
  const exp = state.current;
  state.kindMetric = kindMetric(state.runs);
  const columns = JSON.stringify([state.kindMetric, state.knobs]);
  if (columns !== drawnColumns) drawHead();
  const rows = state.runs.map((run) => {
    const row = rowOf(run);
    const {cells, buttons} = row;
    row.link.href = `${ROOT}#/experiments/${exp.eid}/runs/${run.id}`;
    const shown = shownStatus(run);
    setCell(cells.status, shown, `c-status status status-${shown}`);
    setCell(cells.progress, run.progress, "c-progress", run.progress);
    setCell(cells.loss, metricText(run, "loss"));
    setCell(cells.eval, metricText(run, "eval_loss"));
    if (state.kindMetric) setCell(cells.kind, metricText(run, state.kindMetric));
    if (columns !== drawnColumns || cells.knobs.length !== state.knobs.length) {
      cells.knobs = state.knobs.map(() => el("td", {className: "c-knob"}));
      row.tr.replaceChildren(cells.name, cells.status, cells.progress, cells.loss, cells.eval,
        ...(state.kindMetric ? [cells.kind] : []), ...cells.knobs, cells.answer, row.ops);
    }
    state.knobs.forEach((k, i) => {
      const text = run.params[k] ?? "";
      setCell(cells.knobs[i], text, "c-knob", text);
    });
    const answer = answerOf(run);
    setCell(cells.answer, answer.text, `c-answer answer ${answer.cls}`);
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

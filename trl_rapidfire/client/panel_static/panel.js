"use strict";
// The trl-rapidfire control panel (served by the MLflow app plugin, trl_rapidfire/client/
// panel_app.py). Everything it reads and writes goes through MLflow's own REST API, from this
// page's origin: a button sets the run's `rapidfire.op` tag, exactly what a person editing
// the tag in MLflow's UI does; the experiment applies it at the run's next chunk boundary and
// answers in `rapidfire.op.result`, which the row then shows. Text read from the store is
// only ever put into the page as text (textContent), never as markup.

const ROOT = location.pathname.replace(/rapidfire\/?(index\.html)?$/, "");
const API = ROOT + "ajax-api/2.0/mlflow/";
const PANEL_API = ROOT + "rapidfire/api/";
const TAG = {
  op: "rapidfire.op", result: "rapidfire.op.result", seq: "rapidfire.op.seq",
  run: "rapidfire.run", status: "rapidfire.status", progress: "rapidfire.progress",
  role: "rapidfire.role", experiment: "rapidfire.experiment",
  heartbeat: "rapidfire.heartbeat", knobs: "rapidfire.knobs",
};
const REFRESH_MS = 2000;
const HEARTBEAT_STALE_S = 180;  // as trl_rapidfire.tracking.tags.HEARTBEAT_STALE
const HISTORIES_PER_REFRESH = 10;  // curve fetches per refresh: a refresh stays cheap at 500 runs
const MAX_KNOB_COLUMNS = 8;
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
function runStyle(index) {
  const i = Math.max(index, 0), rounds = Math.floor(i / PALETTE.length);
  return {colour: PALETTE[i % PALETTE.length], dash: DASHES[(i + rounds) % DASHES.length]};
}
const DONE = new Set(["completed", "stopped", "failed", "deleted"]);

const state = {
  experiments: [], current: null, runs: [], knobs: [], sent: {}, history: {},
  refreshes: 0, cloneOf: null, cloneFields: [],
};
window.rfPanel = state;  // what a test (or a curious person) can read

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") node.textContent = v;
    else if (k === "className") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== false && v !== undefined && v !== null) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children) node.append(child);
  return node;
}

// The line under the header: what a person did (an op sent) or what a refresh found (no
// experiment, a failed call). A refresh's notice goes once a refresh succeeds again.
let noticeFromRefresh = false;
function message(text, fromRefresh = false) {
  document.getElementById("message").textContent = text;
  noticeFromRefresh = fromRefresh;
}

async function call(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  const response = await fetch(path, init);
  const text = await response.text();
  let doc;
  try { doc = JSON.parse(text); } catch (e) { doc = {message: text.slice(0, 300)}; }
  // MLflow's errors say `message`; the panel's own routes answer a refusal with `error`.
  if (!response.ok) throw new Error(doc.message || doc.error || `${response.status} ${response.statusText}`);
  return doc;
}

async function searchRuns(experimentIds, filter) {
  let runs = [];
  for (let i = 0; i < experimentIds.length; i += 100) {  // the API takes 100 ids a call
    let token;
    do {
      const page = await call(API + "runs/search", {
        experiment_ids: experimentIds.slice(i, i + 100), filter, max_results: 1000,
        page_token: token});
      runs = runs.concat(page.runs || []);
      token = page.next_page_token;
    } while (token);
  }
  return runs;
}

function asMap(list, value) {
  const map = {};
  for (const item of list || []) map[item.key] = value ? value(item) : item.value;
  return map;
}

function runOrder(name) {
  const m = /(\d+)$/.exec(name || "");
  return m ? Number(m[1]) : Number.MAX_SAFE_INTEGER;
}

function toRun(raw) {
  const tags = asMap(raw.data && raw.data.tags);
  let knobNames = null;  // the rapidfire.knobs tag: a JSON list of names (text from outside)
  try { knobNames = JSON.parse(tags[TAG.knobs] || "null"); } catch (e) { knobNames = null; }
  const tagged = Array.isArray(knobNames) && knobNames.every((n) => typeof n === "string");
  return {
    id: raw.info.run_id, name: tags[TAG.run] || raw.info.run_name || raw.info.run_id,
    status: tags[TAG.status] || "-", progress: tags[TAG.progress] || "",
    metrics: asMap(raw.data && raw.data.metrics, (m) => ({value: m.value, step: m.step})),
    params: asMap(raw.data && raw.data.params), tags,
    seq: parseInt(tags[TAG.seq] || "0", 10) || 0, pending: tags[TAG.op],
    result: tags[TAG.result], knobNames: tagged ? knobNames : [], tagged,
  };
}

function experimentState(parent) {
  const beat = parseFloat(asMap(parent.data && parent.data.tags)[TAG.heartbeat] || "");
  if (parent.info.status === "RUNNING") {
    const fresh = !isNaN(beat) && Date.now() / 1000 - beat <= HEARTBEAT_STALE_S;
    return fresh ? "training" : "not responding";
  }
  return {FINISHED: "finished", FAILED: "failed"}[parent.info.status] || "killed";
}

async function loadExperiments() {
  const found = [];
  let token;
  do {
    const page = await call(API + "experiments/search", {max_results: 1000, page_token: token});
    found.push(...(page.experiments || []));
    token = page.next_page_token;
  } while (token);
  const names = Object.fromEntries(found.map((e) => [e.experiment_id, e.name]));
  const parents = await searchRuns(Object.keys(names), `tags.\`${TAG.role}\` = 'experiment'`);
  state.experiments = parents.map((p) => ({
    eid: p.info.experiment_id, name: names[p.info.experiment_id] || p.info.experiment_id,
    rfid: asMap(p.data.tags)[TAG.experiment] || "", state: experimentState(p),
    start: p.info.start_time || 0,
  })).filter((e) => /^[0-9a-f]{8,64}$/.test(e.rfid)).sort((a, b) => b.start - a.start);
  const [, eid, rfid] = /^#\/([^/]+)(?:\/([0-9a-f]+))?/.exec(location.hash) || [];
  const inStore = state.experiments.filter((e) => !eid || e.eid === eid);
  state.current = inStore.find((e) => rfid && e.rfid === rfid)
    || inStore.find((e) => e.state === "training") || inStore[0] || null;
  const select = document.getElementById("experiment");
  select.replaceChildren(...state.experiments.map((e) => el("option", {
    value: `#/${e.eid}/${e.rfid}`, selected: e === state.current,
    text: `${e.name} (${e.rfid.slice(0, 8)}, ${e.state})`})));
}

// The knobs that differ between the runs, first seen first: the rule of every runs table
// (trl_rapidfire/reports/display.py differing_keys, client/experiments.py tracked_knobs). The
// runs' rapidfire.knobs tags name their knobs; runs tracked before that tag give all their
// params, less those holding the run's own name (output_dir: it differs but tunes nothing).
function knobColumns(runs) {
  const tagged = runs.every((r) => r.tagged);
  const names = [...new Set(runs.flatMap((r) => (tagged ? r.knobNames : Object.keys(r.params).sort())))];
  const value = (r, k) => (Object.hasOwn(r.params, k) ? JSON.stringify(r.params[k]) : "\0missing");
  const differ = (k) => new Set(runs.map((r) => value(r, k))).size > 1;
  const ownName = (k) => !tagged && runs.some((r) => Object.hasOwn(r.params, k) && r.params[k].includes(r.name));
  return names.filter((k) => differ(k) && !ownName(k)).slice(0, MAX_KNOB_COLUMNS);
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
  return m ? Number(m.value).toPrecision(4) : "";
}

// A run's buttons act on the run as the latest refresh knows it (looked up at the click):
// rows are kept and updated in place, so a click never lands on a row being replaced.
function opButton(id, name, label, op) {
  return el("button", {
    type: "button", "data-run": name, "data-op": op, "aria-label": `${label} ${name}`,
    text: label,
    onclick: () => {
      const run = state.runs.find((r) => r.id === id);
      if (run) (op === "clone" ? openClone(run) : sendOp(run, op));
    }});
}

function setCell(cell, text, className) {
  if (cell.textContent !== text) cell.textContent = text;
  if (className !== undefined && cell.className !== className) cell.className = className;
}

// One row per run (by run id), made once: its tr, its cells by column, its buttons by op.
const tableRows = new Map();
let drawnColumns = "";

function rowOf(run) {
  let row = tableRows.get(run.id);
  if (!row) {
    const link = el("a", {target: "_blank", rel: "noopener", text: run.name});
    const cells = {link, status: el("td"), progress: el("td"), loss: el("td"), eval: el("td"),
      knobs: [], answer: el("td", {"data-answer": run.name})};
    const button = (label, op) => opButton(run.id, run.name, label, op);
    const buttons = {stop: button("Stop", "stop"), resume: button("Resume", "resume"),
      delete: button("Delete", "delete"), clone: button("Clone", "clone")};
    const tr = el("tr", {"data-run": run.name});
    row = {tr, cells, buttons, ops: el("td", {}, ...Object.values(buttons))};
    tableRows.set(run.id, row);
  }
  return row;
}

function drawTable() {
  const exp = state.current;
  const columns = JSON.stringify(state.knobs);
  if (columns !== drawnColumns) {
    const heads = ["run", "status", "progress", "loss", "eval_loss", ...state.knobs, "answer", ""];
    document.getElementById("head").replaceChildren(...heads.map((h) => el("th", {text: h})));
  }
  const rows = state.runs.map((run) => {
    const row = rowOf(run);
    const {cells, buttons} = row;
    cells.link.href = `${ROOT}#/experiments/${exp.eid}/runs/${run.id}`;
    // In the rotation of an experiment that is not training (a Ctrl-C, a kill): interrupted,
    // as `trl-rapidfire status` and the report say (shared_state/runs.py shown_status).
    const shown = exp.state !== "training" && run.status === "running" ? "interrupted"
      : run.status;
    setCell(cells.status, shown, `status status-${shown}`);
    setCell(cells.progress, run.progress);
    setCell(cells.loss, metricText(run, "loss"));
    setCell(cells.eval, metricText(run, "eval_loss"));
    if (columns !== drawnColumns || cells.knobs.length !== state.knobs.length) {
      cells.knobs = state.knobs.map(() => el("td"));
      row.tr.replaceChildren(el("td", {}, cells.link), cells.status, cells.progress, cells.loss,
        cells.eval, ...cells.knobs, cells.answer, row.ops);
    }
    state.knobs.forEach((k, i) => setCell(cells.knobs[i], (run.params[k] || "").slice(0, 40)));
    const answer = answerOf(run);
    setCell(cells.answer, answer.text, `answer ${answer.cls}`);
    buttons.stop.disabled = DONE.has(run.status);
    buttons.resume.disabled = run.status !== "stopped";
    buttons.delete.disabled = run.status === "deleted";
    return row.tr;
  });
  drawnColumns = columns;
  const shown = new Set(state.runs.map((r) => r.id));
  for (const id of [...tableRows.keys()]) if (!shown.has(id)) tableRows.delete(id);
  const body = document.getElementById("rows");
  const same = rows.length === body.children.length && rows.every((tr, i) => body.children[i] === tr);
  if (!same) body.replaceChildren(...rows);  // runs added, gone or reordered: the rows move
  document.getElementById("runs").setAttribute("data-refreshes", String(state.refreshes));
}

async function sendOp(run, op) {
  const failed = (error) => ({op, error, seq: run.seq, result: run.result});
  state.sent[run.id] = {op, seq: run.seq};
  drawTable();
  try {
    const checked = await call(PANEL_API + "check-op", {run: run.name, op, status: run.status});
    if (checked.error) {
      state.sent[run.id] = failed(checked.error);
    } else {
      await call(API + "runs/set-tag", {run_id: run.id, key: TAG.op, value: op});
      const notes = [];
      if (run.pending) notes.push(`it replaced ${run.pending}, which was not applied yet`);
      if (state.current.state !== "training") {
        notes.push("the experiment is not training: it is applied when its script runs again");
      }
      message(`${run.name}: sent ${op}` + (notes.length ? ` (${notes.join("; ")})` : ""));
    }
  } catch (e) {
    state.sent[run.id] = failed(e.message);
  }
  drawTable();
}

async function openClone(run) {
  state.cloneOf = run;
  const names = [...new Set([...run.knobNames, ...state.knobs,
    ...("learning_rate" in run.params ? ["learning_rate"] : [])])];
  let refused = {};
  try {
    const reply = await call(PANEL_API + "clone-fields", {fields: names});
    refused = Object.fromEntries((reply.fields || []).map((f) => [f.name, f.refused]));
  } catch (e) { message(`the clone form could not check its fields: ${e.message}`); }
  state.cloneFields = names.map((name) => ({name, value: run.params[name] ?? "",
    refused: refused[name] || null}));
  document.getElementById("clone-title").textContent = `Clone ${run.name}`;
  document.getElementById("clone-fields").replaceChildren(...state.cloneFields.map((f) =>
    el("tr", {},
      el("td", {text: f.name}),
      el("td", {}, el("input", {value: f.value, "data-field": f.name, "aria-label": f.name,
        disabled: Boolean(f.refused)})),
      el("td", {className: "locked", text: f.refused ? `a tag may not change it: ${f.refused}` : ""}))));
  document.getElementById("extra-name").value = "";
  document.getElementById("extra-value").value = "";
  document.getElementById("clone-warm").checked = false;
  document.getElementById("clone-form").hidden = false;
}

function parsed(text) {
  try { return JSON.parse(text); } catch (e) { return text; }
}

function sendClone() {
  const run = state.cloneOf;
  if (!run) return;
  const overrides = {};
  for (const input of document.querySelectorAll("#clone-fields input")) {
    const field = state.cloneFields.find((f) => f.name === input.dataset.field);
    if (field && !field.refused && input.value !== field.value) overrides[field.name] = parsed(input.value);
  }
  const extra = document.getElementById("extra-name").value.trim();
  if (extra) overrides[extra] = parsed(document.getElementById("extra-value").value);
  const verb = document.getElementById("clone-warm").checked ? "clone-warm" : "clone";
  document.getElementById("clone-form").hidden = true;
  state.cloneOf = null;
  sendOp(run, `${verb} ${JSON.stringify(overrides)}`);
}

async function updateCurves() {
  const stale = state.runs.filter((r) => r.metrics.loss
    && (!state.history[r.id] || state.history[r.id].step < r.metrics.loss.step));
  for (const run of stale.slice(0, HISTORIES_PER_REFRESH)) {
    try {  // one run's history failing (deleted since the search) leaves the others drawn
      const metrics = [];
      let token;
      do {
        const query = new URLSearchParams({run_id: run.id, metric_key: "loss", max_results: "25000"});
        if (token) query.set("page_token", token);
        const reply = await call(`${API}metrics/get-history?${query}`);
        metrics.push(...(reply.metrics || []));
        token = reply.next_page_token;
      } while (token);
      const points = metrics.map((m) => [m.step, m.value]).sort((a, b) => a[0] - b[0]);
      state.history[run.id] = {step: run.metrics.loss.step, points};
    } catch (e) {
      message(`${run.name}: its loss history could not be read (${e.message})`, true);
    }
  }
}

function drawCurves() {
  const canvas = document.getElementById("curves");
  const ctx = canvas.getContext("2d");
  const pad = {left: 56, right: 12, top: 10, bottom: 28};
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const lines = state.runs.map((r, i) => ({run: r, points: (state.history[r.id] || {}).points || [],
    index: runOrder(r.name) === Number.MAX_SAFE_INTEGER ? i : runOrder(r.name)}))
    .filter((l) => l.points.length);
  const all = lines.flatMap((l) => l.points);
  const legend = document.getElementById("legend");
  if (!all.length) { legend.replaceChildren(el("span", {text: "no training loss logged yet"})); return; }
  // A loop, not Math.max(...points): spreading 100k+ points overflows the call stack.
  let xMax = 1, yMin = Infinity, yMax = -Infinity;
  for (const [step, value] of all) {
    if (step > xMax) xMax = step;
    if (value < yMin) yMin = value;
    if (value > yMax) yMax = value;
  }
  if (yMax - yMin < 1e-12) { yMin -= 0.5; yMax += 0.5; }
  const w = canvas.width - pad.left - pad.right, h = canvas.height - pad.top - pad.bottom;
  const x = (s) => pad.left + (s / xMax) * w, y = (v) => pad.top + (1 - (v - yMin) / (yMax - yMin)) * h;
  ctx.strokeStyle = "#8c959f"; ctx.fillStyle = "#57606a"; ctx.font = "11px sans-serif";
  ctx.strokeRect(pad.left, pad.top, w, h);
  for (let k = 0; k <= 4; k++) {
    const v = yMin + (k / 4) * (yMax - yMin);
    ctx.fillText(v.toPrecision(3), 4, y(v) + 4);
    const s = Math.round((k / 4) * xMax);
    ctx.fillText(String(s), x(s) - 6, canvas.height - 10);
  }
  for (const line of lines) {
    const style = runStyle(line.index);
    ctx.strokeStyle = style.colour;
    ctx.setLineDash(style.dash);
    ctx.lineWidth = 1.6;
    ctx.beginPath();
    line.points.forEach(([s, v], k) => (k ? ctx.lineTo(x(s), y(v)) : ctx.moveTo(x(s), y(v))));
    ctx.stroke();
  }
  ctx.setLineDash([]);
  legend.replaceChildren(...lines.map((l) => el("span", {},
    el("i", {style: `background:${runStyle(l.index).colour}`}), l.run.name)));
}

async function refresh() {
  const started = performance.now();
  try {
    await loadExperiments();
    const exp = state.current;
    if (!exp) {  // none yet (the panel opened before training), or the link names another
      state.runs = [];
      document.getElementById("rows").replaceChildren();
      message(location.hash && state.experiments.length
        ? "That experiment is not in this store: pick one from the menu."
        : "No trl-rapidfire experiment in this store yet: train one with report_to=\"mlflow\".",
      true);
      return;
    }
    if (noticeFromRefresh) message("");
    document.getElementById("state").textContent = exp.state;
    document.getElementById("mlflow-link").href =
      `${ROOT}#/experiments/${exp.eid}/runs?workflowType=machine_learning&viewStateShareKey=trl-rapidfire`;
    const raw = await searchRuns([exp.eid],
      `tags.\`${TAG.role}\` = 'run' and tags.\`${TAG.experiment}\` = '${exp.rfid}'`);
    state.runs = raw.map(toRun).sort((a, b) => runOrder(a.name) - runOrder(b.name));
    state.knobs = knobColumns(state.runs);
    state.refreshes += 1;
    drawTable();
    await updateCurves();
    drawCurves();
    // What a refresh costs in this browser (REST calls, table and curves), for a look or a
    // benchmark (benchmarks/panel_refresh.py).
    state.refreshMs = performance.now() - started;
  } catch (e) {
    message(`refresh failed: ${e.message}`, true);
  }
}

// Every 2 s, or twice as long as the last refresh took (about 2 s at 500 runs, most of it
// MLflow's runs/search: benchmarks/panel_refresh.py), so that an open page keeps the tracking
// server busy a third of the time at most.
async function loop() {
  await refresh();
  setTimeout(loop, Math.max(REFRESH_MS, 2 * (state.refreshMs || 0)));
}

document.getElementById("experiment").addEventListener("change", (event) => {
  location.hash = event.target.value;
});
window.addEventListener("hashchange", () => { state.history = {}; state.sent = {}; refresh(); });
document.getElementById("clone-send").addEventListener("click", sendClone);
document.getElementById("clone-cancel").addEventListener("click", () => {
  document.getElementById("clone-form").hidden = true;
  state.cloneOf = null;
});
loop();

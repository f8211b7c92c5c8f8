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
// 20 colours that neighbours do not share, then the same colours dashed.
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
  "#c49c94", "#f7b6d2", "#393b79", "#dbdb8d", "#9edae5"];
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

function message(text) { document.getElementById("message").textContent = text; }

async function call(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  const response = await fetch(path, init);
  const text = await response.text();
  let doc;
  try { doc = JSON.parse(text); } catch (e) { doc = {message: text.slice(0, 300)}; }
  if (!response.ok) throw new Error(doc.message || `${response.status} ${response.statusText}`);
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
  let knobNames = [];
  try { knobNames = JSON.parse(tags[TAG.knobs] || "[]"); } catch (e) { knobNames = []; }
  return {
    id: raw.info.run_id, name: tags[TAG.run] || raw.info.run_name || raw.info.run_id,
    status: tags[TAG.status] || "-", progress: tags[TAG.progress] || "",
    metrics: asMap(raw.data && raw.data.metrics, (m) => ({value: m.value, step: m.step})),
    params: asMap(raw.data && raw.data.params), tags,
    seq: parseInt(tags[TAG.seq] || "0", 10) || 0, pending: tags[TAG.op],
    result: tags[TAG.result], knobNames: Array.isArray(knobNames) ? knobNames.map(String) : [],
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

function knobColumns(runs) {
  let names = [...new Set(runs.flatMap((r) => r.knobNames))];
  const differ = (k) => new Set(runs.map((r) => r.params[k])).size > 1;
  if (!names.length) {  // runs tracked before the knobs tag: the params that differ
    const keys = [...new Set(runs.flatMap((r) => Object.keys(r.params)))];
    names = keys.filter((k) => differ(k) && !runs.some((r) => (r.params[k] || "").includes(r.name)));
  }
  return [...names.filter(differ), ...names.filter((k) => !differ(k))].slice(0, MAX_KNOB_COLUMNS);
}

function answerOf(run) {
  const sent = state.sent[run.name];
  if (sent && sent.error) return {text: `error: ${sent.error}`, cls: "error"};
  if (sent && run.seq <= sent.seq) {
    return {text: `sent: ${sent.op} (applied at the run's next chunk boundary)`, cls: "waiting"};
  }
  if (sent) delete state.sent[run.name];
  if (run.pending) return {text: `waiting: ${run.pending}`, cls: "waiting"};
  if (run.result) return {text: run.result, cls: run.result.startsWith("error") ? "error" : ""};
  return {text: "", cls: ""};
}

function metricText(run, key) {
  const m = run.metrics[key];
  return m ? Number(m.value).toPrecision(4) : "";
}

function opButton(run, label, op, enabled) {
  return el("button", {
    type: "button", "data-run": run.name, "data-op": op, "aria-label": `${label} ${run.name}`,
    text: label, disabled: !enabled,
    onclick: () => (op === "clone" ? openClone(run) : sendOp(run, op))});
}

function drawTable() {
  const exp = state.current;
  const heads = ["run", "status", "progress", "loss", "eval_loss", ...state.knobs, "answer", ""];
  document.getElementById("head").replaceChildren(...heads.map((h) => el("th", {text: h})));
  const rows = state.runs.map((run) => {
    const answer = answerOf(run);
    const link = el("a", {href: `${ROOT}#/experiments/${exp.eid}/runs/${run.id}`,
      target: "_blank", rel: "noopener", text: run.name});
    return el("tr", {"data-run": run.name},
      el("td", {}, link),
      el("td", {className: `status status-${run.status}`, text: run.status}),
      el("td", {text: run.progress}),
      el("td", {text: metricText(run, "loss")}),
      el("td", {text: metricText(run, "eval_loss")}),
      ...state.knobs.map((k) => el("td", {text: (run.params[k] || "").slice(0, 40)})),
      el("td", {className: `answer ${answer.cls}`, "data-answer": run.name, text: answer.text}),
      el("td", {},
        opButton(run, "Stop", "stop", !DONE.has(run.status)),
        opButton(run, "Resume", "resume", run.status === "stopped"),
        opButton(run, "Delete", "delete", run.status !== "deleted"),
        opButton(run, "Clone", "clone", true)));
  });
  document.getElementById("rows").replaceChildren(...rows);
  document.getElementById("runs").setAttribute("data-refreshes", String(state.refreshes));
}

async function sendOp(run, op) {
  state.sent[run.name] = {op, seq: run.seq};
  drawTable();
  try {
    const checked = await call(PANEL_API + "check-op", {run: run.name, op, status: run.status});
    if (checked.error) {
      state.sent[run.name] = {op, error: checked.error};
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
    state.sent[run.name] = {op, error: e.message};
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
    const query = new URLSearchParams({run_id: run.id, metric_key: "loss", max_results: "25000"});
    const reply = await call(`${API}metrics/get-history?${query}`);
    const points = (reply.metrics || []).map((m) => [m.step, m.value]).sort((a, b) => a[0] - b[0]);
    state.history[run.id] = {step: run.metrics.loss.step, points};
  }
}

function drawCurves() {
  const canvas = document.getElementById("curves");
  const ctx = canvas.getContext("2d");
  const pad = {left: 56, right: 12, top: 10, bottom: 28};
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const lines = state.runs.map((r, i) => ({run: r, i, points: (state.history[r.id] || {}).points || []}))
    .filter((l) => l.points.length);
  const all = lines.flatMap((l) => l.points);
  const legend = document.getElementById("legend");
  if (!all.length) { legend.replaceChildren(el("span", {text: "no training loss logged yet"})); return; }
  const xMax = Math.max(1, ...all.map((p) => p[0]));
  let yMin = Math.min(...all.map((p) => p[1])), yMax = Math.max(...all.map((p) => p[1]));
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
    ctx.strokeStyle = COLOURS[line.i % COLOURS.length];
    ctx.setLineDash(line.i < COLOURS.length ? [] : [6, 3]);
    ctx.lineWidth = 1.6;
    ctx.beginPath();
    line.points.forEach(([s, v], k) => (k ? ctx.lineTo(x(s), y(v)) : ctx.moveTo(x(s), y(v))));
    ctx.stroke();
  }
  ctx.setLineDash([]);
  legend.replaceChildren(...lines.map((l) => el("span", {},
    el("i", {style: `background:${COLOURS[l.i % COLOURS.length]}`}), l.run.name)));
}

async function refresh() {
  try {
    await loadExperiments();
    const exp = state.current;
    if (!exp) {
      message("No trl-rapidfire experiment in this store yet: train one with report_to=\"mlflow\".");
      return;
    }
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
  } catch (e) {
    message(`refresh failed: ${e.message}`);
  }
}

async function loop() {
  await refresh();
  setTimeout(loop, REFRESH_MS);
}

document.getElementById("experiment").addEventListener("change", (event) => {
  location.hash = event.target.value;
});
window.addEventListener("hashchange", () => { state.history = {}; refresh(); });
document.getElementById("clone-send").addEventListener("click", sendClone);
document.getElementById("clone-cancel").addEventListener("click", () => {
  document.getElementById("clone-form").hidden = true;
  state.cloneOf = null;
});
loop();

"use strict";
// The trl-rapidfire control panel (served by the MLflow app plugin, trl_rapidfire/client/
// panel_app.py): its state, its refresh and its ops. The table, the curves, the clone form,
// the "why a config wins" view and the ranking (the metric the runs are ranked by, the
// table's order) are panel_table.js, panel_curves.js, panel_clone.js, panel_why.js and
// panel_rank.js (loaded before this one).
//
// A refresh reads the plugin's lean route (/rapidfire/api/runs: only the fields the table and
// the curves show, and from the second refresh on only the runs that moved and their new loss
// points); the experiments menu comes from MLflow's REST API. A button sets the run's
// `rapidfire.op` tag through MLflow's own runs/set-tag, exactly what a person editing the tag
// in MLflow's UI does; the experiment applies it at the run's next chunk boundary and answers
// in `rapidfire.op.result`, which the row then shows. Text read from the store is only ever
// put into the page as text (textContent), never as markup.

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
// The saved view of MLflow's runs table that "Open in MLflow" opens (client/mlflow_view.py).
const VIEW_TAG = "mlflow.sharedViewState.trl-rapidfire";
const HEARTBEAT_STALE_S = 180;  // as trl_rapidfire.tracking.tags.HEARTBEAT_STALE

const state = {
  experiments: [], current: null, runs: [], knobs: [], sent: {}, history: {}, loaded: false,
  refreshes: 0, cloneOf: null, cloneFields: [], pinned: new Set(), hot: null, filter: "",
  hiddenStatuses: new Set(), topK: 10, bytes: 0,
  // The experiment's ranking metric, the one picked in the selector (null: the experiment's)
  // and the column the table is sorted by (null: best first by the metric).
  ranking: null, metric: null, sort: null,
};
window.rfPanel = state;  // what a test (or a curious person) can read

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") node.textContent = v;
    else if (k === "className") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "checked") node.checked = Boolean(v);
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
  state.bytes += (init.body || "").length + text.length;  // over the wire, both ways
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

function asMap(list) {
  const map = {};
  for (const item of list || []) map[item.key] = item.value;
  return map;
}

function runOrder(name) {
  const m = /(\d+)$/.exec(name || "");
  return m ? Number(m[1]) : Number.MAX_SAFE_INTEGER;
}

// A trainer kind's own metrics (a reward model's accuracy, a policy's reward, a preference
// margin: reports/kind_metrics.py), eval form first: one of them gets a column.
const KIND_METRICS = ["eval_accuracy", "accuracy", "eval_reward", "reward",
  "eval_rewards/margins", "rewards/margins"];

// The kind's metric the table shows: the first of KIND_METRICS some run logged, or null.
function kindMetric(runs) {
  return KIND_METRICS.find((k) => runs.some((run) => run.metrics[k])) || null;
}

// A run as the page holds it, from a row of the lean route (the params come with a run's
// first row only, so a later row keeps the ones held).
function toRun(row, held) {
  const tags = row.tags || {};
  let knobNames = null;  // the rapidfire.knobs tag: a JSON list of names (text from outside)
  try { knobNames = JSON.parse(tags[TAG.knobs] || "null"); } catch (e) { knobNames = null; }
  const metric = (m) => (m ? {value: m[0], step: m[1]} : undefined);
  const order = runOrder(row.name);
  return {
    // `shown`: the status as every view shows it (the server says "interrupted" for a run
    // in the rotation of an experiment whose process is gone).
    id: row.id, v: row.v, name: row.name, status: row.shown || tags[TAG.status] || "-",
    progress: tags[TAG.progress] || "",
    // A row's metrics are its [value, step] pairs: the losses, a kind's own, the ranking's.
    metrics: Object.fromEntries(Object.entries(row).filter(([, v]) => Array.isArray(v))
      .map(([k, v]) => [k, metric(v)])),
    tags,
    params: row.params || (held ? held.params : {}),
    seq: parseInt(tags[TAG.seq] || "0", 10) || 0, pending: tags[TAG.op], result: tags[TAG.result],
    tagged: Array.isArray(knobNames) && knobNames.every((n) => typeof n === "string"),
    order, index: order === Number.MAX_SAFE_INTEGER ? 0 : order,
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
  const views = Object.fromEntries(found.map((e) => [e.experiment_id, asMap(e.tags)[VIEW_TAG]]));
  const parents = await searchRuns(Object.keys(names), `tags.\`${TAG.role}\` = 'experiment'`);
  state.experiments = parents.map((p) => ({
    eid: p.info.experiment_id, name: names[p.info.experiment_id] || p.info.experiment_id,
    rfid: asMap(p.data.tags)[TAG.experiment] || "", state: experimentState(p),
    start: p.info.start_time || 0, view: views[p.info.experiment_id],
  })).filter((e) => /^[0-9a-f]{8,64}$/.test(e.rfid)).sort((a, b) => b.start - a.start);
  const [, eid, rfid] = /^#\/([^/]+)(?:\/([0-9a-f]+))?/.exec(location.hash) || [];
  const inStore = state.experiments.filter((e) => !eid || e.eid === eid);
  const before = state.current;
  state.current = inStore.find((e) => rfid && e.rfid === rfid)
    || inStore.find((e) => before && e.rfid === before.rfid)
    || inStore.find((e) => e.state === "training") || inStore[0] || null;
  if (!before || !state.current || before.rfid !== state.current.rfid) forgetRuns();
  const select = document.getElementById("experiment");
  select.replaceChildren(...state.experiments.map((e) => el("option", {
    value: `#/${e.eid}/${e.rfid}`, selected: e === state.current,
    text: `${e.name} (${e.rfid.slice(0, 8)}, ${e.state})`})));
}

function forgetRuns() {
  state.runs = []; state.history = {}; state.sent = {}; state.loaded = false;
  state.ranking = null; state.metric = null; state.sort = null;
  state.pinned.clear(); state.hot = null; state.why = null; parallelLines.clear();
}

// What the page holds, as the lean route reads it: per run, the first 10 digits of its id,
// its row's version and the step of its last loss point (none: nothing after the version).
function heldText() {
  return state.runs.map((r) => {
    const history = state.history[r.id];
    return r.id.slice(0, 10) + r.v + (history && history.step >= 0 ? history.step.toString(16) : "");
  }).join(",");
}

// One read of the lean route, merged into what the page holds.
async function loadRuns(exp) {
  const body = {experiment: exp.eid, rfid: exp.rfid};
  if (state.loaded) body.held = heldText();
  const reply = await call(`${PANEL_API}runs`, body);
  if (reply.state) {  // the server's word (it sees this machine's processes, as the CLI)
    exp.state = reply.state;
    document.getElementById("state").textContent = exp.state;
  }
  const held = reply.full ? new Map() : new Map(state.runs.map((r) => [r.id, r]));
  if (reply.full) state.history = {};
  const gone = new Set(reply.gone || []);
  for (const id of [...held.keys()]) {
    if (gone.has(id.slice(0, 10))) { held.delete(id); delete state.history[id]; }
  }
  for (const row of reply.runs || []) held.set(row.id, toRun(row, held.get(row.id)));
  for (const [id, points] of Object.entries(reply.points || {})) {
    const history = state.history[id] || (state.history[id] = {step: -1, points: []});
    history.points.push(...points);
    history.step = points[points.length - 1][0];
  }
  state.runs = [...held.values()].sort((a, b) => a.order - b.order || a.name.localeCompare(b.name));
  state.ranking = experimentRanking(state.runs);
  state.loaded = true;
}

// The saved view "Open in MLflow" opens (runs flat, best first by the ranking metric, the
// knobs first), set on the experiment shown where it is missing or out of date: the server
// computes it (it only reads), the page sets it through MLflow's REST API as MLflow's own UI
// saves a view. Once per experiment and number of runs.
async function ensureView(exp) {
  const mark = `${exp.eid}/${exp.rfid}/${state.runs.length}`;
  if (!state.runs.length || state.viewChecked === mark) return;
  state.viewChecked = mark;
  try {
    const query = new URLSearchParams({experiment: exp.eid, rfid: exp.rfid});
    const view = await call(`${PANEL_API}view?${query}`);
    let held = null;
    try { held = JSON.parse(exp.view || "null"); } catch (e) { held = null; }
    if (held && held.state === view.state) return;
    await call(API + "experiments/set-experiment-tag",
      {experiment_id: exp.eid, key: view.key, value: view.value});
    state.viewSet = exp.eid;
  } catch (e) {
    // A convenience: the panel works without it (a store that refuses the tag, say).
    state.viewError = e.message;
  }
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

async function refresh() {
  const started = performance.now();
  const bytes = state.bytes;
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
    await loadRuns(exp);
    ensureView(exp);
    state.knobs = knobColumns(state.runs);
    state.refreshes += 1;
    redraw();
    refreshWhy();
    // What a refresh costs in this browser (its calls, the table and the curves) and what
    // came over the wire, for a look or a benchmark (benchmarks/panel_refresh.py).
    state.refreshMs = performance.now() - started;
    state.refreshBytes = state.bytes - bytes;
  } catch (e) {
    message(`refresh failed: ${e.message}`, true);
  }
}

// Every 2 s after the last refresh ended, or twice as long as it took, so that an open page
// keeps the tracking server busy a third of the time at most.
async function loop() {
  await refresh();
  setTimeout(loop, Math.max(REFRESH_MS, 2 * (state.refreshMs || 0)));
}

document.getElementById("experiment").addEventListener("change", (event) => {
  location.hash = event.target.value;
});
window.addEventListener("hashchange", () => { forgetRuns(); state.current = null; refresh(); });
window.addEventListener("resize", () => { if (state.runs.length) { drawCurves(); drawWhy(); } });
setUpFilters();
setUpRanking();
setUpClone();
setUpWhy();
loop();

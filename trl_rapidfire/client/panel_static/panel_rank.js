"use strict";
// The control panel's ranking (loaded before panel.js, which owns `state`): the one metric the
// runs are ranked by, the experiment's (recorded by the trainer in each run's
// `rapidfire.ranking` tag: the policy's metric, else metric_for_best_model, else eval_loss or
// loss; trl_rapidfire/reports/ranking.py), or another the person picks in the selector. By it
// the table lists the runs best first (until a column's header is clicked: then by that
// column), and the curves and the "why" view colour the top k.

const RANKING_TAG = "rapidfire.ranking";

function metricKeys(key) {
  return key.startsWith("eval_") ? [key] : [key, `eval_${key}`];
}

// A metric as the page ranks by it: its key, which way is better, the keys that hold it.
function rankingOf(key, mode, why) {
  const better = mode === "max" ? "higher" : "lower";
  return {key, mode, keys: metricKeys(key),
    text: `${key} (${better} is better${why ? `; ${why}` : ""})`};
}

// A run's ranking tag (text from outside: only a short object of the right shape is read).
function parseRanking(text) {
  if (typeof text !== "string" || text.length > 1000) return null;
  let doc;
  try { doc = JSON.parse(text); } catch (e) { return null; }
  if (!doc || typeof doc.metric !== "string" || !/^[A-Za-z0-9_./-]{1,120}$/.test(doc.metric)
      || !["min", "max"].includes(doc.mode)) return null;
  const by = typeof doc.by === "string" ? doc.by.slice(0, 80) : "";
  const why = {policy: `${by || "the policy"}'s metric`,
    metric_for_best_model: "metric_for_best_model",
    search: `${by || "the search"}'s objective`}[doc.source] || "";
  return rankingOf(doc.metric, doc.mode, why);
}

// The experiment's ranking: the tag most of its runs carry (a clone may carry none); runs
// that recorded none (a store from before it) are ranked by eval_loss when every run that
// logged anything logged it, else by the training loss.
function experimentRanking(runs) {
  const counts = new Map();
  for (const run of runs) {
    const text = run.tags[RANKING_TAG];
    if (text) counts.set(text, (counts.get(text) || 0) + 1);
  }
  for (const [text] of [...counts].sort((a, b) => b[1] - a[1])) {
    const ranking = parseRanking(text);
    if (ranking) return ranking;
  }
  const logged = runs.filter((r) => Object.keys(r.metrics).length);
  const evaluated = logged.length && logged.every((r) => rankValue(r, rankingOf("eval_loss", "min")) !== null);
  return rankingOf(evaluated ? "eval_loss" : "loss", "min");
}

// The metric the page ranks by now: the one picked in the selector, else the experiment's.
function rankMetric() {
  const ranking = state.ranking || rankingOf("loss", "min");
  if (!state.metric || ranking.keys.includes(state.metric)) return ranking;
  return rankingOf(state.metric, state.metric.endsWith("loss") ? "min" : "max", "picked here");
}

function rankValue(run, metric) {
  for (const key of metric.keys) {
    const m = run.metrics[key];
    if (m && m.value !== null && Number.isFinite(m.value)) return m.value;
  }
  return null;
}

// The logged key a table column shows the metric under (`accuracy` may be `eval_accuracy`).
function shownKey(metric, runs) {
  return metric.keys.find((k) => runs.some((r) => r.metrics[k])) || metric.key;
}

// Runs best first by `metric`; runs without a value last; ties and the rest in run order.
function bestFirst(runs, metric) {
  const sign = metric.mode === "max" ? -1 : 1;
  const keyed = runs.map((run) => [rankValue(run, metric), run]);
  keyed.sort(([a, x], [b, y]) => (a === null) - (b === null) || (a === null ? 0 : sign * (a - b))
    || x.order - y.order);
  return keyed.map(([, run]) => run);
}

// What a clicked column sorts by: a number where the column's values are numbers (a knob
// `0.001`, a progress `chunk 3/8` by its fraction), else its text.
function columnValue(run, column) {
  if (column === "run") return run.order;
  if (column === "status") return shownStatus(run);
  if (column === "progress") return progressFraction(run.progress);
  if (column === "answer") return answerOf(run).text;
  if (column.startsWith("metric:")) {
    const m = run.metrics[column.slice(7)];
    return m && m.value !== null ? m.value : null;
  }
  const text = run.params[column.slice(5)];
  if (text === undefined) return null;
  return text.trim() !== "" && Number.isFinite(Number(text)) ? Number(text) : text;
}

function progressFraction(text) {
  const m = /(\d+)\/(\d+)/.exec(text || "");
  return m && Number(m[2]) > 0 ? Number(m[1]) / Number(m[2]) : null;
}

// The table's rows in order: best first by the metric, or by the column clicked.
function sortedRuns(runs) {
  if (!state.sort) return bestFirst(runs, rankMetric());
  const {column, dir} = state.sort;
  const keyed = runs.map((run) => [columnValue(run, column), run]);
  keyed.sort(([a, x], [b, y]) => {
    if ((a === null) !== (b === null)) return a === null ? 1 : -1;  // empty cells last
    if (a === null || a === b) return x.order - y.order;
    const less = typeof a === "number" && typeof b === "number" ? a < b : String(a) < String(b);
    return (less ? -1 : 1) * dir;
  });
  return keyed.map(([, run]) => run);
}

// A header click: sort by that column (a metric best first, anything else ascending); a
// second click turns the order round; a third goes back to the ranking.
function sortBy(column) {
  const metric = column.startsWith("metric:") ? column.slice(7) : null;
  const ranked = rankMetric();
  let first = 1;
  if (metric && ranked.keys.includes(metric)) first = ranked.mode === "max" ? -1 : 1;
  else if (metric) first = metric.endsWith("loss") ? 1 : -1;
  if (!state.sort || state.sort.column !== column) state.sort = {column, dir: first};
  else if (state.sort.dir === first) state.sort = {column, dir: -first};
  else state.sort = null;
  drawTable();
}

// The selector: the experiment's metric first, then every metric a row holds.
function drawMetricSelector() {
  const select = document.getElementById("metric");
  const ranking = state.ranking || rankingOf("loss", "min");
  const keys = [...new Set([ranking.key, ...state.runs.flatMap((r) => Object.keys(r.metrics))])];
  const chosen = rankMetric().key;
  if (select.dataset.keys !== keys.join(",") || select.value !== chosen) {
    select.dataset.keys = keys.join(",");
    select.replaceChildren(...keys.map((k) => el("option", {value: k, selected: k === chosen,
      text: k === ranking.key ? `${k} (the experiment's)` : k})));
  }
  const metric = rankMetric();
  select.title = `Runs ranked by ${metric.text}`;
  document.getElementById("rank-name").textContent = metric.key;
}

function setUpRanking() {
  document.getElementById("metric").addEventListener("change", (event) => {
    const key = event.target.value;
    state.metric = state.ranking && key === state.ranking.key ? null : key;
    state.sort = null;  // the table goes back to best first, by the metric picked
    state.why = null;
    redraw();
    refreshWhy();
  });
}

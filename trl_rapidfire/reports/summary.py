"""The report's markdown summary: where the metrics came from, the runs ranked by the
objective, an adaptive search's log, why a config wins (knob importance, the Pareto front of
two objectives) and the figures linked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..storage.csv_logs import printable
from .experiment_data import ExperimentData, OpEvent, RunData
from .report import format_value, pareto_front, search_rows
from .why_wins_plots import WhyWins

__all__ = ["LEARNING_CURVES", "PARETO", "SCHEDULE", "SUMMARY", "WHY_WINS", "rank_runs",
           "summary_markdown", "why_wins_lines"]

LEARNING_CURVES = "learning_curves.png"
SCHEDULE = "schedule.png"
SUMMARY = "summary.md"
WHY_WINS = "why_wins.png"
PARETO = "pareto.png"
# A knob's name in the importance table at most (names are the user's, from the state file).
_NAME_CHARS = 80


def rank_runs(data: ExperimentData, key: str | None, mode: str | None = None) -> list[RunData]:
    """The runs best first by their latest ``key``; runs without it last, in run order.

    ``mode``: ``min`` or ``max``; default ``min`` for names ending in ``loss``, else ``max``.
    """
    runs = list(data.runs.values())
    if key is None:
        return runs
    mode = mode or ("min" if key.endswith("loss") else "max")
    sign = 1.0 if mode == "min" else -1.0
    scored = [r for r in runs if r.latest(key) is not None]
    unscored = [r for r in runs if r.latest(key) is None]
    # sorted() is stable: ties keep run order.
    return sorted(scored, key=lambda run: sign * (run.latest(key) or 0.0)) + unscored


def _cell(text: Any) -> str:
    return str(text).replace("\n", " ").replace("|", "\\|")


def summary_markdown(
    data: ExperimentData, metric: str | None, requested: str = "eval_loss",
    images: Sequence[str] = (LEARNING_CURVES, SCHEDULE),
    why: WhyWins | None = None,
    mode: str | None = None,
) -> str:
    """The markdown summary: where the metrics came from, a table of the runs ranked by
    ``metric`` (a logged key; ``requested`` is what was asked for, named when no run logged
    it) with status, steps, the metric, the number of ops on each run and the last op's result,
    then, with ``why``, each knob's importance for the metric (and the Pareto front of two
    metrics), then the ``images`` linked. ``mode``: ``min`` or ``max`` (the experiment's
    ranking metric's; default by the name, lower is better for a loss)."""
    mode = mode or (("min" if metric.endswith("loss") else "max") if metric else None)
    ranked = rank_runs(data, metric, mode)
    ops_of: dict[str, list[OpEvent]] = {}
    for op in data.ops:
        ops_of.setdefault(op.run, []).append(op)
    lines = [f"# Experiment report: {_cell(data.name)}", "",
             f"- output_dir: `{data.output_dir}`",
             f"- metrics from: {_cell(data.source_detail)}"]
    if metric:
        lines.append(f"- ranked by: `{metric}` (latest value, {mode} is best)")
    else:
        lines.append(f"- ranked by: no run logged `{requested}`; runs in run order")
    if data.schedule:
        span = max(c.end_time for c in data.schedule) - min(c.start_time for c in data.schedule)
        workers = len({c.worker for c in data.schedule})
        lines.append(f"- {len(data.runs)} runs, {len(data.schedule)} chunks on {workers} "
                     f"worker(s) in {span:.1f} s, {len(data.ops)} op(s)")
    lines += ["", f"| rank | run | status | steps | {metric or requested} | ops | last op | "
              "knobs |", "| ---: | --- | --- | ---: | ---: | ---: | --- | --- |"]
    rank = 0
    for run in ranked:
        value = run.latest(metric) if metric else None
        if value is not None:
            rank += 1
        mine = ops_of.get(run.name, [])
        knobs = ", ".join(f"{k}={format_value(v)}" for k, v in run.knobs.items())
        lines.append("| " + " | ".join(_cell(x) for x in (
            rank if value is not None else "-", run.name, run.status or "-",
            "-" if run.steps is None else run.steps, format_value(value), len(mine),
            mine[-1].result if mine else "", knobs)) + " |")
    rows = search_rows(data.search)
    if rows:
        lines += ["", "## Search", "", "What the sampler proposed, when (after its first "
                  "proposal), and what it was told (`search.csv`).", "",
                  "| trial | run | proposed | params | told |", "| ---: | --- | --- | --- | --- |"]
        lines += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in rows]
        front = pareto_front(data.search)
        if front is not None:
            lines += ["", f"Pareto front (no run better in every objective): "
                      f"{', '.join(front) or '-'}"]
    if why is not None:
        lines += why_wins_lines(why)
    for image in images:
        title = Path(image).stem.replace("_", " ").capitalize()
        lines += ["", f"## {title}", "", f"![{title}]({image})"]
    return "\n".join(lines) + "\n"


def why_wins_lines(why: WhyWins) -> list[str]:
    """The summary's "Why a config wins" section: each knob's share of the importance for the
    objective, how it was measured, and the runs on the Pareto front of two objectives."""
    lines = ["", "## Why a config wins", "",
             f"Each knob's share of the importance for `{why.key}` over the {len(why.runs)} "
             f"runs that logged it ({_cell(why.method)}); knobs equal in every run are left "
             "out.", ""]
    if why.importance:
        lines += ["| knob | importance |", "| --- | ---: |"]
        lines += [f"| {_cell(printable(k)[:_NAME_CHARS])} | {v:.1%} |"
                  for k, v in why.importance]
    else:
        lines.append("No knob differs between the runs that logged it.")
    if why.second:
        lines += ["", f"Pareto front of `{why.key}` ({why.mode} is best) and `{why.second}` "
                  f"({why.second_mode} is best), no run better in both: "
                  f"{', '.join(why.front) or '-'}"]
    return lines

"""``trl-rapidfire status``: an experiment's runs as a table in the terminal, read from MLflow
(its runs' tags and latest metrics) or, for an experiment MLflow does not track, from its
folder. Each knob that differs has a column of its own; the trainer kind's own metric (a
reward model's accuracy, a policy's reward) one beside the losses."""

from __future__ import annotations

from typing import Any

__all__ = ["OP_CHARS", "show_status"]

OP_CHARS = 60  # an op's text is cut to this many characters, unless --full


def _op_text(text: str, full: bool) -> str:
    from ..reports.display import clip

    return text if full else clip(text, OP_CHARS, keep="head")


def _status_of_folder(output_dir: str, full: bool = False) -> int:
    from ..control.folder_control import Inbox, alive, folder_runs
    from ..reports.display import table
    from ..reports.experiment_data import read_ops, read_search_log
    from ..shared_state.runs import shown_status
    from ..storage.layout import Layout
    from .experiments import knob_columns

    layout = Layout(output_dir)
    last = {event.run: event.result for event in read_ops(layout.ops_log)}
    trials = {e.run: e.trial for e in read_search_log(layout.search_log) if e.trial}
    runs = folder_runs(output_dir)
    knobs = knob_columns([r.knobs for r in runs], full=full)
    who = alive(layout)
    rows = [[r.name, shown_status(r.status, training=who is not None), r.global_step,
             r.chunks_done, *cells, _op_text(last.get(r.name, ""), full)]
            for r, cells in zip(runs, knobs.cells)]
    headers = ["run", "status", "steps", "chunks", *knobs.names, "last op"]
    if trials:  # an adaptive search: which trial of its study each run is
        headers.insert(1, "trial")
        for r, row in zip(runs, rows):
            row.insert(1, trials.get(r.name, "-"))
    state = "training" if who is not None else "not training"
    where = f" (pid {who.pid} on {who.host})" if who is not None else ""
    waiting = Inbox(layout).waiting() if who else 0
    print(f"experiment in {output_dir} (not tracked in MLflow, {state}{where})")
    print(table(headers, rows))
    _print_hidden(knobs.hidden)
    _print_front(output_dir)
    if waiting:
        print(f"{waiting} op(s) waiting for the next chunk boundary")
    return 0


def _print_hidden(hidden: int) -> None:
    if hidden:
        print(f"{hidden} more knob(s) differ between the runs (--full shows every knob)")


def _print_front(output_dir: str | None) -> None:
    """A multi-objective search's Pareto front, from the experiment's ``search.csv``."""
    if output_dir is None:
        return
    from ..reports.experiment_data import read_search_log
    from ..reports.report import pareto_front
    from ..storage.layout import Layout

    front = pareto_front(read_search_log(Layout(output_dir).search_log))
    if front is not None:
        print(f"Pareto front: {' '.join(front) or '-'} (no run better in every objective)")


def show_status(output_dir: str | None, *, full: bool, untracked: bool,
                where: dict[str, Any]) -> int:
    """Print the runs of the experiment ``where`` names (tracked in MLflow), or of the
    untracked one in ``output_dir``; ``full``: op texts whole and every knob."""
    if untracked:
        assert output_dir is not None  # only a named folder is untracked
        return _status_of_folder(output_dir, full)
    from ..reports.display import table
    from ..reports.kind_metrics import kind_columns
    from ..reports.report import format_value
    from ..shared_state.runs import shown_status
    from .experiments import knob_columns, tracked_knobs
    from .send import experiment_runs, find_experiment

    exp = find_experiment(**where)
    rows = []
    runs = experiment_runs(exp)
    # The knobs are among each run's params (its whole config): those that differ.
    knobs = knob_columns(*tracked_knobs([run.params for run in runs],
                                        [run.tags for run in runs]), full=full)
    # An adaptive search's runs: which trial each is, and when the sampler proposed it.
    proposed = any("rapidfire.trial" in run.tags for run in runs)
    kind = kind_columns(run.metrics for run in runs)  # a reward model's accuracy, ...
    for run, cells in zip(runs, knobs.cells):
        tags, metrics = run.tags, run.metrics
        # A run in the rotation of an experiment not training (Ctrl-C, a kill): interrupted.
        rows.append([tags.get("rapidfire.run"),
                     shown_status(tags.get("rapidfire.status"), training=exp.training),
                     tags.get("rapidfire.progress", "-"), format_value(metrics.get("loss")),
                     format_value(metrics.get("eval_loss")),
                     *(format_value(metrics.get(key)) for key in kind.values()), *cells,
                     _op_text(tags.get("rapidfire.op", ""), full),
                     _op_text(tags.get("rapidfire.op.result", ""), full)])
        if proposed:
            when = tags.get("rapidfire.proposed_at", "")
            rows[-1][2:2] = [tags.get("rapidfire.trial", "-"),
                             when.replace("T", " ")[:19] if when else "-"]
    print(f"experiment {exp.describe()} in {exp.uri}")
    headers = ["run", "status", "progress", "loss", "eval_loss", *kind, *knobs.names,
               "pending op", "last op"]
    if proposed:
        headers[2:2] = ["trial", "proposed"]
    print(table(headers, rows))
    _print_hidden(knobs.hidden)
    _print_front(output_dir)
    return 0

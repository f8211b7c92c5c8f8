"""trl-rapidfire report: PNG plots and a markdown summary, drawn from a real tiny experiment
tracked in MLflow, from the Trainer's files on disk without MLflow, and from hand-written
experiment files for the rules a tiny run does not reach (policies, clones, other metrics)."""

from __future__ import annotations

import csv
import io
import json
import struct
from pathlib import Path

import pytest
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.client.cli import main
from trl_rapidfire.reports.plot_legend import run_labels, short_values
from trl_rapidfire.reports.plots import (
    ExperimentData,
    OpEvent,
    RunData,
    learning_curves_figure,
    load_experiment,
    op_markers,
    plot_learning_curves,
    schedule_figure,
    write_report,
)
from trl_rapidfire.reports.report import format_value
from trl_rapidfire.storage.schedule import ChunkRecord, write_schedule_csv
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

LRS = [1e-3, 3e-3, 1e-2]


class _StopRun1(TrainerCallback):
    """A person stops run-1 during its first chunk; it applies at that chunk's end."""

    trainer = None

    def on_step_end(self, args, state, control, **kwargs):
        if args.learning_rate == LRS[1] and state.global_step == 1:
            _StopRun1.trainer.stop("run-1")


def _experiment(out: Path, lrs, report_to: str, max_steps: int, num_chunks: int):
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(
            output_dir=str(out), learning_rate=List(list(lrs)), num_chunks=num_chunks,
            max_steps=max_steps, eval_strategy="chunk", per_device_train_batch_size=8,
            per_device_eval_batch_size=8, logging_steps=1,
            **{**cpu_training_kwargs(), "report_to": report_to},
        ),
        train_dataset=make_sft_dataset(48),
        eval_dataset=make_sft_dataset(8, seed=1),
        peft_config=tiny_lora_config(r=4),
        callbacks=[_StopRun1()],
    )
    _StopRun1.trainer = rf
    rf.train()
    return rf


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """3 learning rates, 3 chunks, evaluated at every chunk end, tracked in a sqlite store;
    run-1 stopped by a person after its first chunk."""
    root = tmp_path_factory.mktemp("tracked")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        rf = _experiment(root / "exp", LRS, "mlflow", max_steps=6, num_chunks=3)
    return rf, root / "exp", uri


def _png_size(path: Path) -> tuple[int, int]:
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return struct.unpack(">II", head[16:24])


def _table(summary: Path) -> list[list[str]]:
    """The rows of the summary's first markdown table, the runs (below its header), as
    cells; the tables after it (the importance of each knob) are not runs."""
    text = summary.read_text()
    first = text[text.index("\n| "):].split("\n\n")[0]
    lines = [line for line in first.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def _check_pngs(files) -> None:
    for path in (files.learning_curves, files.schedule):
        width, height = _png_size(path)
        assert 400 <= width <= 4000 and 300 <= height <= 3000, (path, width, height)


def test_report_from_mlflow_ranks_the_runs_and_marks_the_stop(tracked, tmp_path, monkeypatch):
    rf, out, uri = tracked
    runs = {r.name: r for r in rf.runs}
    assert runs["run-1"].status == "stopped" and runs["run-1"].global_step == 2
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the default store, as when it trained
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)

    files = write_report(out, tmp_path / "report")
    assert all(p.is_file() and p.parent == tmp_path / "report" for p in files.paths)
    _check_pngs(files)
    assert files.source == "mlflow" and "MLflow" in files.source_detail
    assert files.metric == "eval_loss"
    assert files.curves == {"loss": 3, "eval_loss": 3}  # one curve per run in each panel
    stops = [m for m in files.markers if m.kind == "stop"]
    assert [(m.run, m.step, m.by_policy) for m in stops] == [("run-1", 2, False)]

    # MLflow's latest eval_loss of each run is the trainer's, and the ranking follows it.
    want = sorted(rf.runs, key=lambda r: r.metrics["eval_loss"])
    assert list(files.ranking) == [r.name for r in want]
    rows = _table(files.summary)
    assert [row[1] for row in rows] == [r.name for r in want]
    for rank, (row, run) in enumerate(zip(rows, want), start=1):
        assert row[0] == str(rank) and row[2] == run.status.value
        assert row[3] == str(run.global_step)
        assert row[4] == format_value(run.metrics["eval_loss"])
    stopped = next(row for row in rows if row[1] == "run-1")
    assert stopped[5] == "1" and stopped[6] == "ok: stopped at step 2"
    text = files.summary.read_text()
    assert "![Learning curves](learning_curves.png)" in text
    assert "![Schedule](schedule.png)" in text and "metrics from: MLflow" in text


def test_cli_report_by_training_loss_and_a_bad_folder(tracked, tmp_path, capsys):
    rf, out, uri = tracked
    argv = ["report", str(out), "--out", str(tmp_path / "r"), "--uri", uri, "--metric", "loss"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("metrics from MLflow")
    for name in ("learning_curves.png", "schedule.png", "summary.md"):
        assert str(tmp_path / "r" / name) in printed and (tmp_path / "r" / name).is_file()
    assert _png_size(tmp_path / "r" / "schedule.png")[0] >= 400
    want = sorted(rf.runs, key=lambda r: r.metrics["loss"])
    assert [row[1] for row in _table(tmp_path / "r" / "summary.md")] == [r.name for r in want]

    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r2")]) == 2
    assert "holds no trl-rapidfire experiment" in capsys.readouterr().err


def test_report_without_mlflow_reads_the_trainer_states_on_disk(
    tracked, tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./mlflow.db here
    rf = _experiment(tmp_path / "plain", LRS[:2], "none", max_steps=4, num_chunks=2)
    runs = {r.name: r for r in rf.runs}
    assert runs["run-1"].status == "stopped"
    # A stopped run has no final folder: its history is its latest boundary checkpoint's.
    assert not (tmp_path / "plain/runs/run-1/final").exists()

    files = write_report(tmp_path / "plain", tmp_path / "report")
    _check_pngs(files)
    assert files.source == "disk" and "trainer_state.json" in files.source_detail
    assert files.curves == {"loss": 2, "eval_loss": 2}
    assert [(m.run, m.kind, m.step) for m in files.markers] == [("run-1", "stop", 2)]
    data = load_experiment(tmp_path / "plain")
    for name in runs:
        logged = [e["loss"] for e in rf.run_trainer(name).state.log_history if "loss" in e]
        assert [v for _, v in data.runs[name].history["loss"]] == logged
    want = sorted(rf.runs, key=lambda r: r.metrics["eval_loss"])
    assert list(files.ranking) == [r.name for r in want]
    assert "metrics from: Trainer log histories on disk" in files.summary.read_text()

    # A store that exists but never tracked this experiment: the same fallback.
    again = write_report(tmp_path / "plain", tmp_path / "report2", tracking_uri=tracked[2])
    assert again.source == "disk" and "never tracked" in again.source_detail


def _state(path: Path, log_history) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "trainer_state.json").write_text(json.dumps({"log_history": log_history}))


def test_policy_ops_clones_and_a_higher_is_better_metric_from_written_files(tmp_path):
    # An experiment's files written by hand: a policy stops run-1 with its reason, a person
    # warm-clones run-0 (its result names no step), an op is rejected, run-3 never evaluated.
    out = tmp_path / "exp"
    t = 1000.0
    write_schedule_csv([
        ChunkRecord("run-0", 0, 0, 0, 0, t, t + 1, 0, 4),
        ChunkRecord("run-1", 0, 0, 0, 1, t, t + 1.2, 0, 4),
        ChunkRecord("run-0", 0, 1, 1, 0, t + 1.1, t + 2, 4, 8),
        ChunkRecord("run-2", 0, 0, 0, 1, t + 1.3, t + 2.5, 0, 4),
        ChunkRecord("run-3", 0, 0, 0, 0, t + 2.6, t + 3, 0, 4),
    ], out / "schedule.csv")
    with open(out / "ops.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["time", "source", "run", "op", "result"])
        writer.writerow([t + 1.25, "policy:SuccessiveHalving", "run-1", "stop",
                         "ok: stopped at step 4 by SuccessiveHalving rung 0: eval_accuracy "
                         "0.2 not in best 1/2 of 2 | 1 better"])
        writer.writerow([t + 2.55, "python", "run-0", 'clone-warm {"learning_rate": 1e-4}',
                         "ok: created run-3 warm-started from run-0"])
        writer.writerow([t + 2.56, "tag", "run-2", "resume",
                         "error: run-2 is running; only a stopped run can be resumed"])
    (out / ".rapidfire").mkdir()
    (out / ".rapidfire" / "scheduler.json").write_text(json.dumps({"runs": {
        "run-0": {"status": "completed", "global_step": 8, "knobs": {"learning_rate": 1e-3}},
        "run-1": {"status": "stopped", "global_step": 4, "knobs": {"learning_rate": 3e-3}},
        "run-2": {"status": "running", "global_step": 4, "knobs": {"learning_rate": 1e-2}},
        "run-3": {"status": "running", "global_step": 4, "knobs": {"learning_rate": 1e-4}},
    }}))
    steps = [{"loss": 2.0 - s / 10, "step": s} for s in range(1, 9)]
    _state(out / "runs/run-0/final", steps + [{"eval_accuracy": 0.5, "step": 4},
                                              {"eval_accuracy": 0.6, "step": 8}])
    _state(out / ".rapidfire/checkpoints/run-1/checkpoint-2", steps[:2])
    _state(out / ".rapidfire/checkpoints/run-1/checkpoint-4",
           steps[:4] + [{"eval_accuracy": 0.2, "step": 4}])
    _state(out / ".rapidfire/checkpoints/run-2/checkpoint-4",
           steps[:4] + [{"eval_accuracy": 0.9, "step": 4}])
    _state(out / ".rapidfire/checkpoints/run-3/checkpoint-4", steps[:4])

    files = write_report(out, tmp_path / "report", metric="accuracy",
                         tracking_uri=f"sqlite:///{tmp_path / 'none.db'}")
    assert not (tmp_path / "none.db").exists()  # a report never creates a store
    _check_pngs(files)
    assert files.metric == "eval_accuracy" and files.source == "disk"
    assert files.curves == {"loss": 4, "eval_accuracy": 3}
    assert list(files.ranking) == ["run-2", "run-0", "run-1", "run-3"]  # max; none last
    data = load_experiment(out, metric="accuracy", tracking_uri=f"sqlite:///{tmp_path}/n.db")
    assert [(m.run, m.kind, m.step, m.by_policy) for m in op_markers(data)] == [
        ("run-1", "stop", 4, True),
        ("run-0", "clone-warm", 8, False),  # run-0's step when it was cloned
    ]
    assert data.runs["run-1"].history["loss"][-1][0] == 4  # the highest checkpoint's history
    rows = {row[1]: row for row in _table(files.summary)}
    assert rows["run-3"][0] == "-" and rows["run-3"][4] == "-"
    assert rows["run-2"][5] == "1" and rows["run-2"][6].startswith("error: run-2 is running")
    assert rows["run-1"][6].endswith("of 2 \\| 1 better")  # a pipe cannot break the table


# ----------------------------------------------------------------------------- legibility
# Figures drawn from ExperimentData built in memory: what each run's legend entry says, that
# the legends fit in the figure, that equal curves stay apart, that chunk labels fit.

_LORA = "LoraConfig(r={r}, alpha={alpha}, targets=['q_proj', 'v_proj'])"


def _data(knobs_by_run, histories=None, schedule=(), ops=()) -> ExperimentData:
    runs = {}
    for i, (name, knobs) in enumerate(knobs_by_run.items()):
        history = (histories or {}).get(name) or {
            "loss": [(s, 2.0 - s * 0.01 * (1 + i)) for s in range(1, 31)],
            "eval_loss": [(s, 2.1 - s * 0.01 * (1 + i)) for s in (10, 20, 30)]}
        runs[name] = RunData(name, "completed", 30, dict(knobs), history, "disk")
    return ExperimentData(Path("exp"), "exp", runs, list(schedule), list(ops), "disk", "d")


def _legend_texts(fig, title="runs") -> list[str]:
    legend = next(lg for lg in fig.legends if lg.get_title().get_text() == title)
    return [t.get_text() for t in legend.get_texts()]


def _curve(ax, run):
    return next(line for line in ax.get_lines() if line.get_gid() == f"curve:{run}")


def test_the_legend_names_only_the_knobs_that_differ_in_a_short_form():
    shared = {"lr_scheduler_type": "cosine", "peft_config": _LORA.format(r=8, alpha=16),
              "max_steps": 30}
    data = _data({f"run-{i}": {"learning_rate": lr, **shared}
                  for i, lr in enumerate([1e-3, 3e-3, 1e-2])})
    fig, _ = learning_curves_figure(data, "eval_loss")
    texts = _legend_texts(fig)
    assert [t.split()[0] for t in texts] == ["run-0", "run-1", "run-2"]
    # One exponent form for the whole knob, even for 1e-2 (which alone would read 0.01).
    for text, lr in zip(texts, ["1e-03", "3e-03", "1e-02"]):
        assert f"learning_rate={lr}" in text
        for equal in ("lr_scheduler_type", "cosine", "LoRA", "max_steps", "..."):
            assert equal not in text, (equal, text)

    # A LoRA config shows its rank, and its alpha only when alphas differ; a knob one run
    # lacks differs too. Equal curves of runs that differ in nothing: just the names.
    labels = run_labels([
        RunData("run-0", knobs={"peft_config": _LORA.format(r=8, alpha=16), "seed": 1}),
        RunData("run-1", knobs={"peft_config": _LORA.format(r=16, alpha=16)}),
    ])
    assert labels == {"run-0": "run-0  LoRA r=8  seed=1", "run-1": "run-1  LoRA r=16  seed=-"}
    labels = run_labels([RunData("run-0", knobs={"peft_config": _LORA.format(r=8, alpha=8)}),
                         RunData("run-1", knobs={"peft_config": _LORA.format(r=8, alpha=32)})])
    assert labels["run-1"] == "run-1  LoRA r=8 alpha=32"
    assert run_labels([RunData("run-0", knobs={"a": 1}), RunData("run-1", knobs={"a": 1})]) \
        == {"run-0": "run-0", "run-1": "run-1"}
    assert short_values([0.5, 0.25])[0] == ["0.5", "0.25"]
    assert short_values([2.5e-4, 1e-3, 3])[0] == ["2.5e-04", "1e-03", "3"]


def _inside(box, frame, slack=0.5) -> bool:
    return (box.x0 >= frame.x0 - slack and box.x1 <= frame.x1 + slack
            and box.y0 >= frame.y0 - slack and box.y1 <= frame.y1 + slack)


@pytest.mark.parametrize(("count", "metric"), [(3, "eval_loss"), (16, "eval_loss"), (16, None)])
def test_the_legends_fit_in_the_figure_beside_the_axes(count, metric, tmp_path):
    # Five knobs differ, so each label wraps onto 3 lines: with 16 runs the legend needs two
    # columns and a taller figure than the axes alone would.
    data = _data({f"run-{i}": {
        "learning_rate": [1e-3, 3e-3, 1e-2, 2.5e-4][i % 4],
        "lr_scheduler_type": ["linear", "cosine_with_restarts"][(i + i // 4) % 2],
        "peft_config": _LORA.format(r=[4, 8][(i // 2 + i // 8) % 2], alpha=16),
        "warmup_ratio": [0.0, 0.1][i % 2], "weight_decay": [0.0, 0.01][i // 2 % 2],
        "per_device_train_batch_size": 8} for i in range(count)},
        ops=[OpEvent(1.0, "policy:SuccessiveHalving", "run-1", "stop",
                     "ok: stopped at step 10"),
             OpEvent(2.0, "python", "run-2", "clone-warm {}", "ok: created run-9")])
    fig, counts = learning_curves_figure(data, metric)
    assert counts == {"loss": count, **({metric: count} if metric else {})}
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    texts = _legend_texts(fig)
    assert len(texts) == count
    assert all("lr_scheduler_type=" in t and "LoRA r=" in t for t in texts)
    assert all("per_device_train_batch_size" not in t and "..." not in t for t in texts)
    if count == 16:
        assert "run-14  learning_rate=1e-02" in texts[14]
        assert "cosine_with_restarts" in texts[14] and "LoRA r=4" in texts[14]
    axes_right = max(ax.get_tightbbox(renderer).x1 for ax in fig.axes)
    boxes = []
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        assert _inside(box, fig.bbox), (box, fig.bbox)
        assert box.x0 >= axes_right  # beside the axes, over no curve
        for text in [*legend.get_texts(), legend.get_title()]:
            assert _inside(text.get_window_extent(renderer), fig.bbox), text.get_text()
        boxes.append(box)
    runs_box, ops_box = boxes
    assert runs_box.y0 >= ops_box.y1  # the runs above the ops, not over them
    title = next(t for t in fig.texts if t.get_text().startswith("exp: learning curves"))
    assert _inside(title.get_window_extent(renderer), fig.bbox)
    assert title.get_window_extent(renderer).x1 <= runs_box.x0  # not into the legend

    # The saved image is the whole figure: as wide and tall as what was measured.
    plot_learning_curves(data, tmp_path / "curves.png", metric)
    width, height = _png_size(tmp_path / "curves.png")
    assert width >= runs_box.x1 - min(ax.get_tightbbox(renderer).x0 for ax in fig.axes)
    assert height >= runs_box.height + ops_box.height


def test_runs_with_the_same_curve_are_drawn_apart():
    same = {"loss": [(s, 2.0 - s / 100) for s in range(1, 51)],
            "eval_loss": [(s, 2.2 - s / 100) for s in (10, 20, 30, 40, 50)]}
    data = _data({"run-0": {"learning_rate": 1e-3}, "run-1": {"learning_rate": 1e-3},
                  "run-2": {"learning_rate": 3e-3}},
                 histories={"run-0": same, "run-1": same, "run-2": same})
    fig, _ = learning_curves_figure(data, "eval_loss")
    for ax in fig.axes:
        a, b = _curve(ax, "run-0"), _curve(ax, "run-1")
        assert (a.get_xydata() == b.get_xydata()).all()
        assert a.get_color() != b.get_color()
        assert (a.get_linestyle(), a.get_marker()) != (b.get_linestyle(), b.get_marker())
        assert a.get_markerfacecolor() == "none"  # hollow: a marker under another shows
    # On the dense training curve the markers of equal curves sit on different points.
    loss = fig.axes[0]
    assert _curve(loss, "run-0").get_markevery() != _curve(loss, "run-1").get_markevery()

    # No two of 20 runs share both the line style and the marker, nor does a colour repeat.
    many = _data({f"run-{i}": {"seed": i} for i in range(20)})
    fig, _ = learning_curves_figure(many, None)
    lines = [_curve(fig.axes[0], f"run-{i}") for i in range(20)]
    assert len({(line.get_linestyle(), line.get_marker()) for line in lines}) == 20
    assert len({line.get_color() for line in lines}) == 20


def test_chunk_labels_only_where_they_fit_inside_their_bars():
    # Wide chunks, a run of narrow ones with two-digit numbers, and a wide last one ending
    # at the axes' right edge; then a narrow last one whose label would stick out.
    chunks, clock = [], 0.0
    for k in range(30):
        seconds = 3.0 if k % 6 == 0 else 0.25
        chunks.append(ChunkRecord("run-0" if k % 2 else "run-1", 0, k, k, 0, clock,
                                  clock + seconds, k, k + 1))
        clock += seconds
    wide_last = ChunkRecord("run-0", 0, 30, 30, 0, clock, clock + 3.0, 30, 31)
    narrow_last = ChunkRecord("run-1", 0, 31, 123, 1, clock + 2.9, clock + 3.0, 31, 32)
    data = _data({"run-0": {}, "run-1": {}}, schedule=chunks + [wide_last, narrow_last])

    fig, bars = schedule_figure(data)
    assert bars == 32
    for saved in (False, True):
        if saved:  # the layout of the saved image is the one measured
            fig.savefig(io.BytesIO(), format="png", bbox_inches="tight")
        fig.draw_without_rendering()
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        frame = ax.get_window_extent(renderer)
        patches = {p.get_gid(): p for p in ax.patches}
        labels = {t.get_gid(): t for t in ax.texts if str(t.get_gid()).startswith("chunk-")}
        for gid, text in labels.items():
            box = text.get_window_extent(renderer)
            bar = patches[gid.replace("chunk-label:", "chunk:")].get_window_extent(renderer)
            assert box.x0 >= bar.x0 + 3 and box.x1 <= bar.x1 - 3, (gid, box, bar)
            assert box.y0 >= bar.y0 and box.y1 <= bar.y1, (gid, box, bar)
            assert _inside(box, frame) and _inside(box, fig.bbox), gid
        want = {f"chunk-label:run-{1 - k % 2}:{k}" for k in range(0, 30, 6)}
        assert set(labels) == want | {"chunk-label:run-0:30"}  # no narrow one, no 123

"""Text reports: the runs table and the chunk timeline."""

from trl_rapidfire.reports.report import chunk_timeline, format_value, results_table
from trl_rapidfire.reports.results import RunResult
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.storage.schedule import ChunkRecord
from trl_rapidfire.testing import tiny_lora_config


def _run(name, loss, **knobs):
    return RunResult(name, knobs, RunStatus.COMPLETED, 4, f"out/{name}", {"loss": loss})


def _chunk(run, number, start, end, t):
    return ChunkRecord(run, 0, number, number, 0, t, t + 0.5, start, end)


def test_results_table_marks_the_best_run_and_shows_knobs_shortly():
    runs = [_run("run-0", 1.23456, learning_rate=1e-3, peft_config=tiny_lora_config(r=4)),
            _run("run-1", 0.5, learning_rate=3e-3, peft_config=tiny_lora_config(r=8))]
    text = results_table(runs, {"loss": "loss", "eval": "eval_loss"}, best="run-1")
    lines = text.splitlines()
    assert lines[0].split()[:5] == ["run", "status", "steps", "loss", "eval"]
    assert lines[2].startswith("run-0 ") and "1.235" in lines[2] and " - " in lines[2]
    assert lines[3].startswith("run-1*") and "r=8" in lines[3] and "0.003" in lines[3]


def test_chunk_timeline_draws_who_trained_which_chunk():
    runs = [_run("run-0", 1.0), _run("run-1", 1.0)]
    schedule = [_chunk("run-0", 0, 0, 2, 0), _chunk("run-1", 0, 0, 2, 1),
                _chunk("run-1", 1, 2, 4, 2), _chunk("run-0", 1, 2, 4, 3)]
    assert chunk_timeline(runs, schedule).splitlines() == [
        "run-0  0..1  turns 1,4  (1.0 s)",
        "run-1  .01.  turns 2,3  (1.0 s)",
    ]
    assert chunk_timeline(runs, schedule, steps=True).splitlines()[0] == (
        "run-0  0..1  steps [0,2) [2,4)  (1.0 s)")


def test_format_value():
    assert format_value(None) == "-" and format_value(0.000123456) == "0.0001235"
    assert format_value([1.0, 0.5]) == "[1, 0.5]" and format_value("cosine") == "cosine"

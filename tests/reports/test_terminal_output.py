"""What a person sees in a terminal, and what a log gets: the progress view redraws itself in
place in a terminal (one bar, one runs table), prints a handful of tables where it cannot, and
fits 100 columns (the terminal is tests/terminal.py's emulator). The quickstart run in a
pseudo-terminal is checked in tests/docs/test_readme_first_hour.py, which runs it anyway."""

from __future__ import annotations

import io

from terminal import COLS, ROWS, screen

from trl_rapidfire.reports.progress import TABLE_WIDTH, ExperimentProgress, LogCadence, runs_table
from trl_rapidfire.reports.results import RunResult
from trl_rapidfire.shared_state.runs import RunStatus


def test_the_screen_emulator():
    assert screen("a\nbc\rd\n") == ["a", "dc"]
    assert screen("one\ntwo\n\x1b[2K\x1b[1A\x1b[2Kthree\n") == ["one", "three"]
    assert screen("x" * 25, cols=10) == ["x" * 10, "x" * 10, "x" * 5]
    assert screen("\x1b[31mred\x1b[0m\x1b[?25l") == ["red"]


# --------------------------------------------------------------------------- the view itself


def _runs(n: int, step: int = 0, *, done: int = 0, stopped: int = 0) -> list[RunResult]:
    """``n`` runs with long knob values (a LoRA config's description, a model path): the
    first ``done`` completed, the last ``stopped`` stopped, the others running."""
    return [
        RunResult(
            name=f"run-{i}",
            knobs={"learning_rate": 10.0 ** -(3 + i % 2), "lr_scheduler_type": "cosine",
                   "model": f"organisation/a-rather-long-model-name-{i % 3}-Instruct",
                   "peft_config": f"LoraConfig(r={8 * (i + 1)}, alpha=16, targets=['q_proj', "
                                  "'k_proj', 'v_proj', 'o_proj'])"},
            status=(RunStatus.COMPLETED if i < done else RunStatus.STOPPED if i >= n - stopped
                    else RunStatus.RUNNING),
            global_step=step, output_dir=f"out/runs/run-{i}",
            metrics={"loss": 5.0 - step / 100, "eval_loss": 5.1 - step / 100} if step else {},
            last_op=("ok: stopped at step 16 by SuccessiveHalving rung 0: eval_loss in the "
                     "worst half") if i >= n - stopped else None,
        )
        for i in range(n)
    ]


def test_the_runs_table_fits_100_columns_with_long_knob_values():
    for runs in (_runs(8, 12), _runs(8, 12, done=3, stopped=2), _runs(1, 3)):
        text = runs_table(runs)
        assert max(len(line) for line in text.splitlines()) <= TABLE_WIDTH, text
        rows = [line for line in text.splitlines() if line.startswith("run-")]
        assert len(rows) == len(runs)
        assert all(" lr=" in row for row in rows)  # abbreviated, still readable
    # Every run's values stay distinct where they differ (cut in the middle, not the end).
    rows = runs_table(_runs(6, 12)).splitlines()[2:]
    assert len({row.split("peft=")[1] for row in rows}) == 6
    # The full table (trl-rapidfire status) keeps everything.
    full = runs_table(_runs(2, 12), width=None)
    assert "learning_rate=0.001" in full and "targets=['k_proj'" in full.replace(
        "targets=['q_proj', 'k_proj'", "targets=['k_proj'")


def test_a_table_that_fits_is_not_abbreviated():
    run = RunResult(name="run-0", knobs={"learning_rate": 0.002}, status=RunStatus.RUNNING,
                    global_step=2, output_dir="out")
    assert "learning_rate=0.002" in runs_table([run])


def test_not_a_terminal_prints_a_handful_of_tables_for_many_boundaries():
    out = io.StringIO()  # a log file: not a terminal
    total = 400
    view = ExperimentProgress(total, stream=out)
    assert view.mode == "log"
    for done in range(1, total + 1):
        # A policy stops runs one by one (material changes, rate-limited); the others
        # complete in the last round (the course of things: no table of their own).
        stopped = min(4, max(0, (done - 100) // 3))
        view.chunk_done(_runs(8, done, done=max(0, done - 392), stopped=stopped), done)
    view.close()
    tables = out.getvalue().count("knobs")
    assert 4 <= tables <= 10, tables
    # The last table is the final state; its header says the count is of all runs together
    # (the rows' steps are each run's own).
    last = out.getvalue().rsplit("chunks ", 1)[1]
    assert last.startswith(f"{total}/{total} (all runs)\n") and last.count("completed") == 8
    assert "continuing" not in out.getvalue()  # a first train() call continues nothing


def test_not_a_terminal_prints_the_table_when_a_run_ends():
    out = io.StringIO()
    cadence = LogCadence(1000)  # periodic tables every 200 boundaries
    printed = [cadence.due(_runs(4, n, stopped=int(n >= 50), done=int(n >= 20)))
               for n in range(1, 101)]
    assert printed[0] and sum(printed) == 2 and printed.index(True, 1) == 49
    view = ExperimentProgress(1000, stream=out)
    view.chunk_done(_runs(2, 1), 1)
    view.close()
    assert out.getvalue().count("knobs") == 1  # the final state was printed already


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_terminal_the_view_redraws_in_place(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", str(COLS))
    monkeypatch.setenv("LINES", str(ROWS))
    term = _Terminal()
    view = ExperimentProgress(64, stream=term)
    assert view.mode == "live"
    for done in range(1, 65):
        view.start(f"run-{done % 8}")
        if done == 30:
            print("a line printed meanwhile")  # above the view, not through it
        view.chunk_done(_runs(8, done, done=max(0, done - 56)), done)
    view.close()
    lines = screen(term.getvalue())
    assert lines.count("a line printed meanwhile") == 1
    assert sum(line.startswith("run    status") for line in lines) == 1
    assert len(lines) <= 12, lines  # the line printed, the bar, the table
    assert any("64/64" in line for line in lines)
    assert all(len(line) <= TABLE_WIDTH for line in lines if line.startswith("run"))


def test_disabled_shows_nothing(capsys):
    view = ExperimentProgress(4, enabled=False)
    view.chunk_done(_runs(2, 1), 1)
    view.close()
    assert view.mode == "off" and capsys.readouterr().out == ""


def test_a_call_that_continues_says_so_once_in_a_log():
    out = io.StringIO()
    view = ExperimentProgress(24, stream=out)
    view.begin(3)
    view.chunk_done(_runs(2, 4), 4)
    view.close()
    assert out.getvalue().count("continuing: 3 of 24 chunks done; 21 left\n") == 1
    assert "nothing left" not in out.getvalue()
    # Everything done: the call returns at once, and says why.
    out = io.StringIO()
    view = ExperimentProgress(24, stream=out)
    view.set_total(26)  # a clone an earlier session added
    view.begin(26)
    view.close()
    assert out.getvalue() == "continuing: 26 of 26 chunks done; nothing left to train\n"
    # A first call (nothing done yet) prints no such line.
    out = io.StringIO()
    view = ExperimentProgress(24, stream=out)
    view.begin(0)
    view.close()
    assert out.getvalue() == ""


def test_a_call_that_continues_says_so_above_the_live_view(monkeypatch, capsys):
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", str(COLS))
    monkeypatch.setenv("LINES", str(ROWS))
    term = _Terminal()
    view = ExperimentProgress(8, stream=term)
    assert view.mode == "live"
    view.begin(5)
    for done in range(6, 9):
        view.chunk_done(_runs(2, done), done)
    view.close()
    lines = screen(term.getvalue())
    assert lines.count("continuing: 5 of 8 chunks done; 3 left") == 1, lines
    assert any("8/8" in line and "chunks (all runs)" in line for line in lines), lines
    # Disabled (a worker other than the first, disable_tqdm): nothing.
    quiet = ExperimentProgress(8, enabled=False)
    quiet.begin(5)
    quiet.close()
    assert capsys.readouterr().out == ""

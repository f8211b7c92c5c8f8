"""The search's study finds a run's trial without a pass over every trial: reporting a chunk's
value and telling a result cost what changed, at 8 runs as at 64 (no training here)."""

from __future__ import annotations

import pytest

optuna = pytest.importorskip("optuna")

from trl_rapidfire.config.knobs import Range  # noqa: E402
from trl_rapidfire.control.policies import RunHistory  # noqa: E402
from trl_rapidfire.integrations.optuna import study as study_module  # noqa: E402
from trl_rapidfire.integrations.optuna.space import SearchSpace  # noqa: E402
from trl_rapidfire.integrations.optuna.study import StudyBook  # noqa: E402
from trl_rapidfire.search.searches import Axis  # noqa: E402
from trl_rapidfire.shared_state.runs import RunStatus  # noqa: E402
from trl_rapidfire.storage.layout import Layout  # noqa: E402

CHUNKS = 4


def history(name, chunks, status=RunStatus.RUNNING):
    log = tuple({"step": 2 * (c + 1), "eval_loss": 3.0 - 0.1 * c + 0.01 * int(name[4:])}
                for c in range(chunks))
    return RunHistory(name, status, chunks, CHUNKS, tuple(2 * (c + 1) for c in range(CHUNKS)),
                      log)


def book(tmp_path, runs):
    space = SearchSpace([Axis(("learning_rate",), (Range(1e-4, 1e-1, log=True),))],
                        ["learning_rate"])
    return StudyBook(space, Layout(tmp_path), sampler_for=optuna.samplers.RandomSampler,
                     sampler_name="RandomSampler", num_runs=runs, max_concurrent=runs,
                     metrics=["eval_loss"], directions=["minimize"])


@pytest.mark.parametrize("runs", [8, 64])
def test_reports_and_tells_never_read_every_trial(tmp_path, monkeypatch, runs):
    monkeypatch.setattr(study_module, "REPORT_EVERY", 0.0)  # every report writes
    study = book(tmp_path, runs)
    names = [p.name for p in study.first_runs()]
    assert len(names) == runs and not study.more()
    passes = []
    real = study.storage.get_all_trials
    monkeypatch.setattr(study.storage, "get_all_trials",
                        lambda *a, **kw: passes.append(1) or real(*a, **kw))
    for chunks in range(1, CHUNKS):
        for name in names:
            study.report(history(name, chunks))
    for name in names:
        assert study.tell(history(name, CHUNKS, RunStatus.COMPLETED)).startswith("trial ")
        assert study.tell(history(name, CHUNKS, RunStatus.COMPLETED)) is None  # told once
    assert passes == []
    monkeypatch.undo()
    trials = {t.user_attrs["run"]: t for t in study.study.get_trials()}
    for name in names:
        told = trials[name]
        assert told.state == optuna.trial.TrialState.COMPLETE
        assert told.intermediate_values == {
            e["step"]: e["eval_loss"] for e in history(name, CHUNKS).log}
        assert told.value == history(name, CHUNKS).log[-1]["eval_loss"]


def test_reports_within_a_second_wait_for_the_next(tmp_path):
    """At most one write a second: the values held back go in with the next report."""
    study = book(tmp_path, 2)
    study.first_runs()
    study.report(history("run-0", 1))
    study.report(history("run-0", 2))  # within the second: nothing written
    held = {t.user_attrs["run"]: t for t in study.study.get_trials()}["run-0"]
    assert held.intermediate_values == {2: history("run-0", 1).log[0]["eval_loss"]}
    study._reported_at -= study_module.REPORT_EVERY  # a second later
    study.report(history("run-0", 3))
    held = {t.user_attrs["run"]: t for t in study.study.get_trials()}["run-0"]
    assert sorted(held.intermediate_values) == [2, 4, 6]

"""The run state machine."""

from __future__ import annotations

import itertools

import pytest

from trl_rapidfire.shared_state.runs import (
    TRANSITIONS,
    IllegalTransition,
    RunState,
    RunStatus,
    transition,
)

S = RunStatus


def test_every_status_has_a_transition_row():
    assert set(TRANSITIONS) == set(RunStatus)


@pytest.mark.parametrize(("current", "new"), list(itertools.product(RunStatus, RunStatus)))
def test_transition_follows_the_table(current, new):
    if new in TRANSITIONS[current]:
        assert transition(current, new) is new
    else:
        with pytest.raises(IllegalTransition, match=f"is {current.value} and cannot become"):
            transition(current, new, run="run-7")


def test_the_life_of_a_run():
    run = RunState("run-0")
    assert run.status is S.PENDING and run.status.schedulable
    run.move(S.RUNNING)
    run.chunks_done = 2
    run.move(S.STOPPED)
    assert not run.status.schedulable
    run.resume()
    assert run.status is S.RUNNING  # it had trained: back into the rotation where it left off
    run.move(S.COMPLETED)
    assert run.status.terminal
    with pytest.raises(IllegalTransition, match="run-0 is completed and cannot become running"):
        run.move(S.RUNNING)
    run.move(S.DELETED)
    assert TRANSITIONS[run.status] == frozenset()


def test_resuming_a_run_stopped_before_its_first_chunk_makes_it_pending():
    run = RunState("run-1")
    run.move(S.STOPPED)
    run.resume()
    assert run.status is S.PENDING


def test_fail_keeps_the_reason():
    run = RunState("run-2", status=S.RUNNING)
    run.fail("ZeroDivisionError in formatting_func")
    assert run.status is S.FAILED and "ZeroDivisionError" in run.error
    with pytest.raises(IllegalTransition):
        run.resume()


def test_status_values_are_the_tag_strings():
    assert [s.value for s in RunStatus] == [
        "pending", "running", "stopped", "completed", "deleted", "failed"]
    assert str(S.RUNNING) == "running" and S("stopped") is S.STOPPED


def test_json_round_trip():
    run = RunState("run-3", knobs={"learning_rate": 1e-4}, status=S.STOPPED, chunks_done=3,
                   global_step=12, parent="run-0", warm_start=True)
    data = run.to_json()
    assert data["status"] == "stopped"
    assert RunState.from_json(data) == run
    with pytest.raises(ValueError, match="Unknown run-state keys"):
        RunState.from_json({**data, "colour": "red"})

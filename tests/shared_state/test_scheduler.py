"""The scheduler's rule: least progress first, ties to the resident run, then declaration order."""

from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.shared_state.scheduler import RunView, pick_next

P, R, S, C, F = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.STOPPED, RunStatus.COMPLETED,
                 RunStatus.FAILED)


def _v(name, index, status, done, total=4):
    return RunView(name, index, status, done, total)


def test_least_progress_first():
    runs = [_v("a", 0, R, 2), _v("b", 1, R, 1), _v("c", 2, P, 0)]
    assert pick_next(runs) == "c"


def test_progress_is_relative_to_each_runs_plan():
    # a: 1 of 2 chunks (50%), b: 1 of 4 chunks (25%)
    assert pick_next([_v("a", 0, R, 1, 2), _v("b", 1, R, 1, 4)]) == "b"


def test_tie_goes_to_the_resident_run_then_to_declaration_order():
    runs = [_v("a", 0, R, 1), _v("b", 1, R, 1), _v("c", 2, R, 1)]
    assert pick_next(runs, resident="b") == "b"
    assert pick_next(runs, resident=None) == "a"
    assert pick_next(runs, resident="zzz") == "a"


def test_only_pending_and_running_runs_with_chunks_left_are_picked():
    runs = [_v("a", 0, S, 0), _v("b", 1, C, 4), _v("c", 2, F, 1), _v("d", 3, R, 4)]
    assert pick_next(runs) is None
    assert pick_next([*runs, _v("e", 4, R, 3)]) == "e"


def test_equal_fractions_tie_exactly():
    # 1/3 and 2/6 must compare equal (no float rounding), so the resident run wins the tie.
    runs = [_v("a", 0, R, 1, 3), _v("b", 1, R, 2, 6)]
    assert pick_next(runs, resident="b") == "b"

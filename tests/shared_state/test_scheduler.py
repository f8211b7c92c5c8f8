"""The scheduler's rules: least progress first (the default), or a new run's first chunk and then
the most advanced run (promote); ties to the resident run, then declaration order."""

from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.shared_state.scheduler import Order, RunView, pick_next

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


PROMOTE = Order.PROMOTE


def test_promote_gives_a_new_run_its_first_chunk_then_the_leader_trains_on():
    runs = [_v("a", 0, R, 2), _v("b", 1, R, 1), _v("c", 2, P, 0)]
    assert pick_next(runs, order=PROMOTE) == "c"  # not trained yet: its first point first
    runs[2] = _v("c", 2, R, 1)
    assert pick_next(runs, order=PROMOTE) == "a"  # then the most advanced
    assert pick_next(runs, resident="b", order=PROMOTE) == "a"  # whatever is resident
    # Advanced is relative to each run's plan: 3 of 8 chunks is behind 2 of 4.
    assert pick_next([_v("a", 0, R, 3, 8), _v("b", 1, R, 2, 4)], order=PROMOTE) == "b"


def test_promote_serves_waiting_runs_in_declaration_order_not_the_resident_first():
    # c (just proposed, its first chunk trained, resident) waits behind a and b: otherwise each
    # new run would overtake the ones parked before it, and those would wait to the end.
    runs = [_v("a", 0, R, 1), _v("b", 1, R, 2, 8), _v("c", 2, R, 1)]
    assert pick_next(runs, resident="c", order=PROMOTE) == "a"
    assert pick_next(runs, resident="c", local={"b"}, order=PROMOTE) == "b"  # held here
    assert pick_next([_v("a", 0, P, 0), _v("b", 1, P, 0)], resident="b", order=PROMOTE) == "a"


def test_promote_picks_only_what_the_default_may_pick():
    runs = [_v("a", 0, S, 1), _v("b", 1, C, 4), _v("c", 2, F, 3), _v("d", 3, R, 4)]
    assert pick_next(runs, order=PROMOTE) is None
    assert pick_next([*runs, _v("e", 4, R, 1)], order=PROMOTE) == "e"

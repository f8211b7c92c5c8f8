"""The op protocol between a person setting run tags and the training process answering them,
against a real sqlite MLflow store: no op lost, each answered exactly once (repeats of the same
text included); ops on the parent run answered; statuses kept on a re-build; a half-created
store repaired or refused with one clear message."""

from __future__ import annotations

import sqlite3
import threading
import time
import warnings

import pytest
from mlflow import MlflowClient
from mlflow_stores import half_created
from transformers import TrainerCallback

from trl_rapidfire.tracking.tracker import (
    OP_RESULT_TAG,
    OP_SEQ_TAG,
    OP_TAG,
    STATUS_TAG,
    Tracker,
    TrackingStoreError,
)

# Small intervals: the protocol, not the cadence, is under test; a stress run takes seconds.
FAST = dict(poll_interval=0.02, write_interval=0.05)


@pytest.fixture
def uri(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def tracker(tmp_path, uri):
    t = Tracker(tmp_path / "exp", uri=uri, **FAST)
    for name in ("run-0", "run-1"):
        t.ensure_run(name, {}, {STATUS_TAG: "pending"})
    yield t
    t.close()


class FakeEngine(threading.Thread):
    """What the engine does with tags at its chunk boundaries: take every pending op, apply
    it (here: record it), answer it. The answer text numbers the applications per run."""

    def __init__(self, tracker: Tracker):
        super().__init__(daemon=True)
        self.tracker, self.applied = tracker, {}
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            for name, op in self.tracker.pending_ops().items():
                done = self.applied.setdefault(name, [])
                done.append(op)
                self.tracker.consume_op(name, op, f"ok: {op} #{len(done)}")
            time.sleep(0.005)


def _tags(client, run_id):
    return client.get_run(run_id).data.tags


def _wait(predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _answered(client, run_id, seq):
    """The documented signal that op number ``seq`` on the run was answered."""
    tags = _tags(client, run_id)
    return OP_TAG not in tags and tags.get(OP_SEQ_TAG) == str(seq)


# Repeats on purpose: the same text back to back is a new op each time (B6).
TEXTS = ["stop", "stop", "resume", "stop", "resume", "resume", 'clone {"seed": 1}',
         'clone {"seed": 1}', "delete", "stop"]


def _stress(tracker: Tracker, uri: str, n: int) -> str:
    """Two people at once, one per run, each sending ``n`` ops back to back and following one
    of the documented signals before the next: run-0's waits for the answer
    (rapidfire.op.seq), run-1's only for rapidfire.op to be gone (answered afterwards)."""
    sent = {name: [TEXTS[i % len(TEXTS)] for i in range(n)] for name in ("run-0", "run-1")}
    seen: dict[str, list[tuple[str, str]]] = {"run-0": [], "run-1": []}
    failures = []

    def person(name):
        client, run_id = MlflowClient(uri), tracker.run_id(name)
        try:
            for i, op in enumerate(sent[name], start=1):
                client.set_tag(run_id, OP_TAG, op)
                if name == "run-0":
                    _wait(lambda i=i: _answered(client, run_id, i), f"{name} op {i} unanswered")
                    tags = _tags(client, run_id)
                    seen[name].append((tags[OP_SEQ_TAG], tags[OP_RESULT_TAG]))
                else:
                    _wait(lambda: OP_TAG not in _tags(client, run_id), f"{name} op {i} stuck")
        except AssertionError as err:
            failures.append(str(err))

    engine = FakeEngine(tracker)
    engine.start()
    started = time.monotonic()
    people = [threading.Thread(target=person, args=(name,)) for name in sent]
    for p in people:
        p.start()
    for p in people:
        p.join()
    client = MlflowClient(uri)
    if not failures:
        _wait(lambda: _answered(client, tracker.run_id("run-1"), n), "run-1's last answer")
    seconds = time.monotonic() - started
    engine.halt.set()
    engine.join()
    assert not failures, failures
    for name in sent:
        assert engine.applied[name] == sent[name]  # every op applied once, in order: 0 lost
        assert _tags(client, tracker.run_id(name))[OP_SEQ_TAG] == str(n)
    # Each answer the person saw was their own op's, numbered one after the other.
    assert seen["run-0"] == [(str(i), f"ok: {op} #{i}") for i, op in enumerate(sent["run-0"], 1)]
    assert not tracker.errors
    return (f"{2 * n} ops sent, {sum(map(len, engine.applied.values()))} applied and "
            f"answered, 0 lost, {seconds:.1f} s")


def test_back_to_back_ops_as_the_docs_advise_are_each_answered_exactly_once(tracker, uri):
    print(f"\nop stress, sqlite: {_stress(tracker, uri, 60)}")


@pytest.mark.slow
def test_back_to_back_ops_through_a_tracking_server(tmp_path):
    from mlflow_server import mlflow_server

    with mlflow_server(tmp_path / "server.db") as url:
        tracker = Tracker(tmp_path / "exp", uri=url, **FAST)
        for name in ("run-0", "run-1"):
            tracker.ensure_run(name, {}, {})
        try:
            print(f"\nop stress, REST server: {_stress(tracker, url, 25)}")
        finally:
            tracker.close()


def test_an_op_set_the_moment_the_answer_appears_is_not_removed(tracker, uri):
    # The worst moment for the person who follows the docs: right as the previous answer is
    # written. Answering used to write the result, then compare-and-delete the tag, which
    # then removed this next op unanswered.
    person = MlflowClient(uri)
    run_id = tracker.run_id("run-0")
    real_log_batch = tracker.client.log_batch
    fired = []

    def log_batch_then_person_sets_the_next_op(rid, *args, **kwargs):
        real_log_batch(rid, *args, **kwargs)
        tags = kwargs.get("tags") or []
        if rid == run_id and any(t.key == OP_RESULT_TAG for t in tags) and not fired:
            fired.append(True)
            person.set_tag(run_id, OP_TAG, "resume")

    tracker.client.log_batch = log_batch_then_person_sets_the_next_op
    engine = FakeEngine(tracker)
    engine.start()
    try:
        person.set_tag(run_id, OP_TAG, "stop")
        _wait(lambda: _answered(person, run_id, 2), "the op set as the answer appeared was lost")
    finally:
        engine.halt.set()
        engine.join()
    assert engine.applied["run-0"] == ["stop", "resume"]
    assert _tags(person, run_id)[OP_RESULT_TAG] == "ok: resume #2"


def test_the_same_op_set_again_the_moment_its_tag_is_gone_is_applied_again(tracker, uri):
    # The same text, set again right as our delete of the tag completes (before any poll can
    # see the tag gone): it used to be filtered as the op already consumed, forever.
    person = MlflowClient(uri)
    run_id = tracker.run_id("run-1")
    real_delete_tag = tracker.client.delete_tag
    repeats = []

    def delete_tag_then_person_sets_the_same_op(rid, key):
        real_delete_tag(rid, key)
        if rid == run_id and len(repeats) < 2:
            repeats.append(True)
            person.set_tag(run_id, OP_TAG, "stop")

    tracker.client.delete_tag = delete_tag_then_person_sets_the_same_op
    engine = FakeEngine(tracker)
    engine.start()
    try:
        person.set_tag(run_id, OP_TAG, "stop")
        _wait(lambda: _answered(person, run_id, 3), "a repeat of the same op was never answered")
    finally:
        engine.halt.set()
        engine.join()
    assert engine.applied["run-1"] == ["stop"] * 3
    assert _tags(person, run_id)[OP_RESULT_TAG] == "ok: stop #3"


def test_a_stale_poll_does_not_bring_back_an_answered_op(tracker, uri):
    # Between the engine's answer and the next poll the tag still shows in the last poll: it
    # must not be applied twice, however often the engine asks.
    person = MlflowClient(uri)
    run_id = tracker.run_id("run-0")
    person.set_tag(run_id, OP_TAG, "stop")
    tracker.poll_now()
    assert tracker.pending_ops() == {"run-0": "stop"}
    tracker.consume_op("run-0", "stop", "ok: stopped")
    assert tracker.pending_ops() == {}
    tracker.flush()
    tracker.poll_now()
    assert tracker.pending_ops() == {}
    assert _answered(person, run_id, 1)


def test_an_op_on_the_experiments_parent_run_is_answered_with_an_error(tracker, uri):
    person = MlflowClient(uri)
    person.set_tag(tracker.parent_run_id, OP_TAG, "stop")
    tracker.poll_now()
    tags = _tags(person, tracker.parent_run_id)
    assert OP_TAG not in tags and tags[OP_SEQ_TAG] == "1"
    result = tags[OP_RESULT_TAG]
    assert result.startswith("error: 'stop' was set on the experiment's parent run")
    assert "rapidfire.run" in result and "run-0, run-1" in result
    assert tracker.pending_ops() == {}  # the engine never sees it
    person.set_tag(tracker.parent_run_id, OP_TAG, "stop")  # again: answered again
    tracker.poll_now()
    assert _answered(person, tracker.parent_run_id, 2)


def test_rebuilding_never_rewrites_a_finished_runs_status(tmp_path, uri):
    first = Tracker(tmp_path / "exp", uri=uri, **FAST)
    first.ensure_run("run-0", {"lr": 1}, {STATUS_TAG: "pending"})
    first.ensure_run("run-1", {}, {STATUS_TAG: "pending"})
    first.set_tags("run-0", {STATUS_TAG: "completed"})
    first.flush()
    run_id = first.run_id("run-0")
    client = MlflowClient(uri)
    client.delete_tag(first.run_id("run-1"), STATUS_TAG)  # a run that never got one
    # The same trainer built again (or a slow worker of a launch setting up late).
    first.ensure_run("run-0", {"lr": 1}, {STATUS_TAG: "pending"})
    first.flush()
    assert first.run_id("run-0") == run_id
    first.close()
    again = Tracker(tmp_path / "exp", uri=uri, **FAST)
    again.ensure_run("run-0", {"lr": 1}, {STATUS_TAG: "pending"})
    again.ensure_run("run-1", {}, {STATUS_TAG: "pending"})
    again.close()
    assert again.run_id("run-0") == run_id
    assert _tags(client, run_id)[STATUS_TAG] == "completed"
    assert _tags(client, again.run_id("run-1"))[STATUS_TAG] == "pending"


class _Person(TrainerCallback):
    """At run-0's steps, a person sets run-1's next op once the previous one was answered."""

    def __init__(self, ops):
        self.ops, self.sent, self.trainer = list(ops), 0, None

    def on_step_end(self, args, state, control, **kwargs):
        if args.learning_rate != 1e-3 or not self.ops:
            return
        tracker = self.trainer.engine.tracker
        tracker.flush()  # answers are written off the training thread
        run_id = tracker.run_id("run-1")
        if _answered(tracker.client, run_id, self.sent) or self.sent == 0:
            tracker.client.set_tag(run_id, OP_TAG, self.ops.pop(0))
            self.sent += 1
            tracker.poll_now()


def test_repeated_ops_in_a_real_training_run_are_each_applied_and_answered(tmp_path,
                                                                            monkeypatch):
    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.testing import (
        cpu_training_kwargs,
        make_sft_dataset,
        tiny_lora_config,
        tiny_model_path,
    )

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    ops = ["stop", "stop", "resume", "resume"]
    person = _Person(ops)
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), learning_rate=List([1e-3, 3e-3]),
                         num_chunks=4, max_steps=8, per_device_train_batch_size=4,
                         **{**cpu_training_kwargs(), "report_to": "mlflow"}),
        train_dataset=make_sft_dataset(32), peft_config=tiny_lora_config(r=4),
        callbacks=[person],
    )
    for name in rf.engine.slots:  # each run's trainer, built now if it was planned
        next(cb for cb in rf.run_trainer(name).callback_handler.callbacks
             if isinstance(cb, _Person)).trainer = rf
    rf.train()
    answers = [(r.op, r.result) for r in rf.op_log if r.run == "run-1"]
    assert [op for op, _ in answers] == ops, answers  # each once, repeats included
    assert answers[0][1].startswith("ok: stopped") and answers[2][1].startswith("ok: resumed")
    assert answers[1][1].startswith("error:") and answers[3][1].startswith("error:")
    tags = _tags(MlflowClient(rf.engine.tracker.uri), rf.engine.tracker.run_id("run-1"))
    assert OP_TAG not in tags and tags[OP_SEQ_TAG] == "4"
    assert tags[OP_RESULT_TAG] == answers[-1][1]
    assert {r.name: r.status for r in rf.runs}["run-1"] == "completed"


# ---------------------------------------------------------------- a half-created store (B2)

def test_a_store_killed_while_created_is_moved_aside_and_created_again(tmp_path):
    db = tmp_path / "mlflow.db"
    half_created(db)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = Tracker(tmp_path / "exp", uri=f"sqlite:///{db}", **FAST)
        tracker.ensure_run("run-0", {}, {})
        tracker.close()  # the store is repaired on the tracking thread: waited for here
    (moved,) = tmp_path.glob("mlflow.db.broken-*")
    text = [str(w.message) for w in caught if "half-created" in str(w.message)]
    assert len(text) == 1 and str(db) in text[0] and str(moved) in text[0]
    # The new store holds the experiment; the moved file, untouched since, holds no run.
    assert MlflowClient(f"sqlite:///{db}").get_run(tracker.run_id("run-0"))
    with sqlite3.connect(moved) as con:
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_a_half_created_store_holding_runs_is_refused_with_one_clear_message(tmp_path):
    db = tmp_path / "mlflow.db"
    half_created(db)
    # As if the interrupted creation had been an upgrade of a store in use.
    with sqlite3.connect(db) as con:
        con.execute("INSERT INTO experiments (experiment_id, name, lifecycle_stage) "
                    "VALUES (1, 'mine', 'active')")
        con.execute("INSERT INTO runs (run_uuid, experiment_id, lifecycle_stage, status) "
                    "VALUES ('abc', 1, 'active', 'FINISHED')")
    # Found on the tracking thread (the store is opened there, not on the way to training):
    # said once among the tracker's errors (train() warns with them), and by what needs it.
    tracker = Tracker(tmp_path / "exp", uri=f"sqlite:///{db}", **FAST)
    tracker.ensure_run("run-0", {}, {})
    tracker.flush()
    with pytest.raises(TrackingStoreError) as err:
        tracker.run_id("run-0")
    tracker.flush()  # not tried again: a person has to act on the store first
    tracker.close()
    message = str(err.value)
    assert str(db) in message and "1 runs" in message and "move it aside" in message
    assert "\n" not in message
    assert [e for e in tracker.errors if "half-created" in e] == [f"TrackingStoreError: {message}"]
    assert db.exists() and not list(tmp_path.glob("mlflow.db.broken-*"))

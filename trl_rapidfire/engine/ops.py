"""The ops desk: control ops (``stop``, ``resume``, ``delete``, ``clone``, ``clone-warm``) from
the script, from run tags and from the experiment's policy, applied at chunk boundaries.
The clones they make are :mod:`.clones`'s."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..control.folder_control import Inbox
from ..control.ops import (
    Op,
    OpError,
    OpOrigin,
    OpOutcome,
    OpRecord,
    OpResult,
    OpSource,
    append_op_row,
    parse_op,
    read_op_rows,
)
from ..control.policies import Policy
from ..runtime.cache import save_tree
from ..shared_state.gang_state import disband_forming_gang
from ..shared_state.runs import RunState, RunStatus, status_op_refusal
from ..shared_state.store import StateStore
from ..shared_state.worker_info import WorkerInfo
from ..storage.csv_logs import printable
from ..storage.faults import ExperimentFault, disk_fault
from ..storage.layout import Layout, run_index, run_name
from .building import register_failed
from .clones import Clones, next_run_index
from .coordination import Coordinator
from .exemptions import PersonResumes, resumed_text
from .lifetime import WallClock
from .policy_view import PolicyView
from .records import RunSlot
from .reporting import Reporter
from .turns import Turns

__all__ = ["OpsDesk", "QueuedOp", "change_status"]

_PYTHON = OpSource(OpOrigin.PYTHON)


@dataclass(frozen=True)
class QueuedOp:
    """An op waiting for the next boundary: its text as sent (what the log shows) and, when
    the sender had it as data (a policy's decision), the op itself, not parsed again;
    ``refusal``: why it is no op at all (an op file that could not be read), its answer."""

    source: OpSource
    run: str
    text: str
    reason: str | None = None
    op: Op | None = None
    refusal: str | None = None

    def parsed(self) -> Op:
        return self.op if self.op is not None else parse_op(self.text)


class OpsDesk:
    """Takes ops in (any thread), asks the policy, and applies what is pending, once: under a
    launch only the first worker applies ops, and what they change reaches the others
    through the shared state.

    Args:
        layout: the experiment's paths (``ops.csv``, a warm clone's starting state).
        store, worker, slots: the shared state, this worker, the engine's runs.
        clones: makes the runs clone ops ask for.
        policy: automatic control (see policies.py), asked by the first worker at every
            chunk end; or ``None``.
        turns: parks a stopped run, forgets a failed one.
        shared: this worker's view of the shared state.
        reporter: tells the tracker each op's result, and hears the ops set as tags.
        clock: the experiment's training wall time (policies budget it).
        replanned: told when clones change the experiment's chunk count.
    """

    def __init__(
        self, *, layout: Layout, store: StateStore, worker: WorkerInfo,
        slots: dict[str, RunSlot], clones: Clones, policy: Policy | None, turns: Turns,
        shared: Coordinator, reporter: Reporter, clock: WallClock,
        replanned: Callable[[], None],
    ) -> None:
        self.layout = layout
        self.store = store
        self.worker = worker
        self.slots = slots
        self.clones = clones
        # The ops handled so far, by this process and the experiment's earlier ones (a
        # re-run's log goes on from ops.csv, as its runs do from the shared state).
        try:
            self.op_log: list[OpRecord] = read_op_rows(layout.ops_log)
        except (OSError, ValueError) as err:
            warnings.warn(f"{layout.ops_log} was not read ({err}); trainer.op_log starts "
                          "empty, new ops are still appended to it", RuntimeWarning,
                          stacklevel=4)
            self.op_log = []
        self.policy = policy
        # Runs a person resumed: the policy's verdict at that boundary does not stand (the
        # rule is docs/policies.md's; kept in the op log, so a re-run keeps it too).
        self._resumes = PersonResumes(self.op_log)
        self._end_looked_at = -1  # the chunks recorded when waiting_at_end last looked
        self._turns = turns
        self._shared = shared
        self._reporter = reporter
        self._clock = clock
        self._replanned = replanned
        # Ops the CLI leaves in the experiment's folder (an untracked experiment's channel).
        self._inbox = Inbox(layout)
        self._queued: list[QueuedOp] = []
        # (run, op) the script itself asked for: a clone recipe in the shared state that
        # matches one may be rebuilt with the author's rights.
        self._author_ops: set[tuple[str, str]] = set()
        # Ops may be queued from another thread (a notebook while train(blocking=False) runs).
        self._lock = threading.Lock()
        # The policy's context, brought up to date with the runs that moved.
        self._view = PolicyView(slots=slots, moved=shared.moved.take,
                                pending=shared.pending_chunks,
                                elsewhere=lambda: shared.training_elsewhere, clock=clock.seconds)

    # ------------------------------------------------------------------ taking ops in

    def queue_op(self, run: str, op: str, source: OpSource | str = _PYTHON,
                 reason: str | None = None, *, parsed: Op | None = None) -> None:
        """Apply ``op`` (its text; ``parsed``: the op itself, when the sender has it) to
        ``run`` at the next chunk boundary (or the next ``train()``)."""
        if isinstance(source, str):
            source = OpSource.from_text(source)
        with self._lock:
            self._queued.append(QueuedOp(source, run, op, reason, parsed))
            if not source.outside:
                self._author_ops.add((run, canonical_op(op)))

    def pending(self) -> bool:
        """Whether this worker has ops to apply."""
        if self.worker.rank != 0:
            return False
        return (bool(self._queued) or bool(self._reporter.pending_ops())
                or self._inbox.has_mail())

    def new_call(self) -> None:
        """A ``run()`` call starts: its end looks at the waiting ops again."""
        self._end_looked_at = -1

    def waiting_at_end(self, trained: int) -> bool:
        """Whether an op waits when no chunk is left to train, the control tags read now.

        The tracking thread reads the tags about once a second, and opens the store first: a
        re-run of a finished experiment has nothing to claim and would end before its first
        read, leaving an op sent for it (``--next-run``: the resume of a stopped run, a
        delete, a clone) unapplied while the sender was told the next ``train()`` applies
        it. So the call reads them once more before it ends; the call was about to wait for
        the tracker anyway (its end writes what is queued).

        Once per ``trained`` (the chunks recorded so far): an op that cannot be taken out of
        the waiting ones (an inbox that is a link, refused at every read) would otherwise
        keep the call from ending; after the ops applied, only a chunk trained since (or the
        next call) opens another look."""
        if self.worker.rank != 0 or trained == self._end_looked_at:
            return False
        self._end_looked_at = trained
        tracker = self._reporter.tracker
        if tracker is not None:
            tracker.poll_now()
        return self.pending()

    def consult_policy(self) -> None:
        """Ask the policy about every chunk finished since it was last asked (by any worker)
        and queue its decisions as ops.

        A chunk of this worker counts as finished as soon as it trained, before its checkpoint
        is recorded: a decision must reach the scheduler before the next claim, and ops wait
        for pending records anyway (``apply_ops`` acts on recorded boundaries).
        """
        if self.policy is None or self.worker.rank != 0:
            return
        started = time.perf_counter()
        context = self._view.refresh()
        decisions = self._resumes.standing(
            [d for name in self._view.take_fresh()
             for d in self.policy.on_chunk_end(name, context)], context)
        stats = self._turns.stats
        stats.policy_seconds += time.perf_counter() - started
        stats.policy_histories = self._view.histories_built
        decided: set[tuple[str, str]] = set()
        for d in decisions:
            if d.action == "clone":
                verb = "clone-warm" if d.warm else "clone"
                op = Op(verb, dict(d.overrides))
                text = f"{verb} {json.dumps(dict(d.overrides), default=str)}"
            else:
                # Several fresh chunks can lead to the same verdict on a waiting run.
                if (d.run, d.action) in decided:
                    continue
                decided.add((d.run, d.action))
                op, text = Op(d.action), d.action
            source = OpSource(OpOrigin.POLICY, d.by or self.policy.name)
            self.queue_op(d.run, text, source=source, reason=d.reason, parsed=op)

    def admits_new_runs(self) -> bool:
        """Whether the policy lets an adaptive search start another run now."""
        if self.policy is None:
            return True
        return self.policy.admits_new_runs(self._view.refresh())

    def pruned_at_end(self, run: str) -> bool | None:
        """The policy's verdict on the finished ``run``'s last evaluation
        (:meth:`~trl_rapidfire.control.policies.Policy.pruned_at_end`); ``None`` where this
        worker does not consult the policy (only the first does) or has not yet."""
        if self.policy is None:
            return False
        return self.policy.pruned_at_end(run) if self.worker.rank == 0 else None

    # ------------------------------------------------------------------ applying them

    def apply_ops(self) -> list[OpRecord]:
        """Apply every pending op (tags polled by the tracker, queued Python ops).

        Under a launch every worker runs the same script, so an op the script queues is
        queued by each, and every worker sees the same tags: the first worker alone applies
        ops, once, and what they change reaches the others through the shared state.
        """
        with self._lock:
            pending, self._queued = self._queued, []
        if self.worker.rank != 0:
            return []
        tag = OpSource(OpOrigin.TAG)
        pending += [QueuedOp(tag, run, text) for run, text in self._reporter.pending_ops().items()]
        # An op file stays in the inbox until its op is answered (a crash in between
        # applies it again at the next train(), never loses it).
        mail = self._inbox.take()
        pending += [QueuedOp(OpSource(OpOrigin.CLI), item.run, item.op, refusal=item.problem)
                    for item in mail]
        mail_at = {len(pending) - len(mail) + i: item for i, item in enumerate(mail)}
        # A person's op on a run wins over a policy's at the same boundary.
        by_person = {q.run for q in pending if not q.source.automatic}
        records = []
        for position, queued in enumerate(pending):
            result = self._answer(queued, by_person)
            # Text at the edges: the log, ops.csv, the run's tags. The log's is printable
            # (a NUL or RTL override sent in a tag is shown escaped, in ops.csv and the
            # report alike); the tag is answered with the text it holds.
            source, run, text = str(queued.source), queued.run, queued.text
            record = OpRecord.now(source, printable(run), printable(text),
                                  printable(str(result)))
            records.append(record)
            self.op_log.append(record)
            self._resumes.note(record)
            append_op_row(record, self.layout.ops_log)
            if result.outcome is not OpOutcome.SKIPPED:
                # A policy's op skipped for a person's is in the log only: the run's answer
                # (its last op, its rapidfire.op.result tag) stays the person's, whichever
                # of the two was queued first.
                self._reporter.answer_op(source, run, text, str(result),
                                         known=run in self.slots)
                if result.outcome is OpOutcome.OK:
                    self._tell_who_stopped(queued)
            if run in self.slots and result.outcome is not OpOutcome.SKIPPED:
                self.slots[run].last_op = str(result)
                self._reporter.report(self.slots[run])
            if position in mail_at:
                self._inbox.done(mail_at[position])
            if result.outcome is OpOutcome.ERROR and queued.source.origin is OpOrigin.PYTHON:
                warnings.warn(f"op {text!r} on {run}: {result}", RuntimeWarning, stacklevel=2)
        return records

    def _tell_who_stopped(self, queued: QueuedOp) -> None:
        """An applied stop or resume: the run's tracking says who stopped it, or no one."""
        verb = queued.parsed().verb
        if verb == "stop":
            source = queued.source
            who = (source.policy or "a policy") if source.automatic \
                else f"person ({source.origin.value})"
            self._reporter.stopped_by(queued.run, who)
        elif verb == "resume":
            self._reporter.stopped_by(queued.run, None)

    def _answer(self, queued: QueuedOp, by_person: set[str]) -> OpResult:
        """Apply one op; what it did, or why not."""
        source = queued.source
        if queued.refusal is not None:
            return OpResult(OpOutcome.ERROR, queued.refusal)
        if source.automatic and queued.run in by_person:
            return OpResult(OpOutcome.SKIPPED, "a person's op on this run wins")
        try:
            # Tag text is anyone's who can write to the tracking server: only the script's
            # own ops (Python calls, its policies) may go beyond hyperparameters.
            done = self._apply(queued.run, queued.parsed(), queued.reason,
                               trusted=not source.outside)
        except OpError as err:
            return OpResult(OpOutcome.ERROR, str(err))
        except Exception as err:  # noqa: BLE001 - one op's failure is its answer
            if isinstance(err, ExperimentFault) or disk_fault(err, ours=True):
                raise  # the experiment's files, not the op: stop at this boundary
            return OpResult(OpOutcome.ERROR, f"{type(err).__name__}: {one_line(err)}")
        if source.automatic:
            done += f" by {source.policy} {queued.reason}"
        return OpResult(OpOutcome.OK, done)

    def _apply(self, run: str, op: Op, reason: str | None = None, *,
               trusted: bool = False) -> str:
        if op.verb in ("stop", "resume", "delete", "fail"):
            with self.store.transaction() as st:
                record = st.runs.get(run)
                if run not in self.slots:
                    raise OpError(f"no run named {run!r}; runs: {sorted(self.slots)}")
                if record is None:  # built here, not registered in the shared state yet
                    raise OpError(f"{run} is not in the experiment's shared state yet: ops "
                                  "apply from train() on (queue it with the trainer's op "
                                  "methods before train())")
                result = change_status(record, op.verb, reason)
                # A worker may have opened its next chunk's gang meanwhile: not trained now.
                disband_forming_gang(st, run)
                self._shared.sync(st)
            slot = self.slots[run]
            if op.verb == "fail":
                self._turns.forget(slot)
                return result
            if op.verb == "stop" and slot.residency.resident and slot.trainer is not None \
                    and slot.state.chunks_done and slot.turn.local_chunks == slot.state.chunks_done:
                self._turns.park(slot)
            return result
        parent = self.slots.get(run)
        if parent is None:
            raise OpError(f"no run named {run!r}; runs: {sorted(self.slots)}")
        slot = parent
        if slot.state.status == RunStatus.DELETED:
            raise OpError(f"{run} is deleted; no op applies to it")
        # Under the lock: the clone's name is taken from the shared state, so two workers
        # cloning at once never pick the same one, and the others learn how to build it.
        with self.store.transaction() as st:
            name = run_name(next_run_index(st.runs, self.slots))
            with self._no_folder_left(name):
                clone = self.clones.make(slot, op, name=name, trusted=trusted)
            st.add_run(clone.name, len(clone.plan), clone.json_knobs())
            if clone.gang:
                st.gang_size[clone.name] = clone.gang
            st.runs[clone.name].parent = clone.state.parent
            st.runs[clone.name].warm_start = clone.state.warm_start
            st.clones[clone.name] = {"parent": run, "op": str(op)}
            if op.warm and clone.warm.state_tree is not None:
                save_tree(clone.warm.state_tree, self.layout.warm_dir(clone.name))
            self._shared.sync(st)
        self._replanned()
        return f"created {clone.name}" + (f" warm-started from {run}" if op.warm else "")

    @contextlib.contextmanager
    def _no_folder_left(self, name: str) -> Iterator[None]:
        """A clone refused after its trainer was built (a warm start with nothing to start
        from) leaves none of its folders: the empty ones its build made are removed (a
        folder with a file in it, or one that was there before, stays)."""
        folders = [self.layout.final_dir(name), self.layout.run_dir(name)]
        made = [f for f in folders if not os.path.lexists(f)]
        try:
            yield
        except BaseException:
            for folder in made:  # the deepest first; rmdir never removes a file or a link's
                with contextlib.suppress(OSError):  # target, and fails on a folder in use
                    os.rmdir(folder)
            raise

    def build_clone_from_store(self, name: str, info: dict[str, str]) -> None:
        """Build the clone ``name`` another worker (or an earlier session) made, from its
        recipe ``info`` in the shared state; if it cannot be built here, it alone fails."""
        # The state file is not the author: its recipe is held to a tag's limits, unless this
        # script asked for the same clone itself (every worker of a launch queues its ops).
        trusted = (info["parent"], info["op"]) in self._author_ops
        try:
            self.clones.make_from_recipe(name, info, trusted=trusted)
        except OpError as err:
            # Not buildable here (e.g. a Python clone of another session that loads code):
            # that run fails alone, saying why; the others train on.
            index = run_index(name)
            assert index is not None  # the shared state's names are checked run names
            failed = register_failed(
                self.slots, name=name, index=index, knobs={}, group=None,
                run_dir=self.layout.run_dir(name),
                error=OpError(f"cannot rebuild clone {name} of {info['parent']} from "
                              f"{self.store.path}: {err}"),
                stacklevel=2,
            )
            with self.store.transaction() as st:
                record = st.runs.get(name)
                if record is not None and record.status.schedulable:
                    record.fail(failed.failure)
                self._shared.sync(st)
        self._replanned()


def change_status(record: RunState, verb: str, reason: str | None = None) -> str:
    """Apply a status op to ``record`` (in the shared state); returns the op's result."""
    refusal = status_op_refusal(record.name, record.status, verb)
    if refusal is not None:
        raise OpError(refusal)
    if verb == "fail":  # only policies fail runs (a NaN metric), with their reason
        record.fail(reason or "failed by a policy")
        return "failed"
    if verb == "stop":
        record.move(RunStatus.STOPPED)
        return f"stopped at step {record.global_step}"
    if verb == "resume":
        record.resume()
        return resumed_text(record.global_step)
    record.move(RunStatus.DELETED)
    return "deleted"


def canonical_op(text: str) -> str:
    """The op as the shared state records it (``str(parse_op(text))``), or ``text``."""
    try:
        return str(parse_op(text))
    except OpError:
        return text


def one_line(err: BaseException, limit: int = 500) -> str:
    """``err``'s message as one line of at most ``limit`` characters (for an op's answer)."""
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    return text if len(text) <= limit else text[:limit] + "..."

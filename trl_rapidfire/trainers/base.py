"""The experiment-level trainer that the user holds: the facade of ``RF*Trainer``.

An ``RF*Trainer`` is a subclass of its TRL trainer (``isinstance(trainer, SFTTrainer)`` holds)
but does not train itself: it expands the knobs into runs, has the
:class:`~.run_builder.RunBuilder` build one *run trainer* per run (a plain TRL trainer plus
:class:`~.run_trainer.RunTrainerMixin`), registers them with the
:class:`~trl_rapidfire.engine.Engine`, and afterwards stands for the best run: attribute reads
(``trainer.model``, ``trainer.state``) and public methods (``evaluate``, ``save_model``,
``push_to_hub``, ...) go to the best run's trainer (before ``train()``: the first run's).
"""

from __future__ import annotations

import contextlib
import json
import threading
import warnings
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import TrainOutput

from ..config.configs import RFConfigError
from ..control.ops import OpRecord
from ..engine import Engine, RunSlot, RunTrainer
from ..engine.lifetime import stopped_by_ctrl_c
from ..reports.notebook_events import join_taking_clicks, taking_clicks_at_boundaries
from ..reports.notebook_panel import NotebookPanel, panel_can_show
from ..reports.ranking import RankingMetric
from ..reports.results import RunResult, metric_points, pick_best
from ..runtime.accelerate_state import (
    answer_package_checks_once,
    fill_empty_from,
    left_as_found,
    restore_accelerate_state,
)
from ..runtime.workers import current_worker
from ..search.searches import GridSearch, Search
from ..storage.names import UntrustedValue
from ..storage.schedule import ChunkRecord
from .assembly import assemble, raise_failures
from .run_trainer import copy_callback
from .subclassing import (
    FORWARDED,
    as_trl_on_runs,
    forward_to_best_run,
    run_class_for,
)

__all__ = ["RFTrainerMixin"]

class RFTrainerMixin:
    """The experiment-level trainer. Subclasses set :attr:`_rf_run_hooks` (the run trainer's
    hooks of their kind, a :class:`~.run_trainer.RunTrainerMixin`) and call :meth:`_rf_setup`
    from ``__init__``; a user's subclass of them is the class every run trains with."""

    _rf_run_hooks: type
    _rf_default_suffix: str = "RF"
    # The trainer arguments that may be knobs, in the order their axes are searched; every
    # other argument is shared by all runs.
    _rf_knob_arguments: tuple[str, ...] = ("model", "peft_config", "processing_class")

    # ------------------------------------------------------------------ construction

    def _rf_setup(self, **kwargs: Any) -> None:
        """Set the experiment up (``_rf_setup_runs``), leaving accelerate's process-global state
        as the script had it: each run's trainer keeps its own snapshot of it."""
        self._rf_background: tuple[threading.Thread, dict[str, Any]] | None = None
        self._rf_panel: NotebookPanel | None = None
        self._rf_in_train = False
        answer_package_checks_once()
        with left_as_found():
            self._rf_setup_runs(**kwargs)
        # A plain TRL trainer leaves the process's accelerate state its own: so does this one
        # (its face run's) where the script had none, so that a TRL method called before
        # train() finds it (a script's own state is kept).
        slots = [s for s in self._rf_engine.slots.values() if s.trainer is not None]
        if slots and slots[0].turn.accelerate is not None:
            fill_empty_from(slots[0].turn.accelerate)

    def _rf_setup_runs(
        self,
        *,
        args: Any,
        search: Search | None,
        arguments: dict[str, Any],
        policy: Any = None,
        **more_shared: Any,
    ) -> None:
        """``arguments``: the TRL trainer's arguments as given (see :func:`trainer_arguments`);
        ``more_shared``: what every run's trainer gets besides. The experiment's parts are
        made and wired by :func:`~.assembly.assemble`; this object is their face."""
        # Set first: the runs' trainers, built during the assembly, see their owner whole.
        self.args = args
        self.search = GridSearch() if search is None else search
        experiment = assemble(
            args=args, search=self.search, arguments=arguments, policy=policy,
            knob_names=self._rf_knob_arguments, more_shared=more_shared,
            trainer_class=run_class_for(type(self), self._rf_run_hooks), owner=self,
        )
        self._rf_pool = experiment.pool
        self._rf_engine = experiment.engine
        self._rf_runs = experiment.runs
        self._rf_ranking = experiment.ranking
        self._rf_best: str | None = None

    # ------------------------------------------------------------------ control ops

    def stop(self, run: str) -> None:
        """Stop ``run`` at the next chunk boundary (its state is kept; see :meth:`resume`)."""
        self._rf_engine.queue_op(run, "stop")

    def resume(self, run: str) -> None:
        """Put a stopped ``run`` back into the rotation."""
        self._rf_engine.queue_op(run, "resume")

    def delete(self, run: str) -> None:
        """Remove ``run`` for good and free its state."""
        self._rf_engine.queue_op(run, "delete")

    def clone(self, run: str, overrides: dict[str, Any] | None = None, *,
              warm: bool = False) -> None:
        """Add a run with ``run``'s knobs plus ``overrides``; ``warm`` starts it from
        ``run``'s weights. Same syntax as the ``clone`` op (see
        :mod:`trl_rapidfire.control.ops`)."""
        verb = "clone-warm" if warm else "clone"
        self._rf_engine.queue_op(run, f"{verb} {json.dumps(overrides or {})}")

    @property
    def op_log(self) -> list[OpRecord]:
        """Every op applied or rejected so far (also in ``<output_dir>/ops.csv``)."""
        return list(self._rf_engine.op_log)

    def panel(self) -> NotebookPanel:
        """The experiment's live control panel for Jupyter (a cell ending with it shows it):
        the runs table, Stop / Resume / Delete / Clone buttons with each op's answer, a clone
        form and the training loss per run, refreshed at chunk boundaries while other cells
        run. In a Jupyter kernel ``train()`` shows it by itself (in place of the text progress
        view); this returns that same panel (a new one once it was closed). Needs ipywidgets:
        ``pip install ipywidgets`` (an ``ImportError`` says so without it)."""
        panel = self._rf_panel
        if panel is None or panel.closed:
            panel = self._rf_panel = NotebookPanel(self)
        else:
            panel.refresh()
        return panel

    def _rf_show_panel(self) -> None:
        """In a Jupyter kernel with ipywidgets, ``train()`` shows the control panel in the
        cell that called it, as the experiment's progress view: the engine's own bar and text
        table would say the same a second time, so they are turned off. Elsewhere (a script,
        a terminal, ``disable_tqdm=True``, a worker other than the first) nothing changes."""
        engine = self._rf_engine
        if self.args.disable_tqdm or engine.worker.rank != 0 or not panel_can_show():
            return
        engine.show_progress = False
        self.panel().show()

    # ------------------------------------------------------------------ training

    @as_trl_on_runs
    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        *,
        blocking: bool = True,
        **kwargs: Any,
    ) -> TrainOutput | None:
        """Train every run, chunk by chunk, and return the best run's ``TrainOutput``.

        Failed runs are reported (a warning naming each) and the others finish; if every run
        fails, :class:`~trl_rapidfire.engine.RunFailure` is raised. Returns when no run is left
        to train: completed, failed, deleted or stopped. Stopped runs stay resumable: resume
        them (an op, or :meth:`resume`) and call ``train()`` again to continue.

        With ``blocking=False`` the experiment trains on a background thread and ``train``
        returns ``None`` at once: a notebook can go on issuing ops (:meth:`stop`,
        :meth:`clone`, ...), reading :attr:`runs` and plotting while it trains;
        :meth:`wait` returns what ``train`` would have (or raises what it would have raised)
        and :attr:`training` says whether it is still going. In a Jupyter kernel with
        ipywidgets, the control panel (:meth:`panel`) shows in the calling cell and is the
        progress view.
        """
        if self.training:
            raise RuntimeError("this experiment is already training; call wait() first")
        self._rf_check_train_args(resume_from_checkpoint, trial)
        self._rf_in_train = True  # training from here on, for the panel's polling thread too
        try:
            return self._rf_start_training(blocking)
        finally:
            self._rf_in_train = False  # in the background, the thread's life says it now

    def _rf_start_training(self, blocking: bool) -> TrainOutput | None:
        self._rf_show_panel()
        if not blocking:
            outcome: dict[str, Any] = {}

            def target() -> None:
                try:
                    outcome["result"] = self._rf_train()
                except BaseException as err:  # noqa: BLE001 - handed to wait()
                    outcome["error"] = err

            thread = threading.Thread(target=target, name="trl-rapidfire-train", daemon=True)
            self._rf_background = (thread, outcome)
            thread.start()
            return None
        # The panel's clicks act at this call's chunk boundaries, not after it (a kernel).
        with taking_clicks_at_boundaries(self._rf_engine.hooks, self._rf_panel):
            return self._rf_train()

    @property
    def training(self) -> bool:
        """Whether the experiment is training now: ``train(blocking=False)``'s thread is, or
        (seen from another thread, such as the notebook panel's) a blocking ``train()``."""
        background = self._rf_background
        return self._rf_in_train or (background is not None and background[0].is_alive())

    def wait(self, timeout: float | None = None) -> TrainOutput | None:
        """Wait for ``train(blocking=False)`` to end and return its result (the best run's
        ``TrainOutput``), or raise its error. With ``timeout`` (seconds), raises
        ``TimeoutError`` if it is still training then (it trains on: wait again). Interrupting
        the wait (Ctrl-C, a notebook's stop button) asks the experiment to stop at its next
        chunk boundary, as Ctrl-C does in a script."""
        background = self._rf_background
        if background is None:
            raise RuntimeError("nothing to wait for: call train(blocking=False) first")
        thread, outcome = background
        try:  # the panel's clicks act while it waits (in a kernel)
            join_taking_clicks(thread, timeout, self._rf_panel)
        except KeyboardInterrupt:
            self._rf_engine.interrupted = True
            thread.join()
            raise
        if thread.is_alive():
            raise TimeoutError(
                f"still training after {timeout:g} s ({len(self.schedule)} of "
                f"{self._rf_engine.total_chunks} chunks trained); it trains on: call wait() "
                "again, or stop it")
        self._rf_background = None
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("result")

    def _rf_check_train_args(self, resume_from_checkpoint: Any, trial: Any) -> None:
        if resume_from_checkpoint not in (None, False, True):
            raise ValueError(
                "RF trainers resume a whole experiment, not one checkpoint: pass "
                "resume_from_checkpoint=True (or nothing: re-running the script on the same "
                "output_dir always continues from each run's last chunk boundary)."
            )
        if trial is not None:
            raise ValueError("RF trainers run their own search; `trial` is not supported.")

    def _rf_train(self) -> TrainOutput:
        with left_as_found():  # the runs' turns set accelerate's state; the script's comes back
            return self._rf_train_runs()

    def _rf_train_runs(self) -> TrainOutput:
        engine = self._rf_engine
        try:  # a link may have been left in the folder since it was built
            engine.layout.check_links()
        except UntrustedValue as err:
            raise RFConfigError(str(err)) from None
        engine.run()
        if engine.interrupted:
            raise stopped_by_ctrl_c()  # one line, not a traceback (engine/lifetime.py)
        failures = engine.failures()
        best = self.best_run
        if best is None:
            raise_failures("Every run failed", list(engine.slots.values()), failures)
        if failures:
            names = ", ".join(f"{n} ({e})" for n, e in failures.items())
            warnings.warn(f"{len(failures)} run(s) failed: {names}", RuntimeWarning, stacklevel=2)
        self._rf_best = best.name
        engine.activate(best.name)
        return engine.slots[best.name].train_output()

    # ------------------------------------------------------------------ results

    @property
    def runs(self) -> list[RunResult]:
        """Every run: name, knobs, status, global step, output folder, latest metrics."""
        return self._rf_engine.results()

    def metric_history(self, run: str, key: str = "loss") -> list[tuple[int, float]]:
        """The ``(step, value)`` points of ``key`` that ``run`` logged so far (its trainer's
        ``log_history``, as the curves of ``trl-rapidfire report`` and the panel draw it);
        ``[]`` for a run that logged none. A ``KeyError`` names an unknown run."""
        slot = self._rf_engine.slots.get(run)
        if slot is None:
            raise KeyError(f"no run named {run!r}; the runs are "
                           f"{', '.join(self._rf_engine.slots) or 'none yet'}")
        state = slot.latest_trainer_state()
        if state is None:  # failed before its trainer existed, or not built yet
            return []
        history = state.log_history
        return metric_points(history, (key,)).get(key, [])

    @property
    def ranking(self) -> RankingMetric:
        """The metric every view ranks the runs by (the panels, ``status``, the live table,
        the report, MLflow's saved view, :attr:`best_run`): the policy's, else
        ``metric_for_best_model``/``greater_is_better``, else what the search optimizes
        (``OptunaSearch(metric=..., direction=...)``), else eval loss where the runs are
        evaluated, else the latest training loss."""
        return self._rf_ranking

    @property
    def best_run(self) -> RunResult | None:
        """The best run by :attr:`ranking`."""
        return pick_best(self.runs, ranking=self._rf_ranking)

    @property
    def schedule(self) -> list[ChunkRecord]:
        """Every chunk trained so far, in order (also in ``<output_dir>/schedule.csv``)."""
        return list(self._rf_engine.schedule)

    @property
    def engine(self) -> Engine:
        return self._rf_engine

    @property
    def model_loads(self) -> dict[str, int]:
        """How many times each base model was loaded (once per distinct model and kind)."""
        return dict(self._rf_pool.loads)

    def run_trainer(self, name: str) -> Any:
        """The live TRL trainer of run ``name`` (for inspection; ``None`` for a run that
        failed before its trainer was built). A run whose trainer is built when it is first
        scheduled has it built now, unless this is called from inside a run's training (a
        callback): ``RuntimeError`` then."""
        slot = self._rf_engine.slots[name]
        if slot.planned and self.training:
            # Built by the engine between two turns only: from a callback, or from another
            # thread while train(blocking=False) trains, it would change the shared model
            # under the run training now.
            raise RuntimeError(f"{name}'s trainer is built when it is first scheduled, and "
                               "the experiment is training: ask for it after train(), or "
                               f"once {name} has trained a chunk")
        return self._rf_engine.build_now(name).trainer

    def _rf_trainers(self) -> list[RunTrainer]:
        """The runs' trainers (a run that failed before its trainer was built has none)."""
        return [s.trainer for s in self._rf_engine.slots.values() if s.trainer is not None]

    def _rf_current_slot(self) -> RunSlot:
        slots = self._rf_engine.slots
        if self._rf_best is not None:
            return slots[self._rf_best]
        return next(s for s in slots.values() if s.trainer is not None)

    def _rf_current(self) -> Any:
        return self._rf_current_slot().trainer

    @contextlib.contextmanager
    def _rf_as_current(self) -> Any:
        """The best run's trainer in its own accelerate state for the body (an evaluate(), a
        save_model()), and the process's as it was afterwards."""
        slot = self._rf_current_slot()
        with left_as_found():
            if slot.turn.accelerate is not None:
                restore_accelerate_state(slot.turn.accelerate)
            yield slot.trainer

    # ------------------------------------------------------------------ the best run's face

    @as_trl_on_runs
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the best run's adapter (or model) only, to ``output_dir`` (default: the
        experiment's ``output_dir``), in the layout its plain TRL trainer would write."""
        target = output_dir if output_dir is not None else self.args.output_dir
        with self._rf_as_current() as trainer:
            if _writes_here(trainer):
                trainer.save_model(target, _internal_call=_internal_call)

    @as_trl_on_runs
    def end(self) -> None:
        """Finish every run's trackers (the Trainer's ``end()``, once per run)."""
        for trainer in self._rf_trainers():
            if hasattr(trainer, "end"):
                trainer.end()

    @as_trl_on_runs
    def add_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        """Add a callback to every run (a copy each; runs built later get theirs when they
        are built)."""
        for trainer in self._rf_trainers():
            trainer.add_callback(copy_callback(callback))
        self._rf_runs.change_callbacks("add", callback)

    @as_trl_on_runs
    def remove_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        """Remove a callback (by class) from every run."""
        cls = callback if isinstance(callback, type) else type(callback)
        for trainer in self._rf_trainers():
            trainer.remove_callback(cls)
        self._rf_runs.change_callbacks("remove", cls)

    @as_trl_on_runs
    def pop_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> Any:
        """Remove a callback (by class) from every run; returns the best run's copy."""
        cls = callback if isinstance(callback, type) else type(callback)
        popped = [trainer.pop_callback(cls) for trainer in self._rf_trainers()]
        self._rf_runs.change_callbacks("remove", cls)
        return popped[0] if popped else None

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this object does not have: the best run's trainer has
        # them (model, state, accelerator, processing_class, ...).
        if name.startswith("_rf") or name in ("args", "search"):
            raise AttributeError(name)
        if "_rf_engine" not in vars(self):  # built without __init__ (e.g. object.__new__)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self._rf_current(), name)


for _name in FORWARDED:
    setattr(RFTrainerMixin, _name, forward_to_best_run(_name))

# What TRL does on the main process only (it asks its own is_world_process_zero): under a
# launch every worker holds the best run in a trainer that sees a world of one, so each would
# write (or push) the same thing; the launch's main process alone does, as in plain TRL.
_MAIN_PROCESS_ONLY = ("save_state", "save_metrics", "log_metrics", "push_to_hub",
                      "create_model_card")


def _on_the_main_process(name: str) -> Any:
    forwarded = forward_to_best_run(name)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _writes_here(self._rf_current()):
            return None
        return forwarded(self, *args, **kwargs)

    method.__name__, method.__doc__ = name, forwarded.__doc__
    return as_trl_on_runs(method)  # a run's own trainer keeps the TRL method


def _is_process_zero(local: bool) -> Any:
    forwarded = forward_to_best_run("is_local_process_zero" if local else "is_world_process_zero")

    def method(self: Any) -> bool:
        worker, trainer = current_worker(), self._rf_current()
        if not worker.launched or trainer.args.world_size > 1:  # alone, or a gang's own world
            return bool(forwarded(self))
        return (worker.local_rank if local else worker.rank) == 0

    method.__name__ = forwarded.__name__
    method.__doc__ = ("Whether this is the launch's main process (the node's, ``local``), as "
                      "plain TRL answers under ``accelerate launch``.")
    return as_trl_on_runs(method)  # a run's own trainer keeps the TRL method


for _name in _MAIN_PROCESS_ONLY:
    setattr(RFTrainerMixin, _name, _on_the_main_process(_name))
RFTrainerMixin.is_world_process_zero = _is_process_zero(local=False)  # type: ignore[attr-defined]
RFTrainerMixin.is_local_process_zero = _is_process_zero(local=True)  # type: ignore[attr-defined]


def _writes_here(trainer: Any) -> bool:
    """Whether this worker writes the best run's ``save_model()``: as TRL's ``should_save``
    under a launch, the main process only (each node's, with ``save_on_each_node``). Every
    worker runs the script and holds the best run, but its trainer sees a world of one, so its
    own ``should_save`` is true on every worker: all would write the same folder at once."""
    worker = current_worker()
    if not worker.launched or trainer.args.world_size > 1:
        return True  # alone; or a gang run, whose trainer knows its writers and needs them all
    return (worker.local_rank if trainer.args.save_on_each_node else worker.rank) == 0

"""The composition root: an experiment's parts made and wired, from what the user gave an
``RF*Trainer``.

The knobs expand into runs (or an adaptive search opens its study), every check that can be
made before a model loads is made, the experiment's folder is opened (continued, refused, or
moved aside), each run is built on the model pool and registered with the
:class:`~trl_rapidfire.engine.Engine`, with the shared state, the state cache and the tracker it
needs. The ``RF*Trainer`` (:mod:`.base`) is the face the user holds; this is where its parts
come from.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NoReturn

from ..config.cadence import parse_cadence
from ..config.configs import RFConfigError
from ..control.policies import Policy, as_policy
from ..engine import Engine, RunFailure, RunSlot
from ..reports.ranking import (
    RANKING_TAG,
    RankingMetric,
    choose_ranking,
    read_ranking,
)
from ..runtime.cache import StateCache
from ..runtime.model_pool import ModelPool
from ..runtime.workers import current_worker, one_worker_warning
from ..search.fingerprint import experiment_fingerprint
from ..search.searches import AdaptiveSearch, ExpandingSearch, GridSearch, Search
from ..shared_state.worker_info import lease_seconds
from ..storage.checkpoints import DEFAULT_CADENCE
from ..storage.layout import Layout
from .run_builder import RunBuilder
from .setup_checks import check_clone_overrides, check_model_candidates, check_specs, open_store
from .subclassing import check_overrides

__all__ = ["Experiment", "assemble", "raise_failures"]


@dataclass
class Experiment:
    """An experiment's parts, made and wired (what the ``RF*Trainer`` holds)."""

    engine: Engine
    pool: ModelPool
    runs: RunBuilder  # builds the planned runs, rebuilds and clones (the engine's factory)
    ranking: RankingMetric  # what every view ranks the runs by, best_run included


def assemble(
    *, args: Any, search: Search | None, arguments: dict[str, Any], policy: Policy | Any,
    knob_names: Collection[str], more_shared: dict[str, Any], trainer_class: type,
    owner: Any,
) -> Experiment:
    """Make the experiment's parts.

    ``args``: the RF config; ``search``: the user's (default :class:`GridSearch`);
    ``arguments``: the TRL trainer's arguments as given; ``knob_names``: those of them that may
    be knobs (the rest is shared by every run, with ``more_shared``); ``trainer_class``: the
    class each run's trainer is (the user's subclass, made a run trainer); ``owner``: the face
    the runs' trainers refer to. Raises :class:`RFConfigError` (or ``TypeError`` for a wrong
    ``search``) before anything trains; :class:`RunFailure` when no run could be set up.
    """
    knob_args = {k: arguments[k] for k in knob_names}
    shared_args = {k: v for k, v in arguments.items() if k not in knob_args}
    shared_args.update(more_shared)
    policy = as_policy(policy)  # a bad policy fails before anything loads
    if search is None:
        search = GridSearch()
    if not isinstance(search, (ExpandingSearch, AdaptiveSearch)):
        raise TypeError(
            f"`search` must be GridSearch(), RandomSearch(...) or OptunaSearch(...), got "
            f"{search!r}."
        )
    adaptive = isinstance(search, AdaptiveSearch)
    # An adaptive search's runs come from its study, which lives in the experiment's
    # folder: it is opened once that folder is known to be this experiment's.
    described = (search.describe(args, **knob_args)
                 if isinstance(search, AdaptiveSearch) else None)
    specs = search.expand(args, **knob_args) if isinstance(search, ExpandingSearch) else []
    layout = Layout(args.output_dir)
    pool = ModelPool()
    check_overrides(type(owner))
    builder = RunBuilder(trainer_class=trainer_class,
                         args=args, shared=shared_args, knob_args=knob_args,
                         pool=pool, owner=owner,
                         single=not adaptive and len(specs) == 1,
                         tracked=_tracks_to_mlflow(args))
    check_specs(specs, shared_args, builder, policy=policy)
    check_clone_overrides(args, arguments.keys(), arguments)
    check_model_candidates(knob_args.get("model"), args)
    asked_more = one_worker_warning()
    if asked_more is not None:
        warnings.warn(asked_more, UserWarning, stacklevel=4)
    try:
        lease = lease_seconds()
    except ValueError as err:
        raise RFConfigError(str(err)) from None
    configs: dict[str, dict[str, Any]] = {}  # each run's config as a dict, read once
    store = open_store(layout, experiment_fingerprint(specs, shared_args, described, configs))
    builder.read_configs(configs)
    proposer = None
    if isinstance(search, AdaptiveSearch):
        specs, proposer = search.start(args, layout, **knob_args)
        check_specs(specs, shared_args, builder, metrics=search.metrics, policy=policy)
    tracker = None
    if _tracks_to_mlflow(args):
        from ..tracking.tags import check_uri_across_machines, resolve_tracking_uri
        from ..tracking.tracker import Tracker

        check_uri_across_machines(resolve_tracking_uri(), current_worker().machines)
        tracker = Tracker(layout.output_dir)
        print(  # noqa: T201 - the user needs this to open the dashboard
            f"trl-rapidfire: tracking to {tracker.uri} (experiment "
            f"{tracker.experiment_name!r}); dashboard: trl-rapidfire dashboard"
        )
    ranking = _ranking(args, search, policy, specs, builder, shared_args)
    # Recorded for the views in other processes: the folder (the report, an untracked
    # experiment's status) and each run's first MLflow tags (the panel, status, MLflow's view).
    ranked_before = read_ranking(layout.output_dir)
    ranking_tag = {RANKING_TAG: ranking.to_text()}
    cache = StateCache(getattr(args, "cache_budget_bytes", 4 * 2**30), layout.cache)
    engine = Engine(layout.output_dir, cache, progress=not args.disable_tqdm,
                    lease_seconds=lease, pool=pool, store=store, runs=builder,
                    policy=policy, tracker=tracker, proposer=proposer,
                    checkpoint_every=parse_cadence(
                        getattr(args, "checkpoint_every", DEFAULT_CADENCE)))
    engine.ranking = ranking  # the live runs table's order
    # The first run built: a run that differs from it only in knobs that leave the data and
    # the plan alone gets its plan and waits for its first turn to be built (see
    # RunBuilder.defers). Validation stays up front: check_specs saw every config.
    reference = None
    for spec in specs:
        try:
            if reference is not None and proposer is None and builder.defers(spec):
                planned = builder.planned(spec, reference.plan)
                planned.tags.update(ranking_tag)
                engine.registry.register_planned(planned)
                continue
            new = builder.build(spec)
            new.tags.update(ranking_tag)
            if proposer is not None:
                new.tags.update(proposer.tags_of(spec.name))
            slot = engine.registry.register(new)
            reference = reference or slot
        except RFConfigError:
            raise  # the setup itself is wrong: say so before anything trains
        except Exception as err:  # noqa: BLE001 - e.g. a user formatting function raised
            engine.registry.add_failed(
                name=spec.name, index=spec.index, knobs=spec.knobs, error=err,
                run_dir=layout.run_dir(spec.name), group=None,
            )
    builder.read_configs({})  # what the planned runs did not take is not kept
    if tracker is not None and ranked_before not in (None, ranking):
        # A re-run that ranks by another metric (its policy changed): the runs found in
        # MLflow keep their first tags, so theirs is set anew (once, not at every re-run).
        for name in engine.slots:
            tracker.set_tags(name, ranking_tag)
    if tracker is not None:
        tracker.active.set()  # the runs are built: MLflow's work goes on until train() starts
    slots = list(engine.slots.values())
    if all(s.trainer is None and not s.planned for s in slots):
        raise_failures("No run could be set up", slots)
    if len(slots) == 1:
        # One config: what its TRL trainer changed in its config, a plain one changes in
        # the user's (trainer.args reads as TRL's would).
        run_args = slots[0].live_trainer().args
        for name in builder.changed_in_place.get(slots[0].name, []):
            setattr(args, name, copy.deepcopy(getattr(run_args, name)))
    return Experiment(engine=engine, pool=pool, runs=builder, ranking=ranking)


def raise_failures(what: str, slots: list[RunSlot],
                   errors: dict[str, str] | None = None) -> NoReturn:
    """Raise why no run is left: one run's own exception when the experiment has one run (as
    its TRL trainer would raise it), else a :class:`RunFailure` listing every run's."""
    if len(slots) == 1 and slots[0].outcome.exception is not None:
        exc = slots[0].outcome.exception
        note = (f"trl-rapidfire: the experiment's one run, {slots[0].name}, raised this in its "
                "training (its traceback above), as its TRL trainer alone would have.")
        if note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)
        raise exc
    errors = errors or {s.name: s.failure for s in slots}
    detail = "\n".join(f"  {name}: {err}" for name, err in errors.items())
    raise RunFailure(f"{what}:\n{detail}",
                     {s.name: s.outcome.exception for s in slots
                      if s.outcome.exception is not None})


def _ranking(args: Any, search: Search, policy: Policy | None, specs: list[Any],
             builder: RunBuilder, shared_args: dict[str, Any]) -> RankingMetric:
    """The experiment's ranking metric (:func:`~..reports.ranking.choose_ranking`): the
    policy's, ``metric_for_best_model``'s, the search's, else ``eval_loss`` where the runs are
    evaluated (an eval dataset, and a run whose ``eval_strategy`` is not ``no``)."""
    def evaluates(spec: Any) -> bool:
        strategy = builder.strategy(spec, "eval_strategy")
        return str(getattr(strategy, "value", strategy)) != "no"

    return choose_ranking(
        policy=policy, metric_for_best_model=getattr(args, "metric_for_best_model", None),
        greater_is_better=getattr(args, "greater_is_better", None),
        objective=search.objective(), search=type(search).__name__,
        evaluated=shared_args.get("eval_dataset") is not None and any(map(evaluates, specs)))


def _tracks_to_mlflow(args: Any) -> bool:
    report_to = args.report_to
    if isinstance(report_to, str):
        report_to = [report_to]
    return bool(report_to) and ("mlflow" in report_to or "all" in report_to)

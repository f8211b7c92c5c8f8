"""What is wrong with an experiment as a whole, said when it is built, before any model loads;
and the experiment's folder, opened for it (continued, refused, or an older one moved aside)."""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..config.configs import RFConfigError
from ..config.fields import CHUNK, ENGINE_EVALS
from ..config.knobs import List
from ..control.folder_control import training_now
from ..runtime.workers import current_worker
from ..search.searches import RunSpec
from ..shared_state.state_file import FileStore
from ..shared_state.store import StoreError
from ..storage.layout import Layout
from ..storage.names import UntrustedValue
from .generation_eval import examples_of
from .per_run_trackers import check_shared_trackers
from .run_builder import RunBuilder
from .run_trainer import copy_callbacks

__all__ = ["check_clone_overrides", "check_model_candidates", "check_specs", "open_store"]


def open_store(layout: Layout, fingerprint: str) -> FileStore:
    """The experiment's shared state, not created yet (nothing is written before ``train()``).

    An experiment already in ``output_dir`` with the same runs is continued (a re-run after a
    crash or a stop). One with other runs is moved aside, whole, into ``previous/`` with a
    warning, as plain TRL would simply train in that folder; but never one that is training
    now (another process on this machine, or a worker on another whose lease holds), and
    under a launch it is refused instead, since every worker would move it. A link in the
    folder that leads out of it is refused before anything is read there."""
    store = FileStore(layout.state_dir, fingerprint, create=False)
    try:
        layout.check_links()
        recorded = store.recorded_fingerprint()
        busy = None if recorded in (None, fingerprint) else training_now(layout, store.peek())
    except (StoreError, UntrustedValue) as err:
        raise RFConfigError(str(err)) from None
    if recorded is None or recorded == fingerprint:
        return store
    if busy is not None:
        raise RFConfigError(
            f"{layout.output_dir} holds another experiment (other runs), and it is training "
            f"now: {busy}. One experiment trains in a folder at a time: use another "
            "output_dir, or run this once that one has ended (its folder is then moved aside "
            "into previous/).")
    if current_worker().launched:
        raise RFConfigError(
            f"{store.path} belongs to an experiment with other runs (fingerprint "
            f"{recorded[:12]}, these runs {fingerprint[:12]}): use another output_dir, run "
            "the configs it was made for, or start this one once without a launch (which "
            "moves the other aside).")
    try:
        moved = layout.move_aside()
    except UntrustedValue as err:
        raise RFConfigError(str(err)) from None
    warnings.warn(f"{layout.output_dir} held another experiment (other runs); it was moved, "
                  f"whole, to {moved}. This one starts afresh.", UserWarning, stacklevel=4)
    return store


def check_specs(specs: Sequence[RunSpec], shared_args: dict[str, Any], builder: RunBuilder,
                metrics: Sequence[str] = (), policy: Any = None) -> None:
    """What is wrong with the runs as a whole, said before any model loads.

    Args:
        metrics: what an adaptive search optimizes (each must be logged).
        policy: the experiment's policy: the metrics it reads must be logged too.
    """
    optimizers = shared_args.get("optimizers")
    if len(specs) > 1 and optimizers is not None and any(o is not None for o in optimizers):
        raise ValueError(
            "`optimizers=(optimizer, scheduler)` is one optimizer bound to one model's "
            "parameters; with several runs each needs its own. Use "
            "`optimizer_cls_and_kwargs=(cls, kwargs)` or the config's `optim` instead."
        )
    readers = {metric: ("the search optimizes", "search on metric='loss'")
               for metric in metrics}
    for member in getattr(policy, "policies", [policy] if policy is not None else []):
        for name in member.metrics:
            readers.setdefault(name, (f"the policy {member.name} reads",
                                      "give the policy metric='loss'"))
    for spec in specs:
        strategy = builder.strategy(spec, "eval_strategy")
        if strategy in ENGINE_EVALS and shared_args.get("eval_dataset") is None:
            where = ("every run at each chunk end" if strategy == CHUNK else
                     "each run where the policy reads its metric and at its last chunk")
            raise RFConfigError(
                f"{spec.name}: eval_strategy={strategy!r} evaluates {where} and needs an "
                "eval_dataset; pass eval_dataset=... or use eval_strategy='no'."
            )
        evaluates = strategy not in (None, "no")
        if builder.setting(spec, "generation_config") is not None:
            _check_generation(spec.name, evaluates, shared_args.get("eval_dataset"))
        for name, (who, other) in readers.items():
            if name.startswith("eval_") and not evaluates:
                raise RFConfigError(
                    f"{spec.name}: {who} {name!r}, which only evaluation logs; set "
                    "eval_strategy='policy' (and pass eval_dataset=...) so that every run is "
                    "evaluated where the policy reads it, or 'chunk' for every chunk end, "
                    f"or {other}."
                )
    check_shared_trackers([spec.config for spec in specs])
    copy_callbacks(shared_args.get("callbacks"))  # fail before any model is loaded


def _check_generation(run: str, evaluates: bool, eval_dataset: Any) -> None:
    """A run with a ``generation_config`` is evaluated, on rows that have prompts."""
    if not evaluates or eval_dataset is None:
        raise RFConfigError(
            f"{run}: generation_config judges the run by what it generates at each "
            "evaluation, but it is never evaluated; set eval_strategy='chunk' and pass "
            "eval_dataset=... (rows with a prompt), or remove generation_config.")
    sets = eval_dataset.items() if isinstance(eval_dataset, Mapping) else [("", eval_dataset)]
    for name, dataset in sets:
        try:
            examples_of(itertools.islice(dataset, 1), "completion")
        except ValueError as err:
            where = f"eval_dataset[{name!r}]" if name else "eval_dataset"
            raise RFConfigError(f"{run}: generation_config: {where}: {err}") from None


def check_clone_overrides(args: Any, trainer_args: Collection[str],
                          values: Mapping[str, Any]) -> None:
    """Every name in the config's ``clone_overrides`` is a config field or a trainer argument
    (``name``), or a field of one that holds a config object (``peft_config.r``): a misspelt
    name would otherwise let nothing through and say nothing.

    Args:
        args: the RF config.
        trainer_args: the names of the trainer's arguments.
        values: the trainer arguments' values (a dotted name's object, or a ``List`` of them).
    """
    names = getattr(args, "clone_overrides", None) or []
    fields = {f.name for f in dataclasses.fields(args)}
    known = fields | set(trainer_args)
    for entry in names:
        head, _, attr = entry.partition(".")
        if head not in known:
            close = difflib.get_close_matches(head, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise RFConfigError(
                f"`clone_overrides` names {entry!r}, which is neither a field of "
                f"{type(args).__name__} nor an argument of the trainer.{hint}")
        if not attr:
            continue
        value = values.get(head, getattr(args, head, None))
        candidates = value.values if isinstance(value, List) else [value]
        objects = [c for c in candidates
                   if dataclasses.is_dataclass(c) and not isinstance(c, type)]
        if not objects:
            raise RFConfigError(
                f"`clone_overrides` names {entry!r}, but {head!r} holds no config object with "
                f"fields here (it holds {type(value).__name__}); name {head!r} alone.")
        missing = [type(o).__name__ for o in objects
                   if attr not in {f.name for f in dataclasses.fields(o)}]
        if missing:
            raise RFConfigError(f"`clone_overrides` names {entry!r}, but {missing[0]} has no "
                                f"field {attr!r}.")


def check_model_candidates(model: Any, args: Any) -> None:
    """Each model a ``model=List([...])`` names can be found (its config read, nothing
    loaded): otherwise only the run that loads it would find out, mid-experiment."""
    if not isinstance(model, List):
        return
    from transformers import PretrainedConfig

    options = getattr(args, "model_init_kwargs", None) or {}
    where = {k: options[k] for k in ("revision", "token", "cache_dir") if k in options}
    for index, candidate in enumerate(model.values):
        if not isinstance(candidate, str):
            continue  # a model object: it exists
        try:
            PretrainedConfig.get_config_dict(candidate, **where)
        except Exception as err:  # noqa: BLE001 - OSError, HF hub errors: said in one line
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise RFConfigError(
                f"`model` candidate {index} ({candidate!r}) cannot be found: {first}. Fix the "
                "name or path (the other candidates were found), or remove it from the List."
            ) from None

"""What the RF trainers share: building one live TRL trainer per run, and the experiment-level
trainer that the user holds.

An ``RF*Trainer`` is a subclass of its TRL trainer (``isinstance(trainer, SFTTrainer)`` holds)
but does not train itself: it expands the knobs into runs, builds one *run trainer* per run (a
plain TRL trainer plus :class:`RunTrainerMixin`), hands them to the
:class:`~trl_rapidfire.engine.Engine`, and afterwards stands for the best run: attribute reads
(``trainer.model``, ``trainer.state``) and public methods (``evaluate``, ``save_model``,
``push_to_hub``, ...) go to the best run's trainer (before ``train()``: the first run's).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PrinterCallback, ProgressCallback, TrainerCallback
from transformers.integrations import MLflowCallback
from transformers.trainer_utils import TrainOutput

from ..accelerate_state import (
    enter_world_of_one,
    fresh_accelerator_state,
    launch_partial_state,
    left_as_found,
    preserved_accelerate_state,
    restore_accelerate_state,
    snapshot_accelerate_state,
    without_barriers,
)
from ..cache import StateCache, load_tree
from ..configs import RFConfigError, RFConfigMixin, is_gang_config
from ..control import Op, OpError, OpRecord, resolve_overrides
from ..durable import commit_folder, link_folder, start_folder
from ..engine import Engine, RunFailure
from ..knobs import KnobError, describe_value, is_knob
from ..models import ModelPool, adapter_name, adapter_params
from ..policies import as_policy
from ..preflight import PreflightError, check_run
from ..results import RunResult, pick_best
from ..schedule import ChunkRecord
from ..search import GridSearch, RunSpec, Search
from ..store import FileStore, StoreError
from ..workers import current_worker, in_launch_world

__all__ = ["RFTrainerMixin", "RunTrainerMixin"]

CHUNK = "chunk"


class RunTrainerMixin:
    """Mixed into a TRL trainer class to make one run's trainer.

    * With a shared multi-adapter model, checkpoints and ``save_model`` write only this run's
      adapter, at the folder root, exactly as a plain trainer of a single-adapter model does.
    * FLOPs are counted over the base model and this run's adapter only.
    * The Trainer's own progress bar and log printer are removed: the experiment shows one bar.
    """

    def __init__(self, *args: Any, rf_adapter: str | None = None, **kwargs: Any) -> None:
        self._rf_adapter = rf_adapter
        self._rf_flop_params: int | None = None
        model = kwargs.get("model", args[0] if args else None)
        with _as_if_trl_made_the_adapter(model, rf_adapter):
            super().__init__(*args, **kwargs)
        for cb in (ProgressCallback, PrinterCallback, MLflowCallback):
            self.remove_callback(cb)  # one bar for the experiment; MLflow is the engine's
        try:
            from transformers.utils.notebook import NotebookProgressCallback

            self.remove_callback(NotebookProgressCallback)
        except ImportError:  # pragma: no cover - notebook extras missing
            pass

    def _rf_step_multiple(self) -> int:
        """Chunk boundaries fall on multiples of this many optimizer steps (GRPO: whole
        generation cycles)."""
        return 1

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's ``save_model``; under FSDP with a sharded state dict it saves the
        gathered weights (transformers writes nothing there: the shards are in checkpoints),
        as with ``FULL_STATE_DICT``, so a run's final folder always holds its adapter."""
        if not _internal_call and _fsdp_sharded_state_dict(self):
            state_dict = self.accelerator.get_state_dict(self.model)  # a collective
            self._save(output_dir if output_dir is not None else self.args.output_dir,
                       state_dict=state_dict)
            return
        super().save_model(output_dir, _internal_call=_internal_call)

    def _rf_warm_start_from(self, checkpoint: Path) -> None:
        """Inside ``train()``, before the first step: start from the weights and optimizer
        moments in another run's boundary checkpoint (a warm clone of an FSDP run), read by the
        Trainer's own resume routines, which know FSDP's sharded and gathered layouts. The
        run keeps its own hyperparameters (the optimizer's param groups), LR schedule, data
        order and step count."""
        self._load_from_checkpoint(str(checkpoint), self.model_wrapped)
        own_groups = [{k: v for k, v in g.items() if k != "params"}
                      for g in self.optimizer.param_groups]
        schedule = copy.deepcopy(self.lr_scheduler.state_dict())
        self._load_optimizer_and_scheduler(str(checkpoint))
        for group, own in zip(self.optimizer.param_groups, own_groups):
            group.update(own)
        self.lr_scheduler.load_state_dict(schedule)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        adapter = self._rf_adapter
        if adapter is None:
            return super()._save(output_dir, state_dict)
        model = self.model
        save_all = model.save_pretrained

        def save_own_adapter(save_directory: str, **kwargs: Any) -> None:
            # PEFT writes a non-"default" adapter into a subfolder named after it; write it
            # beside, then move the files to the root where a single-adapter model keeps them.
            kwargs["selected_adapters"] = [adapter]
            Path(save_directory).mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=save_directory, prefix=".rf-save-") as tmp:
                save_all(tmp, **kwargs)
                for folder in (Path(tmp) / adapter, Path(tmp)):
                    if not folder.is_dir():
                        continue
                    for f in folder.iterdir():
                        if f.is_file():
                            os.replace(f, Path(save_directory) / f.name)

        model.save_pretrained = save_own_adapter
        try:
            super()._save(output_dir, state_dict)
        finally:
            del model.save_pretrained

    def _rf_state_to_save(self) -> Any:
        """A copy of the trainer state with the stateful callbacks' states in it, as the
        Trainer's own checkpoints record them."""
        from transformers.trainer_callback import ExportableState

        state = copy.deepcopy(self.state)
        exported: dict[str, list[Any]] = {}
        for cb in self.callback_handler.callbacks + [self.control]:
            if isinstance(cb, ExportableState):
                exported.setdefault(cb.__class__.__name__, []).append(cb.state())
        for name, states in exported.items():
            state.stateful_callbacks[name] = states if len(states) > 1 else states[0]
        return state

    def _rf_save_rng(self, folder: Path, rng: Any = None) -> None:
        """The Trainer's ``rng_state*.pth`` in ``folder``: of the current random streams, or
        of ``rng`` when given (the current ones are put back after)."""
        if rng is None:
            self._save_rng_state(str(folder))
            return
        from ..switch import RngState

        now = RngState.capture()
        rng.restore()
        try:
            self._save_rng_state(str(folder))
        finally:
            now.restore()

    def _rf_save_gang_boundary(self, target: Path, rng: Any = None) -> Path:
        """A gang run's checkpoint at a chunk boundary, written now by every member together
        with the Trainer's own routines (they know FSDP: sharded or gathered weights and
        optimizer state; each member's random streams in ``rng_state_<rank>.pth``)."""
        from transformers.trainer import TRAINER_STATE_NAME

        from ..durable import write_atomically_together

        def write(tmp: Path) -> None:
            self.store_flos()
            self.save_model(str(tmp), _internal_call=True)
            self._save_optimizer_and_scheduler(str(tmp))
            self._save_scaler(str(tmp))
            self._rf_save_rng(tmp, rng)
            if self.args.should_save:
                self._rf_state_to_save().save_to_json(str(tmp / TRAINER_STATE_NAME))
                torch.save(self.args, tmp / "training_args.bin")

        return write_atomically_together(target, write)

    def _rf_save_boundary(self, target: Path, rng: Any = None) -> Callable[[], Path]:
        """Start this run's checkpoint at a chunk boundary; returns what finishes it.

        The layout is the Trainer's own (``train(resume_from_checkpoint=target)`` reads it),
        without what ``_save_checkpoint`` adds around it (rotating the user's checkpoints,
        pushing to the Hub, best-model bookkeeping, the tokenizer and PEFT's model card).

        Called in the run's turn: what can change later is captured now (references to the
        adapter weights and optimizer state, which only this run's next turn changes; copies
        of the small rest) and the random streams are written. The returned function writes
        those and renames the folder to ``target`` (atomically); it may run on another thread
        while other runs train, because this run's tensors do not change until its next turn,
        which waits for it. A full fine-tuning run's weights are written now.

        ``rng``: the random streams to record, when they are not the current ones (a boundary
        at an epoch end must record them as they were before the next epoch shuffled its data,
        which is where the Trainer puts them back on resume).
        """
        from safetensors.torch import save_file
        from transformers.trainer import TRAINER_STATE_NAME

        tmp = start_folder(target)
        try:
            self.store_flos()
            model = self.model
            adapter = self._rf_adapter
            if adapter is None:
                self.save_model(str(tmp), _internal_call=True)
                weights = None
            else:
                from peft import get_peft_model_state_dict

                weights = get_peft_model_state_dict(model, adapter_name=adapter)
                model.peft_config[adapter].save_pretrained(str(tmp))
            optimizer = self.optimizer.state_dict()
            scheduler = copy.deepcopy(self.lr_scheduler.state_dict())
            self._save_scaler(str(tmp))
            self._rf_save_rng(tmp, rng)
            state = self._rf_state_to_save()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

        def finish() -> Path:
            try:
                if weights is not None:
                    save_file({k: v.contiguous() for k, v in weights.items()},
                              str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
                torch.save(optimizer, tmp / "optimizer.pt")
                torch.save(scheduler, tmp / "scheduler.pt")
                torch.save(self.args, tmp / "training_args.bin")
                state.save_to_json(str(tmp / TRAINER_STATE_NAME))
                return commit_folder(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise

        return finish

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        # The Trainer's estimate (6 x input tokens x non-embedding parameters), counting this
        # run's adapter only, as a model holding just that adapter would.
        main_input = getattr(self.model, "main_input_name", "input_ids")
        if self._rf_adapter is None or main_input not in inputs:
            return super().floating_point_ops(inputs)
        if self._rf_flop_params is None:
            self._rf_flop_params = _count_params_of(self.model, self._rf_adapter)
        return 6 * inputs[main_input].numel() * self._rf_flop_params


def _fsdp_sharded_state_dict(trainer: Any) -> bool:
    """Whether ``trainer`` is an FSDP trainer whose checkpoints hold weights per shard."""
    if not getattr(trainer, "is_fsdp_enabled", False):
        return False
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    return plugin is not None and "FULL_STATE_DICT" not in str(plugin.state_dict_type)


@contextlib.contextmanager
def _as_if_trl_made_the_adapter(model: Any, adapter: str | None) -> Any:
    """Build a TRL trainer on the shared model as if it had wrapped the model itself.

    Given a ``PeftModel`` and no reference model, DPO and GRPO assume the user brought a
    *pretrained* adapter named ``"default"`` and add a frozen copy of it, ``"ref"``, as the
    reference. A plain trainer given ``peft_config`` creates the adapter itself and uses the
    base model (adapters disabled) as the reference. The run's adapter is the latter kind, so
    for the length of the trainer's construction ``"default"`` names it and adding ``"ref"`` is
    skipped: the reference is the shared base model, with no per-run copy.
    """
    if adapter is None or not hasattr(model, "peft_config"):
        yield
        return
    configs = model.peft_config
    added = "default" not in configs
    if added:
        configs["default"] = configs[adapter]
    model.add_adapter = lambda *args, **kwargs: None
    try:
        yield
    finally:
        del model.add_adapter
        if added:
            del configs["default"]


def _count_params_of(peft_model: Any, adapter: str) -> int:
    """What ``num_parameters(exclude_embeddings=True)`` gives on a model holding only
    ``adapter``: the base model's non-embedding weights plus that adapter's."""
    others = {
        id(p) for name in peft_model.peft_config if name != adapter
        for p in adapter_params(peft_model, name)
    }
    embeddings = {
        id(m.weight) for m in peft_model.modules() if isinstance(m, torch.nn.Embedding)
    }
    return sum(p.numel() for p in peft_model.parameters()
               if id(p) not in others and id(p) not in embeddings)


def _copy_callbacks(callbacks: Sequence[Any] | None) -> list[Any] | None:
    if callbacks is None:
        return None
    out = []
    for cb in callbacks:
        if isinstance(cb, type):
            out.append(cb)  # a class: each trainer instantiates its own
            continue
        try:
            out.append(copy.deepcopy(cb))
        except Exception as err:
            raise TypeError(
                f"Callback {cb!r} cannot be copied ({type(err).__name__}: {err}); every run "
                "needs its own copy so runs do not share callback state. Make it copyable "
                "with copy.deepcopy, or pass its class instead of an instance."
            ) from err
    return out


class RFTrainerMixin:
    """The experiment-level trainer. Subclasses set :attr:`_run_trainer_class` and call
    :meth:`_rf_setup` from ``__init__``."""

    _run_trainer_class: type
    _rf_default_suffix: str = "RF"

    # ------------------------------------------------------------------ construction

    def _rf_setup(self, **kwargs: Any) -> None:
        """Set the experiment up (``_rf_setup_runs``), leaving accelerate's process-global state
        as the script had it: each run's trainer keeps its own snapshot of it."""
        with left_as_found():
            self._rf_setup_runs(**kwargs)

    def _rf_setup_runs(
        self,
        *,
        args: Any,
        search: Search | None,
        knob_args: dict[str, Any],
        shared_args: dict[str, Any],
        policy: Any = None,
    ) -> None:
        policy = as_policy(policy)  # a bad policy fails before anything loads
        if search is None:
            search = GridSearch()
        if not isinstance(search, Search):
            raise TypeError(
                f"`search` must be GridSearch() or RandomSearch(...), got {search!r}."
            )
        self.args = args
        self.search = search
        self._rf_raw_args = args.raw_values() if isinstance(args, RFConfigMixin) else {}
        specs = search.expand(args, **knob_args)
        self._rf_check(specs, shared_args)

        out = Path(args.output_dir)
        self._rf_cache = StateCache(
            getattr(args, "cache_budget_bytes", 4 * 2**30), out / ".rapidfire" / "cache"
        )
        self._rf_pool = ModelPool()
        # Opening the shared state checks the runs against an experiment already in this
        # output_dir (a re-run continues it; other configs are refused) before any model loads.
        try:
            store = FileStore(out / ".rapidfire", _fingerprint(specs, shared_args))
        except StoreError as err:
            raise RFConfigError(str(err)) from None
        self._rf_engine = Engine(
            out, self._rf_cache, progress=not args.disable_tqdm, pool=self._rf_pool,
            store=store,
        )
        self._rf_engine.rebuild = self._rf_rebuild
        self._rf_engine.policy = policy
        self._rf_best: str | None = None
        self._rf_shared = shared_args
        self._rf_knob_args = knob_args
        self._rf_specs: dict[str, RunSpec] = {}
        self._rf_engine.clone_builder = self._rf_clone
        if _tracks_to_mlflow(args):
            from ..tracking import Tracker

            tracker = Tracker(out)
            self._rf_engine.tracker = tracker
            print(  # noqa: T201 - the user needs this to open the dashboard
                f"trl-rapidfire: tracking to {tracker.uri} (experiment "
                f"{tracker.experiment_name!r}); dashboard: trl-rapidfire dashboard"
            )
        for spec in specs:
            try:
                self._rf_add_run(spec, shared_args)
            except RFConfigError:
                raise  # the setup itself is wrong: say so before anything trains
            except Exception as err:  # noqa: BLE001 - e.g. a user formatting function raised
                self._rf_engine.add_failed_run(
                    name=spec.name, index=spec.index, knobs=spec.knobs, error=err,
                    run_dir=Path(self.args.output_dir) / "runs" / spec.name, group=None,
                )
        if all(s.trainer is None for s in self._rf_engine.slots.values()):
            detail = "\n".join(f"  {s.name}: {s.error}" for s in self._rf_engine.slots.values())
            raise RunFailure(f"No run could be set up:\n{detail}")

    def _rf_check(self, specs: Sequence[RunSpec], shared_args: dict[str, Any]) -> None:
        optimizers = shared_args.get("optimizers")
        if len(specs) > 1 and optimizers is not None and any(o is not None for o in optimizers):
            raise ValueError(
                "`optimizers=(optimizer, scheduler)` is one optimizer bound to one model's "
                "parameters; with several runs each needs its own. Use "
                "`optimizer_cls_and_kwargs=(cls, kwargs)` or the config's `optim` instead."
            )
        for spec in specs:
            chunk_eval = self._rf_strategy(spec, "eval_strategy") == CHUNK
            if chunk_eval and shared_args.get("eval_dataset") is None:
                raise RFConfigError(
                    f"{spec.name}: eval_strategy='chunk' evaluates every run at each chunk end "
                    "and needs an eval_dataset; pass eval_dataset=... or use eval_strategy='no'."
                )
        _copy_callbacks(shared_args.get("callbacks"))  # fail before any model is loaded

    def _rf_strategy(self, spec: RunSpec, name: str) -> Any:
        """The run's ``eval_strategy``/``save_strategy`` as the user wrote it (``"chunk"`` is
        turned into ``"no"`` in the TRL config: the engine does the chunk-time work)."""
        return spec.knobs.get(name, self._rf_raw_args.get(name))

    def _rf_add_run(
        self, spec: RunSpec, shared: dict[str, Any], tags: dict[str, str] | None = None
    ) -> Any:
        self._rf_specs[spec.name] = spec
        config = spec.config
        run_dir = Path(self.args.output_dir) / "runs" / spec.name
        config.output_dir = str(run_dir)
        if is_gang_config(config):
            return self._rf_add_gang_run(spec, run_dir, tags)
        model = spec.trainer_kwargs["model"]
        peft_config = spec.trainer_kwargs.get("peft_config")
        init_kwargs = dict(config.model_init_kwargs or {})
        quantization_config = shared.get("quantization_config")
        if quantization_config is not None and isinstance(model, str):
            init_kwargs["quantization_config"] = quantization_config
        group = self._rf_pool.group(
            model,
            peft_config=peft_config,
            model_init_kwargs=init_kwargs,
            trust_remote_code=config.trust_remote_code,
        )
        group.runs.append(spec.name)
        if isinstance(model, str):
            config.model_init_kwargs = None  # loaded once by the pool, not by each trainer
        _check_group_agrees(group, spec.name, config)
        if config.neftune_noise_alpha is not None and len(group.runs) > 1:
            raise RFConfigError(
                f"{spec.name}: neftune_noise_alpha adds a hook to the shared base model's "
                "embeddings for the length of train(), which would leak into the other runs "
                "sharing it. Compare NEFTune settings in separate experiments for now."
            )
        if spec.trainer_kwargs.get("processing_class") is None and group.processing_class is None:
            group.processing_class = _load_processing_class(group.base, config)

        if peft_config is not None:
            adapter = adapter_name(spec.index)
            params = group.add_adapter(adapter, peft_config, seed=config.seed)
            group.model.set_adapter(adapter)
            resident = True
        else:
            adapter = None
            params = [p for p in group.model.parameters() if p.requires_grad]
            if len(group.runs) == 2 and group.initial_weights is None:
                # A second full fine-tuning run of this model: keep the starting weights, each
                # later run starts from a copy of them.
                group.initial_weights = [p.detach().to("cpu", copy=True) for p in params]
            resident = len(group.runs) == 1

        trainer = self._rf_build_trainer(spec, group, adapter)
        slot = self._rf_engine.add_run(
            name=spec.name,
            index=spec.index,
            knobs=spec.knobs,
            trainer=trainer,
            group=group,
            adapter=adapter,
            params=params,
            num_chunks=self._rf_raw_args.get("num_chunks", 1),
            run_dir=run_dir,
            chunk_eval=self._rf_strategy(spec, "eval_strategy") == CHUNK,
            chunk_save=self._rf_strategy(spec, "save_strategy") == CHUNK,
        )
        slot.residency.resident = resident
        self._rf_track(spec, tags)
        return slot

    def _rf_add_gang_run(self, spec: RunSpec, run_dir: Path,
                         tags: dict[str, str] | None = None) -> Any:
        """An FSDP run: trained by all workers of the launch together, as plain TRL trains
        it under ``accelerate launch`` (its own model, loaded and sharded by its trainer; no
        sharing with the single-device runs)."""
        worker = current_worker()
        if not worker.launched:
            raise RFConfigError(
                f"{spec.name} sets fsdp: an FSDP run is trained by all the workers of a launch "
                "together. Start the script with `accelerate launch --num_processes N` (or "
                "torchrun), N >= 2, or remove fsdp/fsdp_config to train it on one device."
            )
        if not isinstance(spec.trainer_kwargs.get("model"), str):
            raise RFConfigError(
                f"{spec.name} sets fsdp: pass the model as a name or path, so that its trainer "
                "loads and shards its own copy."
            )
        saved = snapshot_accelerate_state()
        try:
            # Its trainer and accelerate state belong to the launch's world; the engine keeps
            # that state with the run and puts it back at each of its turns.
            with in_launch_world():
                trainer = self._rf_build_gang_trainer(spec)
                slot = self._rf_engine.add_run(
                    name=spec.name, index=spec.index, knobs=spec.knobs, trainer=trainer,
                    group=None, adapter=None, params=[],
                    num_chunks=self._rf_raw_args.get("num_chunks", 1), run_dir=run_dir,
                    chunk_eval=self._rf_strategy(spec, "eval_strategy") == CHUNK,
                    chunk_save=self._rf_strategy(spec, "save_strategy") == CHUNK,
                    gang=worker.world_size,
                )
        finally:
            restore_accelerate_state(saved)
        self._rf_track(spec, tags)
        return slot

    def _rf_track(self, spec: RunSpec, tags: dict[str, str] | None) -> None:
        tracker = self._rf_engine.tracker
        if tracker is not None:
            params = dict(spec.config.to_dict())
            params.update({k: describe_value(v) for k, v in spec.knobs.items()
                           if k not in params})
            tracker.ensure_run(spec.name, params, {"rapidfire.status": "pending", **(tags or {})})

    def _rf_build_trainer(self, spec: RunSpec, group: Any, adapter: str | None) -> Any:
        kw = dict(spec.trainer_kwargs)
        for key in ("model", "peft_config"):
            kw.pop(key, None)
        if kw.get("processing_class") is None:
            kw["processing_class"] = group.processing_class
        # The trainer moves the model to the device: make room for it there first.
        self._rf_pool.make_room(group, spec.config.device)
        # A rebuild or a clone can come right after a gang run's turn, in its world; and the
        # trainer's Accelerator must take this run's settings (its mixed precision), as it
        # does in a plain script, where the config built just before cleared the state.
        enter_world_of_one()
        fresh_accelerator_state()
        return self._run_trainer_class(
            model=group.model, args=spec.config, rf_adapter=adapter, **self._rf_trainer_kwargs(kw)
        )

    def _rf_trainer_kwargs(self, own: dict[str, Any]) -> dict[str, Any]:
        """A run's trainer arguments: the shared ones (the pool applies the quantization
        config when it loads a model), the run's own, and its own copies of the callbacks."""
        kwargs = {k: v for k, v in self._rf_shared.items() if k != "quantization_config"}
        kwargs.update(own)
        kwargs["callbacks"] = _copy_callbacks(self._rf_shared.get("callbacks"))
        return kwargs

    def _rf_build_gang_trainer(self, spec: RunSpec) -> Any:
        """A gang run's trainer, as plain TRL builds it (it loads its own model); call it in
        the launch's world (``in_launch_world``)."""
        launch_partial_state(spec.config)
        with without_barriers():
            return self._run_trainer_class(args=spec.config, rf_adapter=None,
                                           **self._rf_trainer_kwargs(spec.trainer_kwargs))

    def _rf_rebuild(self, slot: Any) -> Any:
        """A fresh trainer for a run that continues from its checkpoint (it was trained by
        another worker, or by the process before a crash), on the same model and adapter."""
        spec = self._rf_specs[slot.name]
        if slot.gang:
            with in_launch_world():
                return self._rf_build_gang_trainer(spec)
        return self._rf_build_trainer(spec, slot.group, slot.adapter)

    def _rf_clone(self, parent: Any, op: Op, *, name: str | None = None,
                  warm_from: Path | None = None, trusted: bool = True) -> Any:
        """Build the run an op ``clone``/``clone-warm`` asks for (between two chunks).

        ``trusted``: the op is the script's own (a Python call, a policy); an op from a tag,
        the CLI or the state file may change training hyperparameters only, plus what the
        config's ``clone_overrides`` allows (see :mod:`trl_rapidfire.trust`)."""
        spec = self._rf_specs.get(parent.name)
        if spec is None:
            raise OpError(f"{parent.name} never had a trainer; it cannot be cloned")
        config_fields = (self.args.raw_values() if isinstance(self.args, RFConfigMixin)
                         else {f.name: getattr(self.args, f.name)
                               for f in dataclasses.fields(self.args)})
        knob_specs = dict(getattr(self.args, "knobs", {}))
        knob_specs.update({k: v for k, v in self._rf_knob_args.items() if is_knob(v)})
        overrides = resolve_overrides(
            op.overrides, parent.knobs, knob_specs, config_fields, spec.trainer_kwargs,
            untrusted=not trusted, allowed=tuple(getattr(self.args, "clone_overrides", None) or ()),
            config_class=type(self.args),
        )
        knobs = {**parent.knobs, **overrides}
        trainer_kwargs = {**spec.trainer_kwargs,
                          **{k: v for k, v in overrides.items() if k in spec.trainer_kwargs}}
        if name is None:
            name = f"run-{max(s.index for s in self._rf_engine.slots.values()) + 1}"
        index = int(name.rsplit("-", 1)[1])
        if op.warm and warm_from is None:
            if parent.state.chunks_done == 0:
                raise OpError(f"{parent.name} has not finished a chunk yet: nothing to warm-start "
                              "from; use `clone`, or wait for its first chunk")
            _check_warm_start(parent.name, spec.trainer_kwargs, trainer_kwargs)
        choices = {k: v for k, v in knobs.items() if k not in spec.trainer_kwargs}
        try:
            if isinstance(self.args, RFConfigMixin):
                config = self.args.concrete_config(choices)
            else:
                with preserved_accelerate_state():
                    config = dataclasses.replace(copy.deepcopy(self.args), **choices)
            check_run(config, trainer_kwargs)
        except (RFConfigError, PreflightError, KnobError, ValueError, TypeError) as err:
            raise OpError(f"invalid clone of {parent.name}: {err}") from None
        if op.warm and bool(parent.gang) != is_gang_config(config):
            raise OpError(f"{parent.name}: a warm start between an FSDP run and a single-device "
                          "run is not supported (the one's weights and moments are sharded over "
                          "the gang, the other's are whole); use `clone`, or keep the parent's "
                          "fsdp settings")
        new_spec = RunSpec(name=name, index=index, knobs=knobs, config=config,
                           trainer_kwargs=trainer_kwargs)
        tags = {"rapidfire.parent": parent.name, "rapidfire.warm_start": str(op.warm).lower()}
        try:
            slot = self._rf_add_run(new_spec, self._rf_shared, tags=tags)
        except Exception as err:  # noqa: BLE001 - reported as the op's result
            self._rf_undo_run(name)
            raise OpError(f"could not build {name}: {type(err).__name__}: {err}") from None
        slot.state.parent = parent.name
        slot.state.warm_start = op.warm
        if op.warm:
            self._rf_warm_start(slot, parent, warm_from)
        return slot

    def _rf_undo_run(self, name: str) -> None:
        """Take back a run whose build failed half-way (its adapter, its group entry)."""
        self._rf_specs.pop(name, None)
        self._rf_engine.slots.pop(name, None)
        for group in self._rf_pool.groups.values():
            if name in group.runs:
                group.runs.remove(name)
            group.delete_adapter(adapter_name(int(name.rsplit("-", 1)[1])))

    def _rf_warm_start(self, slot: Any, parent: Any, warm_from: Path | None = None) -> None:
        if slot.gang:
            # Its parent's checkpoint as of now, kept for the clone (the parent's own copy is
            # pruned as it trains on); every member loads it in the clone's first turn.
            if warm_from is None:
                engine = self._rf_engine
                warm_from = link_folder(engine.last_checkpoint(parent), engine.warm_dir(slot.name))
            slot.warm_checkpoint = Path(warm_from)
            return
        if warm_from is not None:  # made by another worker, or before a re-run
            tree = load_tree(warm_from)
            values, states = list(tree["params"]), list(tree["optimizer"])
        else:
            values, states = self._rf_engine.parent_state(parent)
            slot.warm_state_tree = {"params": values, "optimizer": states}
        params = slot.residency.params
        shapes = [tuple(p.shape) for p in params]
        if shapes != [tuple(v.shape) for v in values]:
            self._rf_undo_run(slot.name)
            raise OpError(f"warm start of {slot.name} from {parent.name}: the trainable "
                          "parameters' shapes differ (adapter rank, targets or model changed); "
                          "use `clone` to train it from scratch")
        if slot.residency.resident:
            with torch.no_grad():
                for p, v in zip(params, values):
                    p.data.copy_(v.to(p.device))
        else:
            # Full fine-tuning: the clone's weights are swapped in at its first turn.
            slot.residency.park_values(self._rf_cache, values)
        slot.warm_optimizer_state = states

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
        ``run``'s weights. Same syntax as the ``clone`` op (see :mod:`trl_rapidfire.control`)."""
        verb = "clone-warm" if warm else "clone"
        self._rf_engine.queue_op(run, f"{verb} {json.dumps(overrides or {})}")

    @property
    def op_log(self) -> list[OpRecord]:
        """Every op applied or rejected so far (also in ``<output_dir>/ops.csv``)."""
        return list(self._rf_engine.op_log)

    # ------------------------------------------------------------------ training

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
        and :attr:`training` says whether it is still going.
        """
        if self.training:
            raise RuntimeError("this experiment is already training in the background; "
                               "call wait() first")
        self._rf_check_train_args(resume_from_checkpoint, trial)
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
        return self._rf_train()

    @property
    def training(self) -> bool:
        """Whether ``train(blocking=False)`` is still training."""
        background = getattr(self, "_rf_background", None)
        return background is not None and background[0].is_alive()

    def wait(self, timeout: float | None = None) -> TrainOutput | None:
        """Wait for ``train(blocking=False)`` to end and return its result (the best run's
        ``TrainOutput``), or raise its error. With ``timeout`` (seconds), returns ``None`` if
        it is still training then. Interrupting the wait (Ctrl-C, a notebook's stop button)
        asks the experiment to stop at its next chunk boundary, as Ctrl-C does in a script."""
        background = getattr(self, "_rf_background", None)
        if background is None:
            raise RuntimeError("nothing to wait for: call train(blocking=False) first")
        thread, outcome = background
        try:
            thread.join(timeout)
        except KeyboardInterrupt:
            self._rf_engine.interrupted = True
            thread.join()
            raise
        if thread.is_alive():
            return None
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
        engine.run()
        if engine.interrupted:
            raise KeyboardInterrupt(
                "trl-rapidfire stopped at a chunk boundary; run the same script again to "
                "continue where it stopped."
            )
        failures = engine.failures()
        best = self.best_run
        if best is None:
            detail = "\n".join(f"  {name}: {err}" for name, err in failures.items())
            raise RunFailure(f"Every run failed:\n{detail}")
        if failures:
            names = ", ".join(f"{n} ({e})" for n, e in failures.items())
            warnings.warn(f"{len(failures)} run(s) failed: {names}", RuntimeWarning, stacklevel=2)
        self._rf_best = best.name
        engine.activate(best.name)
        return engine.slots[best.name].train_output

    # ------------------------------------------------------------------ results

    @property
    def runs(self) -> list[RunResult]:
        """Every run: name, knobs, status, global step, output folder, latest metrics."""
        return self._rf_engine.results()

    @property
    def best_run(self) -> RunResult | None:
        """The best run by ``metric_for_best_model``/``greater_is_better`` (default: eval loss
        if every run was evaluated, else the latest training loss)."""
        metric = getattr(self.args, "metric_for_best_model", None)
        greater = getattr(self.args, "greater_is_better", None) if metric else None
        return pick_best(self.runs, metric, greater)

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
        """The live TRL trainer of run ``name`` (for inspection)."""
        return self._rf_engine.slots[name].trainer

    def _rf_current_slot(self) -> Any:
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
            if slot.accelerate is not None:
                restore_accelerate_state(slot.accelerate)
            yield slot.trainer

    # ------------------------------------------------------------------ the best run's face

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the best run's adapter (or model) only, to ``output_dir`` (default: the
        experiment's ``output_dir``), in the layout its plain TRL trainer would write."""
        target = output_dir if output_dir is not None else self.args.output_dir
        with self._rf_as_current() as trainer:
            trainer.save_model(target, _internal_call=_internal_call)

    def end(self) -> None:
        """Finish every run's trackers (the Trainer's ``end()``, once per run)."""
        for slot in self._rf_engine.slots.values():
            if slot.trainer is not None and hasattr(slot.trainer, "end"):
                slot.trainer.end()

    def add_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        """Add a callback to every run (a copy each)."""
        for slot in self._rf_engine.slots.values():
            slot.trainer.add_callback(_copy_callbacks([callback])[0])

    def remove_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        """Remove a callback (by class) from every run."""
        cls = callback if isinstance(callback, type) else type(callback)
        for slot in self._rf_engine.slots.values():
            slot.trainer.remove_callback(cls)

    def pop_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> Any:
        """Remove a callback (by class) from every run; returns the best run's copy."""
        cls = callback if isinstance(callback, type) else type(callback)
        popped = [s.trainer.pop_callback(cls) for s in self._rf_engine.slots.values()]
        return popped[0] if popped else None

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this object does not have: the best run's trainer has
        # them (model, state, accelerator, processing_class, ...).
        if name.startswith("_rf") or name in ("args", "search"):
            raise AttributeError(name)
        return getattr(self._rf_current(), name)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = {n for klass in cls.__mro__ if issubclass(klass, RFTrainerMixin)
               for n in vars(klass)}
        for name in dir(cls):
            if name.startswith("_") or name in own:
                continue
            if callable(getattr(cls, name, None)) and not isinstance(getattr(cls, name), type):
                setattr(cls, name, _delegate(name))


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: RFTrainerMixin, *args: Any, **kwargs: Any) -> Any:
        with self._rf_as_current() as trainer:
            return getattr(trainer, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"``{name}`` of the best run's trainer (before ``train()``: the first run's)."
    return method


# Settings a trainer applies to the model or tokenizer it is given, not to itself: runs that
# share a base model (and its tokenizer) must agree on them, or one run's setting would leak
# into the others'.
_SHARED_SETTINGS = ("disable_dropout", "gradient_checkpointing", "activation_checkpointing",
                    "eos_token", "pad_token", "chat_template_path")


def _check_group_agrees(group: Any, run: str, config: Any) -> None:
    values = {f: getattr(config, f) for f in _SHARED_SETTINGS if hasattr(config, f)}
    first = group.settings
    if first is None:
        group.settings = (run, values)
        return
    other, theirs = first
    for field_name, value in values.items():
        if field_name in theirs and theirs[field_name] != value:
            raise RFConfigError(
                f"{run} sets {field_name}={value!r} but {other}, which shares its base model, "
                f"sets {field_name}={theirs[field_name]!r}. The trainer applies it to the "
                "shared model or tokenizer, so runs of one model must agree: make it a single "
                "value, or give these runs different models."
            )


# Config fields that name places or secrets, not training: they may differ between two
# launches of the same experiment.
_NOT_FINGERPRINTED = frozenset({"output_dir", "logging_dir", "hub_token", "run_name",
                                "push_to_hub_token", "hub_model_id", "report_to",
                                "disable_tqdm", "dataloader_num_workers"})


def _fingerprint(specs: Sequence[RunSpec], shared: dict[str, Any]) -> str:
    """Identifies the expanded runs: their names, knobs and concrete configs, and the data.

    A re-run on the same ``output_dir`` must expand to the same runs to continue them."""
    import hashlib

    def describe(value: Any) -> Any:
        return describe_value(value) if not isinstance(value, (str, int, float, bool)) else value

    doc = []
    for spec in specs:
        config = {k: v for k, v in spec.config.to_dict().items() if k not in _NOT_FINGERPRINTED}
        doc.append([spec.name, {k: describe(v) for k, v in sorted(spec.knobs.items())},
                    config])
    for key in ("train_dataset", "eval_dataset"):
        data = shared.get(key)
        doc.append([key, getattr(data, "_fingerprint", None) or (
            len(data) if hasattr(data, "__len__") else type(data).__name__)])
    text = json.dumps(doc, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _tracks_to_mlflow(args: Any) -> bool:
    report_to = args.report_to
    if isinstance(report_to, str):
        report_to = [report_to]
    return bool(report_to) and ("mlflow" in report_to or "all" in report_to)


_SHAPE_FIELDS = ("peft_type", "r", "target_modules", "modules_to_save", "rank_pattern",
                 "use_dora", "layers_to_transform", "trainable_token_indices", "bias")


def _check_warm_start(parent: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    if after.get("model") is not before.get("model") and after.get("model") != before.get(
        "model"
    ):
        raise OpError(f"warm start from {parent} across a change of base model is not possible; "
                      "use `clone` to train from scratch")
    old, new = before.get("peft_config"), after.get("peft_config")
    if (old is None) != (new is None):
        raise OpError(f"warm start from {parent} between LoRA and full fine-tuning is not "
                      "possible; use `clone`")
    if old is not None:
        changed = [f for f in _SHAPE_FIELDS if getattr(old, f, None) != getattr(new, f, None)]
        if changed:
            raise OpError(f"warm start from {parent}: {changed} change the adapter's shape; "
                          "use `clone` to train it from scratch")


def _load_processing_class(base_model: Any, config: Any) -> Any:
    from transformers import AutoProcessor
    from trl.trainer.utils import get_config_model_id

    revision = (config.model_init_kwargs or {}).get("revision")
    return AutoProcessor.from_pretrained(
        get_config_model_id(base_model.config),
        revision=revision,
        trust_remote_code=config.trust_remote_code,
    )


def rf_config_from(args: Any, config_class: type, default_output_dir: str) -> Any:
    """Accept what the TRL trainer accepts as ``args``: an RF config, the TRL config, plain
    ``TrainingArguments`` (converted), or ``None`` (defaults)."""
    if args is None:
        return config_class(output_dir=default_output_dir)
    if isinstance(args, RFConfigMixin):
        return args
    if isinstance(args, config_class._trl_parent):  # a plain TRL config: one run, one chunk
        return args
    dict_args = args.to_dict()
    dict_args["hub_token"] = args.hub_token
    return config_class(**dict_args)

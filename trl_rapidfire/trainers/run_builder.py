"""Building runs on the model pool: a run's base model (loaded once per distinct model, shared
by its runs), its adapter, and its trainer; rebuilding a run's trainer to continue from its
checkpoint; and the clones control ops ask for.

:class:`RunBuilder` is the engine's :class:`~trl_rapidfire.engine.run_trainer.RunFactory`.
It builds; the engine registers what it built (:class:`~trl_rapidfire.engine.NewRun`), and
warm-starts clones itself. A run that only differs from one already built in knobs that leave
its data and its chunk plan as they are is registered planned
(:class:`~trl_rapidfire.engine.PlannedRun`) and built when it is first scheduled.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..config.configs import RFConfigError, RFConfigMixin, is_gang_config
from ..config.fields import CHUNK, POLICY
from ..config.knobs import describe_value, is_knob
from ..control.ops import Op, OpError, resolve_overrides
from ..engine import EvalCadence, NewRun, PlannedRun, RunSlot
from ..engine.chunks import ChunkPlan
from ..reports.knob_fields import dotted_params
from ..runtime.accelerate_state import World, building_in
from ..runtime.model_pool import ModelPool
from ..runtime.models import adapter_name
from ..runtime.workers import current_worker
from ..search.searches import RunSpec, Search, SearchError
from ..storage.layout import Layout, run_index
from ..tracking.tags import KNOBS_TAG
from .generation_eval import GenerationEval
from .per_run_trackers import one_stream_per_run
from .run_agreement import check_group_agrees, check_warm_start
from .run_trainer import copy_callback, copy_callbacks

__all__ = ["RunBuilder"]

# Knobs that change neither what a run's dataset preparation makes nor how many batches it
# yields: runs that differ only in these have the same chunk plan as a run already built, so
# they are registered with that plan and built at their first turn (see RunBuilder.defers).
# ``seed`` only where the data is neither shuffled nor packed (SFT's preparation reads it then).
_PLAN_NEUTRAL = frozenset({
    "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
    "warmup_ratio", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
    "max_grad_norm", "optim", "optim_args", "label_smoothing_factor", "peft_config", "seed",
    "beta", "generation_config",
    # KTO's weights of its two kinds of rows, a reward model's centering of its scores: read
    # by the loss only (KTO's preparation reads the weights for a warning alone).
    "desirable_weight", "undesirable_weight", "center_rewards_coefficient",
})

# The config fields _prepare sets (what a config read before it lacks).
_PREPARED = ("output_dir", "dataloader_pin_memory", "model_init_kwargs")



class RunBuilder:
    """Builds the runs of one experiment.

    Args:
        trainer_class: the run trainer class (a TRL trainer with ``RunTrainerMixin``).
        args: the experiment's config (an RF config, or a plain TRL one).
        shared: the trainer arguments every run gets (datasets, callbacks, ...).
        knob_args: the trainer-level arguments as the user gave them (knobs included).
        pool: the shared base models.
        owner: the experiment's trainer (a run's trainer reads the attributes a user's
            subclass set on it).
        single: the experiment has one config: its run's TRL ``output_dir`` is the
            experiment's (clones get ``runs/<run>`` as always).
        tracked: the runs' configs are recorded by a tracker (MLflow's params): without one,
            they are not written out (a ``to_dict()`` of ~200 fields a run).
    """

    def __init__(self, *, trainer_class: type[Any], args: Any, shared: dict[str, Any],
                 knob_args: dict[str, Any], pool: ModelPool, owner: Any = None,
                 single: bool = False, tracked: bool = True) -> None:
        self.trainer_class = trainer_class
        self.tracked = tracked
        self.single = single
        self.owner = owner
        self.args = args
        self.raw_args = args.raw_values() if isinstance(args, RFConfigMixin) else {}
        self.shared = shared
        self.knob_args = knob_args
        self.pool = pool
        self.layout = Layout(args.output_dir)
        self.specs: dict[str, RunSpec] = {}
        # The config fields each run's TRL trainer changed in place while it was built (GRPO
        # on streamed data: dataloader_num_workers, accelerator_config).
        self.changed_in_place: dict[str, list[str]] = {}
        # The eval rows a generation eval reads, by its row limit: read once for all runs.
        self._eval_examples: dict[int | None, dict[str, Any]] = {}
        # Callbacks added to (or removed from) every run through the experiment's trainer:
        # applied in order to the trainers built afterwards (planned runs, rebuilds, clones).
        self._callback_changes: list[tuple[str, Any]] = []
        # A planned run's copies of the trainer's callbacks, taken when it is planned: as if
        # its trainer were built then (a script may change its callback objects afterwards,
        # e.g. give them a reference to the experiment's trainer, which cannot be copied).
        self._planned_callbacks: dict[str, list[Any] | None] = {}
        # Each run's model load arguments as its config gave them (the config's are cleared
        # when the pool loads the model: see _prepare).
        self._init_kwargs: dict[str, dict[str, Any]] = {}
        # Runs' configs as dicts, read before they were prepared (see read_configs).
        self._config_dicts: dict[str, dict[str, Any]] = {}

    def strategy(self, spec: RunSpec, name: str) -> Any:
        """The run's ``eval_strategy``/``save_strategy`` as the user wrote it (``"chunk"`` is
        turned into ``"no"`` in the TRL config: the engine does the chunk-time work)."""
        return self.setting(spec, name)

    def evaluation(self, spec: RunSpec) -> EvalCadence:
        """Where the engine evaluates the run (``EvalCadence.NONE``: TRL's strategy, if any)."""
        strategy = self.strategy(spec, "eval_strategy")
        return (EvalCadence.CHUNK if strategy == CHUNK else
                EvalCadence.POLICY if strategy == POLICY else EvalCadence.NONE)

    def setting(self, spec: RunSpec, name: str) -> Any:
        """The run's value of the RF config field ``name``: its knob's, else the config's."""
        return spec.knobs.get(name, self.raw_args.get(name))

    def generation(self, spec: RunSpec, scorer: Any) -> GenerationEval | None:
        """How the run is judged by what it generates (its RF-only generation fields, which
        its TRL config does not hold), or ``None`` without a ``generation_config``."""
        value = self.setting(spec, "generation_config")
        if value is None:
            return None
        max_rows = self.setting(spec, "generation_eval_rows")
        return GenerationEval.build(
            value, scorer, self.shared.get("eval_dataset"),
            reference_column=getattr(self.trainer_class, "rf_reference_column", "completion"),
            max_rows=max_rows, saved_rows=self.setting(spec, "generation_saved_rows"),
            shared_examples=self._eval_examples.setdefault(max_rows, {}),
            folder=self.layout.run_dir(spec.name), root=self.layout.output_dir,
        )

    # ------------------------------------------------------------------ building a run

    def defers(self, spec: RunSpec) -> bool:
        """Whether ``spec``'s trainer may be built at its first turn, its plan being that of
        any run of this experiment already built: an adapter run (a full fine-tuning run
        starts from the base weights as they are when it is built), not a gang, of a trainer
        whose plan comes from the dataset's length (not GRPO's generation cycles), whose
        knobs all leave the data and the plan as they are, and with nothing its build checks
        against the runs built before it (NEFTune on a shared model)."""
        config = spec.config
        return (not self.single and spec.trainer_kwargs.get("peft_config") is not None
                and getattr(self.trainer_class, "rf_builds_when_scheduled", False)
                and not is_gang_config(config) and config.neftune_noise_alpha is None
                and set(spec.knobs) <= _PLAN_NEUTRAL
                and not ("seed" in spec.knobs and (getattr(config, "packing", False)
                                                   or getattr(config, "shuffle_dataset", False))))

    def planned(self, spec: RunSpec, plan: ChunkPlan) -> PlannedRun:
        """``spec`` registered with ``plan`` (that of a run already built, see :meth:`defers`),
        to be built by :meth:`build_planned` at its first turn."""
        self.specs[spec.name] = spec
        run_dir = self._prepare(spec)
        self._planned_callbacks[spec.name] = copy_callbacks(self.shared.get("callbacks"))
        read = self._config_dicts.pop(spec.name, None)
        if read is not None:
            read.update({f: getattr(spec.config, f) for f in _PREPARED})
        return PlannedRun(plan=plan, **self._run_record(spec, run_dir, read))

    def read_configs(self, configs: dict[str, dict[str, Any]]) -> None:
        """Each run's ``config.to_dict()``, as the experiment's fingerprint read it: a planned
        run's record is made from it (with what :meth:`_prepare` sets) instead of a second
        ``to_dict()`` (~0.1 ms a run: a tenth of a second at a thousand runs)."""
        self._config_dicts = configs

    def build_planned(self, name: str) -> NewRun:
        """Build the planned run ``name`` (the engine's
        :meth:`~trl_rapidfire.engine.RunFactory.build_planned`)."""
        return self.build(self.specs[name])

    def _prepare(self, spec: RunSpec) -> Path:
        """Set in the run's config what the experiment decides rather than TRL, the same
        whether its trainer is built now or at its first turn (its config is what the
        tracker records): its TRL ``output_dir`` (returned; one config: its files where its
        TRL trainer puts them, checkpoints in output_dir), no pinned memory without an
        accelerator, and the model's load arguments taken by the pool (kept for the build)."""
        config = spec.config
        run_dir = self.layout.output_dir if self.single else self.layout.run_dir(spec.name)
        config.output_dir = str(run_dir)
        if config.dataloader_pin_memory and not _accelerator_available():
            # Nothing to pin for: torch pins nothing then, and warns each time a run's
            # DataLoader starts an epoch (the Trainer's catch_warnings re-arm the warning).
            config.dataloader_pin_memory = False
        if spec.name not in self._init_kwargs and not is_gang_config(config):
            self._init_kwargs[spec.name] = dict(config.model_init_kwargs or {})
            if isinstance(spec.trainer_kwargs.get("model"), str):
                config.model_init_kwargs = None  # loaded once by the pool, not by each trainer
        return run_dir

    def change_callbacks(self, verb: str, callback: Any) -> None:
        """Note a callback added to every run (``verb`` ``"add"``) or removed from every run
        by class (``"remove"``), for the trainers built from now on."""
        self._callback_changes.append((verb, callback))

    def build(self, spec: RunSpec) -> NewRun:
        """Load (or share) the run's model, add its adapter, build its trainer."""
        self.specs[spec.name] = spec
        config = spec.config
        run_dir = self._prepare(spec)
        if is_gang_config(config):
            return self._build_gang(spec, run_dir)
        model = spec.trainer_kwargs["model"]
        peft_config = spec.trainer_kwargs.get("peft_config")
        init_kwargs = dict(self._init_kwargs[spec.name])
        quantization_config = self.shared.get("quantization_config")
        if quantization_config is not None and isinstance(model, str):
            init_kwargs["quantization_config"] = quantization_config
        load = self.trainer_class.rf_base_load  # the kind's model class (a reward model's)
        init_kwargs.update(load.init_kwargs)
        group = self.pool.group(model, peft_config=peft_config, model_init_kwargs=init_kwargs,
                                trust_remote_code=config.trust_remote_code,
                                architecture=load.architecture,
                                seed=config.seed if load.seeded else None)
        group.runs.append(spec.name)
        check_group_agrees(group, spec.name, config)
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
            # Active, and the only adapter in the model's module tree: building the next
            # run walks the base model and two adapters, not every run's (see models.py).
            group.activate(adapter)
            resident = True
        else:
            adapter = None
            params = [p for p in group.model.parameters() if p.requires_grad]
            if len(group.runs) == 2 and group.initial_weights is None:
                # A second full fine-tuning run of this model: keep the starting weights, each
                # later run starts from a copy of them.
                group.initial_weights = [p.detach().to("cpu", copy=True) for p in params]
            resident = len(group.runs) == 1
        trainer = self._trainer(spec, group, adapter)
        return self._new_run(spec, trainer, run_dir, group=group, adapter=adapter,
                             params=params, resident=resident)

    def _build_gang(self, spec: RunSpec, run_dir: Path) -> NewRun:
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
        trainer = self._gang_trainer(spec)
        return self._new_run(spec, trainer, run_dir, group=None, adapter=None, params=[],
                             resident=False, gang=worker.world_size)

    def _new_run(self, spec: RunSpec, trainer: Any, run_dir: Path, **fields: Any) -> NewRun:
        return NewRun(trainer=trainer, **self._run_record(spec, run_dir), **fields)

    def _run_record(self, spec: RunSpec, run_dir: Path,
                    config_dict: dict[str, Any] | None = None) -> dict[str, Any]:
        """What the engine records of a run, built or planned (a NewRun's and a PlannedRun's
        fields but the trainer's own)."""
        tracked = ({} if not self.tracked else config_dict if config_dict is not None
                   else dict(spec.config.to_dict()))
        generation = self.setting(spec, "generation_config")
        if self.tracked and generation is not None and "generation_config" not in spec.knobs:
            tracked["generation_config"] = describe_value(generation)
        if self.tracked:
            tracked.update({k: describe_value(v) for k, v in spec.knobs.items()
                            if k not in tracked})
            # A LoRA config's rank or alpha as a param of its own: MLflow's runs table then
            # shows the field that differs as its own column (client/dashboard.py's view).
            described = {k: tracked[k] for k in spec.knobs if isinstance(tracked.get(k), str)}
            tracked.update({k: v for k, v in dotted_params(described).items()
                            if k not in tracked})
        return dict(
            name=spec.name, index=spec.index, knobs=spec.knobs,
            num_chunks=self.raw_args.get("num_chunks", 1), run_dir=run_dir,
            evaluation=self.evaluation(spec),
            chunk_save=self.strategy(spec, "save_strategy") == CHUNK, tracked=tracked,
            tags={KNOBS_TAG: json.dumps(sorted(spec.knobs))[:5000]},
        )

    def _trainer(self, spec: RunSpec, group: Any, adapter: str | None) -> Any:
        kw = dict(spec.trainer_kwargs)
        for key in ("model", "peft_config"):
            kw.pop(key, None)
        if kw.get("processing_class") is None:
            kw["processing_class"] = group.processing_class
        # The trainer moves the model to the device: make room for it there first.
        self.pool.make_room(group, spec.config.device)
        # With one config, what TRL changes in its config shows in trainer.args (see base.py):
        # only then is the config compared before and after (two to_dict() calls a build).
        before = spec.config.to_dict() if self.single else None
        with building_in(World.ONE):
            trainer = self.trainer_class(model=group.model, args=spec.config, rf_adapter=adapter,
                                         rf_owner=self.owner,
                                         rf_attached=(lambda: group.attached) if adapter else None,
                                         **self._trainer_kwargs(spec, kw))
        if before is not None:
            after = spec.config.to_dict()
            self.changed_in_place[spec.name] = [k for k, v in after.items()
                                                if before.get(k) != v]
        one_stream_per_run(trainer, self._stream_name(spec))
        self._apply_callback_changes(trainer)
        return trainer

    def _apply_callback_changes(self, trainer: Any) -> None:
        for verb, callback in self._callback_changes:
            if verb == "add":
                trainer.add_callback(copy_callback(callback))
            else:
                trainer.remove_callback(callback)

    def _stream_name(self, spec: RunSpec) -> str:
        """The run's name in trackers that name their runs (trackio): the experiment's (its
        folder's, or the config's ``run_name``) and the run's."""
        prefix = self.raw_args.get("run_name") or self.layout.output_dir.name
        return f"{prefix}-{spec.name}"

    def _gang_trainer(self, spec: RunSpec) -> Any:
        """A gang run's trainer, as plain TRL builds it (it loads its own model), in the
        launch's world; accelerate's state stays as the trainer left it (its run's)."""
        with building_in(World.LAUNCH, spec.config):
            trainer = self.trainer_class(args=spec.config, rf_adapter=None, rf_owner=self.owner,
                                         **self._trainer_kwargs(spec, spec.trainer_kwargs))
        one_stream_per_run(trainer, self._stream_name(spec))
        self._apply_callback_changes(trainer)
        return trainer

    def _trainer_kwargs(self, spec: RunSpec, own: dict[str, Any]) -> dict[str, Any]:
        """A run's trainer arguments: the shared ones (the pool applies the quantization
        config when it loads a model), the run's own, and its own copies of the callbacks.
        A run judged by what it generates gets its ``compute_metrics`` through its
        :class:`GenerationEval`: TRL's evaluation would call it with logits."""
        kwargs = {k: v for k, v in self.shared.items() if k != "quantization_config"}
        kwargs.update(own)
        kwargs["callbacks"] = (self._planned_callbacks.pop(spec.name)
                               if spec.name in self._planned_callbacks
                               else copy_callbacks(self.shared.get("callbacks")))
        generation = self.generation(spec, kwargs.get("compute_metrics"))
        if generation is not None:
            kwargs["compute_metrics"] = None
            kwargs["rf_generation"] = generation
        return kwargs

    # ------------------------------------------------------------------ the engine's factory

    def rebuild(self, slot: RunSlot) -> Any:
        """A fresh trainer for a run that continues from its checkpoint (it was trained by
        another worker, or by the process before a crash), on the same model and adapter."""
        spec = self.specs[slot.name]
        if slot.gang:
            return self._gang_trainer(spec)
        return self._trainer(spec, slot.group, slot.adapter)

    def clone(self, parent: RunSlot, op: Op, *, name: str, trusted: bool) -> NewRun:
        """Build the run an op ``clone``/``clone-warm`` asks for (between two chunks).

        ``trusted``: the op is the script's own (a Python call, a policy); an op from a tag,
        the CLI or the state file may change training hyperparameters only, plus what the
        config's ``clone_overrides`` allows (see :mod:`trl_rapidfire.storage.names`)."""
        spec = self.specs.get(parent.name)
        if spec is None:
            raise OpError(f"{parent.name} never had a trainer; it cannot be cloned")
        self.single = False  # the experiment has several runs from now on
        args = self.args
        config_fields = (args.raw_values() if isinstance(args, RFConfigMixin)
                         else {f.name: getattr(args, f.name) for f in dataclasses.fields(args)})
        knob_specs = dict(getattr(args, "knobs", {}))
        knob_specs.update({k: v for k, v in self.knob_args.items() if is_knob(v)})
        overrides = resolve_overrides(
            op.overrides, parent.knobs, knob_specs, config_fields, spec.trainer_kwargs,
            untrusted=not trusted, allowed=tuple(getattr(args, "clone_overrides", None) or ()),
            config_class=type(args),
        )
        knobs = {**parent.knobs, **overrides}
        try:
            new_spec = Search.build_run(name, _index_of(name), knobs, args, spec.trainer_kwargs)
        except SearchError as err:
            raise OpError(f"invalid clone of {parent.name}: {err}") from None
        if op.warm:
            check_warm_start(parent.name, spec.trainer_kwargs, new_spec.trainer_kwargs)
            if bool(parent.gang) != is_gang_config(new_spec.config):
                raise OpError(f"{parent.name}: a warm start between an FSDP run and a "
                              "single-device run is not supported (the one's weights and "
                              "moments are sharded over the gang, the other's are whole); use "
                              "`clone`, or keep the parent's fsdp settings")
        try:
            # Accelerate's state stays as the trainer's build left it: the engine records it
            # as the clone's starting point when it registers the clone.
            return self.build(new_spec)
        except Exception as err:  # noqa: BLE001 - reported as the op's result
            self.undo(name)
            raise OpError(f"could not build {name}: {type(err).__name__}: {err}") from None

    def new(self, name: str, knobs: dict[str, Any]) -> NewRun:
        """Build the run an adaptive search proposed: ``knobs`` chosen, everything else as
        the experiment's config and trainer arguments have it (what ``expand`` would have
        built). Raises :class:`~trl_rapidfire.search.searches.SearchError` for invalid values."""
        self.single = False
        spec = Search.build_run(name, _index_of(name), knobs, self.args, self.knob_args)
        try:
            return self.build(spec)
        except Exception:
            self.undo(name)
            raise

    def undo(self, name: str) -> None:
        """Take back a run whose build failed half-way (its adapter, its group entry)."""
        self.specs.pop(name, None)
        self._init_kwargs.pop(name, None)
        self._planned_callbacks.pop(name, None)
        index = run_index(name)
        for group in self.pool.groups.values():
            if name in group.runs:
                group.runs.remove(name)
            if index is not None:
                group.delete_adapter(adapter_name(index))


def _index_of(name: str) -> int:
    """The number of a run the engine named (``run-<n>``: clones and proposals are)."""
    index = run_index(name)
    if index is None:
        raise ValueError(f"{name!r} is not a run's name (run-<n>)")
    return index


def _accelerator_available() -> bool:
    """Whether torch has a device to pin host memory for (what its DataLoader checks)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return accelerator.is_available()
    return torch.cuda.is_available()


def _load_processing_class(base_model: Any, config: Any) -> Any:
    from transformers import AutoProcessor
    from trl.trainer.utils import get_config_model_id

    revision = (config.model_init_kwargs or {}).get("revision")
    return AutoProcessor.from_pretrained(
        get_config_model_id(base_model.config),
        revision=revision,
        trust_remote_code=config.trust_remote_code,
    )

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

import copy
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PrinterCallback, ProgressCallback, TrainerCallback
from transformers.trainer_utils import TrainOutput

from ..cache import StateCache
from ..configs import RFConfigError, RFConfigMixin
from ..engine import Engine, RunFailure
from ..models import ModelPool, adapter_name, adapter_params
from ..results import RunResult, pick_best
from ..schedule import ChunkRecord
from ..search import GridSearch, RunSpec, Search

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
        super().__init__(*args, **kwargs)
        for cb in (ProgressCallback, PrinterCallback):
            self.remove_callback(cb)
        try:
            from transformers.utils.notebook import NotebookProgressCallback

            self.remove_callback(NotebookProgressCallback)
        except ImportError:  # pragma: no cover - notebook extras missing
            pass

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

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        # The Trainer's estimate (6 x input tokens x non-embedding parameters), counting this
        # run's adapter only, as a model holding just that adapter would.
        main_input = getattr(self.model, "main_input_name", "input_ids")
        if self._rf_adapter is None or main_input not in inputs:
            return super().floating_point_ops(inputs)
        if self._rf_flop_params is None:
            self._rf_flop_params = _count_params_of(self.model, self._rf_adapter)
        return 6 * inputs[main_input].numel() * self._rf_flop_params


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

    def _rf_setup(
        self,
        *,
        args: Any,
        search: Search | None,
        knob_args: dict[str, Any],
        shared_args: dict[str, Any],
        build_run: Callable[[RunSpec, dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        if search is None:
            search = GridSearch()
        if not isinstance(search, Search):
            raise TypeError(
                f"`search` must be GridSearch() or RandomSearch(...), got {search!r}."
            )
        self.args = args
        self.search = search
        self._rf_raw_args = dict(getattr(args, "_rf_raw", {}))
        specs = search.expand(args, **knob_args)
        self._rf_check(specs, shared_args)

        out = Path(args.output_dir)
        self._rf_cache = StateCache(
            getattr(args, "cache_budget_bytes", 4 * 2**30), out / ".rapidfire" / "cache"
        )
        self._rf_pool = ModelPool()
        self._rf_engine = Engine(
            out, self._rf_cache, progress=not args.disable_tqdm, pool=self._rf_pool
        )
        self._rf_best: str | None = None
        self._rf_trained = False
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

    def _rf_add_run(self, spec: RunSpec, shared: dict[str, Any]) -> None:
        config = spec.config
        run_dir = Path(self.args.output_dir) / "runs" / spec.name
        config.output_dir = str(run_dir)
        kw = dict(spec.trainer_kwargs)
        model = kw.pop("model")
        peft_config = kw.pop("peft_config", None)
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
        if config.neftune_noise_alpha is not None and len(group.runs) > 1:
            raise RFConfigError(
                f"{spec.name}: neftune_noise_alpha adds a hook to the shared base model's "
                "embeddings for the length of train(), which would leak into the other runs "
                "sharing it. Compare NEFTune settings in separate experiments for now."
            )
        if kw.get("processing_class") is None:
            if group.processing_class is None:
                group.processing_class = _load_processing_class(group.base, config)
            kw["processing_class"] = group.processing_class

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

        # The trainer moves the model to the device: make room for it there first.
        self._rf_pool.make_room(group, config.device)
        trainer_kwargs = {k: v for k, v in shared.items() if k != "quantization_config"}
        trainer_kwargs.update(kw)
        trainer_kwargs["callbacks"] = _copy_callbacks(shared.get("callbacks"))
        trainer = self._run_trainer_class(
            model=group.model, args=config, rf_adapter=adapter, **trainer_kwargs
        )
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

    # ------------------------------------------------------------------ training

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        **kwargs: Any,
    ) -> TrainOutput:
        """Train every run, chunk by chunk, and return the best run's ``TrainOutput``.

        Failed runs are reported (a warning naming each) and the others finish; if every run
        fails, :class:`~trl_rapidfire.engine.RunFailure` is raised.
        """
        if resume_from_checkpoint not in (None, False):
            raise ValueError(
                "resume_from_checkpoint is not supported by RF trainers yet: re-running the "
                "experiment script will continue from the last chunk boundary once crash "
                "recovery lands (see docs/roadmap.md)."
            )
        if trial is not None:
            raise ValueError("RF trainers run their own search; `trial` is not supported.")
        if self._rf_trained:
            raise RuntimeError("train() was already called on this trainer; build a new one.")
        self._rf_trained = True
        engine = self._rf_engine
        engine.run()
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

    def _rf_current(self) -> Any:
        slots = self._rf_engine.slots
        if self._rf_best is not None:
            return slots[self._rf_best].trainer
        return next(s.trainer for s in slots.values() if s.trainer is not None)

    # ------------------------------------------------------------------ the best run's face

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the best run's adapter (or model) only, to ``output_dir`` (default: the
        experiment's ``output_dir``), in the layout its plain TRL trainer would write."""
        target = output_dir if output_dir is not None else self.args.output_dir
        self._rf_current().save_model(target, _internal_call=_internal_call)

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
        return getattr(self._rf_current(), name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"``{name}`` of the best run's trainer (before ``train()``: the first run's)."
    return method


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

"""One run's trainer: a plain TRL trainer plus :class:`RunTrainerMixin`, which implements the
engine's :class:`~trl_rapidfire.engine.run_trainer.RunTrainer` protocol (chunk plan hooks,
boundary checkpoints (:mod:`.boundary_checkpoints`), warm starts, loading another worker's
final weights) with the Trainer's own saving and loading routines."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import SequentialSampler
from transformers import PrinterCallback, ProgressCallback
from transformers.integrations import MLflowCallback

from ..runtime.model_pool import BaseModelLoad
from . import log_state
from .adapter_files import save_adapter_alone
from .boundary_checkpoints import BoundaryCheckpoints
from .generation_eval import GenerationEval

__all__ = ["RunTrainerMixin", "copy_callback", "copy_callbacks"]


class RunTrainerMixin(BoundaryCheckpoints):
    """Mixed into a TRL trainer class to make one run's trainer.

    * With a shared multi-adapter model, checkpoints and ``save_model`` write only this run's
      adapter, at the folder root, exactly as a plain trainer of a single-adapter model does.
    * FLOPs are counted over the base model and this run's adapter only.
    * The Trainer's own progress bar and log printer are removed: the experiment shows one bar.
    """

    # The TRL trainer class whose __init__ builds this run's trainer (set by run_class_for).
    rf_trl_class: type
    # Its chunk plan follows from the prepared dataset's length and the config alone, so a
    # run of it may be planned and built at its first turn (see RunBuilder.defers).
    rf_builds_when_scheduled = True
    # How its base model loads from a path (a reward model: a sequence classifier, its new
    # head drawn from the run's seed).
    rf_base_load = BaseModelLoad()

    def __init__(self, *args: Any, rf_adapter: str | None = None, rf_owner: Any = None,
                 rf_attached: Callable[[], Collection[str]] | None = None,
                 rf_generation: GenerationEval | None = None, **kwargs: Any) -> None:
        self._rf_adapter = rf_adapter
        self._rf_generation = rf_generation
        # The adapters in the shared model's module tree now (the others are detached): what
        # PEFT must tell this run's keys from when it saves. None: every adapter it knows.
        self._rf_attached = rf_attached
        self._rf_flop_params: int | None = None
        # (saved key, parameter) of this run's adapter, found at its first boundary checkpoint
        # (see _rf_adapter_state_dict); None: not yet, False: PEFT's own walk every time.
        self._rf_adapter_keys: list[tuple[str, torch.nn.Parameter]] | bool | None = None
        self.rf_owner = rf_owner
        model = kwargs.get("model", args[0] if args else None)
        config = kwargs.get("args", args[1] if len(args) > 1 else None)
        with _as_if_trl_made_the_adapter(model, rf_adapter), _without_mlflow_callback(config):
            # The TRL trainer's own __init__: the user's subclass (its __init__ included) is
            # the experiment's, and it ran once, with the arguments the user gave.
            # (On purpose the TRL class's own __init__, not this instance's class's.)
            self.rf_trl_class.__init__(self, *args, **kwargs)  # type: ignore[misc]
        for cb in (ProgressCallback, PrinterCallback, MLflowCallback):
            self.remove_callback(cb)  # one bar for the experiment; MLflow is the engine's
        try:
            from transformers.utils.notebook import NotebookProgressCallback

            self.remove_callback(NotebookProgressCallback)
        except ImportError:  # pragma: no cover - notebook extras missing
            pass
        self.add_callback(log_state.RestoreLogs(self))  # a resumed run logs as if never stopped

    def train(self, resume_from_checkpoint: Any = None, **kwargs: Any) -> Any:
        # The Trainer's, with the logs of the run before its checkpoint continued (log_state).
        log_state.arm(self, resume_from_checkpoint)
        return log_state.whole_run_output(self, super().train(resume_from_checkpoint, **kwargs))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        log_state.whole_run_train_loss(self, logs)  # a resumed run: over all its steps
        super().log(logs, start_time)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this trainer lacks: what the user's subclass set on the
        # experiment in its __init__ (``self.alpha = alpha``) its overrides read on every run.
        owner = self.__dict__.get("rf_owner")
        if owner is not None and not name.startswith("_rf") and name not in ("args", "search"):
            given = vars(owner)
            if name in given:
                return given[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """The Trainer's eval dataloader, made once per eval set whose rows come in order and
        reused at every evaluation (as the Trainer does with persistent workers).

        Each new one re-derived the eval set without its unused columns, was kept by
        accelerate and wrapped the model again: half of an evaluation of 32 rows on the tiny
        model. A kept loader yields the same batches in the same order (a sampler that draws,
        GRPO's, gets a new loader each time, as in TRL); the random draw of a new iterator is
        undone after every chunk-end evaluation, as before."""
        own = eval_dataset is None or eval_dataset is self.eval_dataset
        if not own and not isinstance(eval_dataset, str):
            return super().get_eval_dataloader(eval_dataset)  # a set given to this call
        name = "eval" if own else eval_dataset
        rows = self.eval_dataset if own else self.eval_dataset[name]
        # A streamed set has no sampler (the Trainer asks only sets with a length); one whose
        # sampler draws (GRPO's) gets a new loader each time, as in TRL.
        if isinstance(rows, torch.utils.data.IterableDataset) or not hasattr(rows, "__len__") \
                or not isinstance(self._get_eval_sampler(rows), SequentialSampler):
            return super().get_eval_dataloader(eval_dataset)
        # Made anew when what it is made of changed (trainer.eval_dataset, the batch size).
        loaders = self.__dict__.setdefault("_rf_eval_loaders", {})
        kept = loaders.get(name)
        if kept is None or kept[0] is not self.eval_dataset \
                or kept[1] != self.args.eval_batch_size:
            kept = loaders[name] = (self.eval_dataset, self.args.eval_batch_size,
                                    super().get_eval_dataloader(eval_dataset))
        return kept[2]

    def evaluation_loop(self, dataloader: Any, description: str,
                        prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None,
                        metric_key_prefix: str = "eval") -> Any:
        """The Trainer's evaluation, then, for a run judged by what it generates, its
        generation metrics (``<prefix>_<name>``) in the same metrics: logged with the loss,
        seen by ``on_evaluate`` callbacks and ``metric_for_best_model``."""
        output = super().evaluation_loop(dataloader, description, prediction_loss_only,
                                         ignore_keys, metric_key_prefix)
        if self._rf_generation is not None:
            output.metrics.update(self._rf_generation.run(self, metric_key_prefix))
        return output

    def rf_step_multiple(self) -> int:
        """Chunk boundaries fall on multiples of this many optimizer steps (GRPO: whole
        generation cycles)."""
        return 1

    def rf_num_batches(self) -> int | None:
        """Batches per epoch of the dataloader ``train()`` will build, when the dataset's
        length over the batch size is not it (GRPO); ``None``: it is."""
        return None

    def rf_stateful(self) -> list[Any]:
        """Objects shared with other runs that keep state; none by default (GRPO: stateful
        reward functions)."""
        return []

    def rf_load_final(self, folder: Path, state: Any) -> None:
        """Make the final weights in ``folder`` (another worker's) and the trainer state
        ``state`` this trainer's live ones, with the Trainer's own loading routine."""
        self._load_from_checkpoint(str(folder))
        self.state = state

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

    def rf_warm_start_from(self, checkpoint: Path) -> None:
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
            attached = self._rf_attached() if self._rf_attached is not None else None
            save_adapter_alone(save_all, model, adapter, attached, Path(save_directory),
                               **kwargs)

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


def _fsdp_sharded_state_dict(trainer: Any) -> bool:
    """Whether ``trainer`` is an FSDP trainer whose checkpoints hold weights per shard."""
    if not getattr(trainer, "is_fsdp_enabled", False):
        return False
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    return plugin is not None and "FULL_STATE_DICT" not in str(plugin.state_dict_type)


@contextlib.contextmanager
def _without_mlflow_callback(config: Any) -> Iterator[None]:
    """``config.report_to`` without MLflow while the Trainer builds its callbacks.

    The engine tracks every run to MLflow itself (each run's ``MLflowCallback`` was removed
    right after it was made), and making one imports mlflow: about a second on the path to
    the first chunk, which the tracker pays on its own thread instead. The config is given
    back as it was."""
    report_to = getattr(config, "report_to", None)
    listed = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "all" in listed:
        from transformers.integrations import get_available_reporting_integrations

        listed = [name for name in listed if name != "all"]
        listed += get_available_reporting_integrations()
    if "mlflow" not in listed:
        yield
        return
    config.report_to = [name for name in dict.fromkeys(listed) if name != "mlflow"]
    try:
        yield
    finally:
        config.report_to = report_to


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
    ``adapter``: the base model's non-embedding weights plus that adapter's, in one walk (the
    other runs' adapters are usually detached; any still attached are skipped by name)."""
    others = set(peft_model.peft_config) - {adapter}
    embeddings = {
        id(m.weight) for m in peft_model.modules() if isinstance(m, torch.nn.Embedding)
    }
    return sum(p.numel() for name, p in peft_model.named_parameters()
               if id(p) not in embeddings and others.isdisjoint(name.split(".")))


def copy_callback(callback: Any) -> Any:
    """A run's own copy of ``callback``: a class as it is (each trainer instantiates its own),
    an instance deep-copied, so runs do not share callback state."""
    if isinstance(callback, type):
        return callback
    try:
        return copy.deepcopy(callback)
    except Exception as err:
        raise TypeError(
            f"Callback {callback!r} cannot be copied ({type(err).__name__}: {err}); every run "
            "needs its own copy so runs do not share callback state. Make it copyable "
            "with copy.deepcopy, or pass its class instead of an instance."
        ) from err


def copy_callbacks(callbacks: Sequence[Any] | None) -> list[Any] | None:
    """Each run's own copies of a trainer's ``callbacks`` (see :func:`copy_callback`)."""
    if callbacks is None:
        return None
    return [copy_callback(cb) for cb in callbacks]

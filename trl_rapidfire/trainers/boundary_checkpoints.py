"""A run's checkpoint at a chunk boundary, in the Trainer's own layout
(``train(resume_from_checkpoint=...)`` reads it): what is captured in the run's turn, and what a
writer thread may finish while other runs train. Mixed into every run's trainer through
:class:`~.run_trainer.RunTrainerMixin`."""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..storage.checkpoints import start_folder
from . import log_state
from .adapter_files import attached_configs_only

__all__ = ["BoundaryCheckpoints"]

# Only ever mixed into a TRL trainer: for the type checker its base is the Trainer.
if TYPE_CHECKING:
    from transformers import Trainer as _TrainerBase
else:
    _TrainerBase = object


class BoundaryCheckpoints(_TrainerBase):
    """Writing a run's state at a chunk boundary (single-device and gang runs)."""

    # Set by RunTrainerMixin.__init__.
    _rf_adapter: str | None
    _rf_attached: Callable[[], Any] | None
    _rf_adapter_keys: list[tuple[str, torch.nn.Parameter]] | bool | None

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
        from ..runtime.switch import RngState

        now = RngState.capture()
        rng.restore()
        try:
            self._save_rng_state(str(folder))
        finally:
            now.restore()

    def rf_save_gang_boundary(self, target: Path, rng: Any = None) -> Path:
        """A gang run's checkpoint at a chunk boundary, written now by every member together
        with the Trainer's own routines (they know FSDP: sharded or gathered weights and
        optimizer state; each member's random streams in ``rng_state_<rank>.pth``)."""
        from transformers.trainer import TRAINER_STATE_NAME

        from ..storage.checkpoints import write_atomically_together

        def write(tmp: Path) -> None:
            self.store_flos()
            self.save_model(str(tmp), _internal_call=True)
            self._save_optimizer_and_scheduler(str(tmp))
            self._save_scaler(str(tmp))
            self._rf_save_rng(tmp, rng)
            log_state.write_into(self, tmp)  # each member's own
            if self.args.should_save:
                self._rf_state_to_save().save_to_json(str(tmp / TRAINER_STATE_NAME))
                torch.save(self.args, tmp / "training_args.bin")

        return write_atomically_together(target, write)

    def rf_save_boundary(self, target: Path, rng: Any = None) -> Callable[[], Path]:
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
        from safetensors.torch import save as safetensors_bytes
        from transformers.trainer import TRAINER_STATE_NAME

        # Written by path into a fresh folder held by descriptor (storage/write_path.py): a
        # folder above swapped for a link meanwhile cannot redirect it; the commit names it.
        folder = start_folder(target)
        tmp = folder.path
        try:
            self.store_flos()
            model = self.model
            adapter = self._rf_adapter
            weights: bytes | None = None
            if adapter is None:
                self.save_model(str(tmp), _internal_call=True)
            else:
                tensors = self._rf_adapter_state_dict()
                model.peft_config[adapter].save_pretrained(str(tmp))
                # Serialized here, in the turn: serializing holds the GIL for tens of
                # milliseconds at a time (torch.save of an optimizer's 700 tensors at a 135M
                # model's shape: the training thread ran at a sixth of its speed beside it).
                # The writer thread is left the file writes, which release it.
                weights = safetensors_bytes({k: v.contiguous() for k, v in tensors.items()},
                                            metadata={"format": "pt"})
            files = {"optimizer.pt": _torch_bytes(self.optimizer.state_dict()),
                     "scheduler.pt": _torch_bytes(self.lr_scheduler.state_dict()),
                     "training_args.bin": _torch_bytes(self.args),
                     **log_state.checkpoint_files(self)}
            self._save_scaler(str(tmp))
            self._rf_save_rng(tmp, rng)
            state = self._rf_state_to_save()
        except BaseException:
            folder.discard()
            raise

        def finish() -> Path:
            try:
                if weights is not None:
                    (tmp / "adapter_model.safetensors").write_bytes(weights)
                for name, data in files.items():
                    (tmp / name).write_bytes(data)
                state.save_to_json(str(tmp / TRAINER_STATE_NAME))
            except BaseException:
                folder.discard()
                raise
            return folder.commit()

        return finish

    def _rf_adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """What ``get_peft_model_state_dict(model, adapter_name=<this run's>)`` returns, without
        its walk over the whole shared model's state dict (every adapter of every layer: 70 ms
        at a 135M model's shape with 8 adapters) at every boundary.

        The first call asks PEFT and keeps, for each key, the parameter whose whole tensor PEFT
        returned under it; later calls read those parameters (the same objects for the run's
        life: parking swaps their data, not them). Where PEFT returned anything else (a
        buffer, a slice, a transformed tensor, a tied or shared weight), it is asked every
        time."""
        from peft import get_peft_model_state_dict

        keys = self._rf_adapter_keys
        if isinstance(keys, list):
            return {key: param.detach() for key, param in keys}
        model, adapter = self.model, self._rf_adapter
        assert adapter is not None  # only a run with an adapter saves one
        attached = self._rf_attached() if self._rf_attached is not None else None
        with attached_configs_only(model, adapter, attached):
            weights = get_peft_model_state_dict(model, adapter_name=adapter)
        if keys is None:
            self._rf_adapter_keys = _params_behind(model, weights) or False
        return weights


def _params_behind(model: torch.nn.Module,
                   weights: dict[str, torch.Tensor]) -> list[tuple[str, torch.nn.Parameter]]:
    """For each entry of ``weights``, the parameter of ``model`` that is exactly that tensor
    (same storage, offset, shape and strides); ``[]`` if any entry is not one, or if two
    entries are the same parameter."""
    by_storage: dict[tuple[int, int], list[torch.nn.Parameter]] = {}
    for param in model.parameters():
        by_storage.setdefault((param.untyped_storage().data_ptr(), param.storage_offset()),
                              []).append(param)
    found: list[tuple[str, torch.nn.Parameter]] = []
    for key, tensor in weights.items():
        same = [p for p in by_storage.get(
            (tensor.untyped_storage().data_ptr(), tensor.storage_offset()), [])
            if p.shape == tensor.shape and p.stride() == tensor.stride()
            and p.dtype == tensor.dtype and p.untyped_storage().nbytes() > 0]
        if len(same) != 1:
            return []
        found.append((key, same[0]))
    if len({id(p) for _, p in found}) != len(found):
        return []
    return found


def _torch_bytes(obj: Any) -> bytes:
    """``torch.save(obj)``'s file, in memory."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()

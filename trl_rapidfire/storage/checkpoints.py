"""Where each run's last chunk boundary lives on disk, written so a crash never leaves half of it.

At a chunk boundary (as often as ``checkpoint_every`` says: :class:`CheckpointCadence`, parsed
from the user's text by :mod:`trl_rapidfire.config.cadence`) a run writes an ordinary Hugging
Face checkpoint (adapter or model weights, ``optimizer.pt``, ``scheduler.pt``,
``rng_state.pth``, ``trainer_state.json``) into
``<output_dir>/.rapidfire/checkpoints/<run>/checkpoint-<step>``. The Trainer writes a checkpoint
folder in place, file by file; a process killed half-way would leave a folder that looks like a
checkpoint and is not one. So the folder is written under a temporary name and renamed when
complete: a ``checkpoint-<step>`` folder exists only if every file in it was written. Older
boundaries of the run are removed once the new one is in place.

Resuming is the Trainer's own ``train(resume_from_checkpoint=...)``: weights, optimizer, LR
schedule, RNG streams, the data position and the log history all come back as the Trainer
itself restores them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .atomic_folders import fsync_file as _fsync_file
from .atomic_folders import replace_folder
from .own_files import read_by_descriptor
from .write_path import FolderWrite, open_folder

__all__ = [
    "DEFAULT_CADENCE",
    "CheckpointCadence",
    "checkpoint_at",
    "latest_checkpoint",
    "prune_checkpoints",
    "remove_run_checkpoints",
    "run_state_from_checkpoint",
    "commit_folder",
    "start_folder",
    "write_atomically",
]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class CheckpointCadence:
    """When a run's boundary is made durable: after ``seconds`` of its training since its
    last durable point, or after ``chunks`` chunks (one of the two is set)."""

    seconds: float | None = None
    chunks: int | None = None

    def due(self, chunks_since: int, seconds_since: float) -> bool:
        """Whether the boundary just reached is written: ``chunks_since`` chunks and
        ``seconds_since`` seconds of the run's training since its last durable point."""
        if self.chunks is not None:
            return chunks_since >= self.chunks
        return seconds_since >= (self.seconds or 0.0)


DEFAULT_CADENCE = CheckpointCadence(seconds=60.0)



def start_folder(target: str | os.PathLike) -> FolderWrite:
    """A fresh private folder beside ``target`` to write it in: write into its ``path``, then
    ``commit()`` it (or ``discard()`` it). Its parent is reached from the experiment's root
    without a link and held by descriptor until the commit (write_path.py)."""
    return FolderWrite(target)


def commit_folder(tmp: Path, target: str | os.PathLike) -> Path:
    """Make the folder written in ``tmp`` (by name: a gang's members write it from several
    processes) appear as ``target``, whole (replacing one left by an earlier attempt).
    Returns ``target``."""
    target = Path(target)
    # The rename is what makes the folder visible; its files must be on disk before it, or a
    # power cut could leave a complete-looking folder of empty files.
    for path in tmp.rglob("*"):
        if path.is_file() and not path.is_symlink():
            _fsync_file(path)
    replace_folder(tmp, target)
    return target


def write_atomically(target: str | os.PathLike, write: Callable[[Path], object], *,
                     single_names: bool = True) -> Path:
    """Let ``write`` fill a fresh folder beside ``target`` (:class:`FolderWrite`: its parent
    held by descriptor, so nothing is written through a link swapped in meanwhile), check it
    holds no link, then rename it to ``target``.

    A ``target`` left by an earlier attempt is replaced. Returns ``target``.
    ``single_names=False``: its files may have other names too (hard links made on purpose).

    Raises:
        LinkRefused: a folder on the way is a link, or was moved or swapped while written
            (named), or ``write`` left a link in the folder.
    """
    folder = FolderWrite(target)
    try:
        write(folder.path)
    except BaseException:
        folder.discard()
        raise
    return folder.commit(single_names=single_names)


def link_folder(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    """A copy of the folder ``source`` at ``target``, made of hard links where the file
    system allows (checkpoint files are written once and never changed in place, so a link is
    as good as a copy and costs nothing), written atomically."""

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    return write_atomically(target, lambda tmp: shutil.copytree(
        source, tmp, copy_function=link_or_copy, dirs_exist_ok=True), single_names=False)


def write_atomically_together(target: str | os.PathLike,
                              write: Callable[[Path], None]) -> Path:
    """:func:`write_atomically` for the workers of a gang (one distributed job): each writes
    its part (its random streams, its shard) into one shared temporary folder, and the first
    renames it to ``target`` once every member is done. Every member must call it."""
    import torch.distributed as dist

    target = Path(target)
    tmp = target.with_name(f".gang-{target.name}")
    first = dist.get_rank() == 0
    if first:
        os.close(open_folder(target.parent))  # made, and refused if a link on the way
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    dist.barrier()
    write(tmp)
    dist.barrier()
    if first:
        commit_folder(tmp, target)
    dist.barrier()
    return target


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _CHECKPOINT.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(folder: str | os.PathLike) -> Path | None:
    """The complete checkpoint with the highest step in ``folder``, or ``None``."""
    found = _checkpoints(Path(folder))
    return found[-1][1] if found else None


def checkpoint_at(folder: str | os.PathLike, step: int) -> Path | None:
    """The complete checkpoint of ``step`` in ``folder``, or ``None``."""
    path = Path(folder) / f"checkpoint-{step}"
    return path if path.is_dir() else None


def prune_checkpoints(folder: str | os.PathLike, keep: Collection[Path]) -> None:
    """Remove every checkpoint in ``folder`` but those in ``keep`` (and leftovers of failed
    writes): by the descriptor of ``folder``, reached without a link (a link there is
    :class:`LinkRefused`), so nothing outside is ever removed."""
    folder = Path(folder)
    try:
        fd = open_folder(folder, make=False)
    except FileNotFoundError:
        return
    kept = {Path(p).name for p in keep if Path(p).parent == folder}
    pid = str(os.getpid())
    try:
        for name in os.listdir(fd):
            old = _CHECKPOINT.match(name) and name not in kept
            stale = name.startswith(".tmp-checkpoint-") and name.rsplit("-", 1)[-1] != pid
            if old or stale:
                shutil.rmtree(name, dir_fd=fd, ignore_errors=True)
    finally:
        os.close(fd)


def remove_run_checkpoints(folder: str | os.PathLike) -> None:
    """Remove a run's checkpoint folder (``.rapidfire/checkpoints/<run>``) by the descriptor
    of its parent, reached from the experiment's root without a link: a link at the folder
    (or above it) is left, never followed; nothing outside is removed, nothing raised (its
    run is done; the link is named when the experiment next starts)."""
    from .atomic_folders import remove_folder

    with contextlib.suppress(OSError, ValueError):  # ValueError: LinkRefused above it
        remove_folder(Path(folder))


def run_state_from_checkpoint(
    checkpoint: Path,
    named_params: Sequence[tuple[str, torch.nn.Parameter]],
    adapter: str | None,
    decay: Collection[str],
) -> tuple[list[torch.Tensor], list[dict[str, Any] | None]]:
    """A run's parameter values and per-parameter optimizer states, read from its checkpoint.

    ``named_params`` are the run's own parameters as the model names them, in model order;
    ``adapter`` its adapter name (PEFT saves adapter weights without it: see
    :func:`_saved_key`); ``decay`` the names
    the Trainer puts in its weight-decay group. The Trainer numbers optimizer state in the
    order of its groups (decay, then no decay), each in model order, over the parameters that
    were trainable: the run's own. Raises ``LookupError`` when the files do not match, and
    :class:`~trl_rapidfire.storage.own_files.LinkRefused` when one is a link or not a regular
    file (read by descriptor: :func:`~trl_rapidfire.storage.own_files.read_by_descriptor`).
    """
    from safetensors.torch import load_file

    for name in ("adapter_model.safetensors", "model.safetensors"):
        # Anything at the name is read, so that a link or a FIFO there is refused by name
        # (LinkRefused) rather than taken for a missing file.
        if os.path.lexists(checkpoint / name):
            with read_by_descriptor(checkpoint / name) as weights:  # no link, no FIFO
                tensors = load_file(weights)
            break
    else:
        raise LookupError(f"no weights in {checkpoint}")
    values = []
    for name, _ in named_params:
        key = _saved_key(name, adapter)
        if key not in tensors:
            raise LookupError(f"{key} is not in {checkpoint}")
        values.append(tensors[key])
    if not os.path.lexists(checkpoint / "optimizer.pt"):
        raise LookupError(f"no optimizer state in {checkpoint}")
    with read_by_descriptor(checkpoint / "optimizer.pt") as optimizer_file:
        saved = torch.load(optimizer_file, map_location="cpu", weights_only=True)
    numbered = [i for g in saved["param_groups"] for i in g["params"]]
    order = [i for i, (n, _) in enumerate(named_params) if n in decay]
    order += [i for i, (n, _) in enumerate(named_params) if n not in decay]
    if len(numbered) != len(order):
        raise LookupError(f"{checkpoint}: optimizer state for {len(numbered)} parameters, "
                          f"the run has {len(order)}")
    states: list[dict[str, Any] | None] = [None] * len(named_params)
    for position, number in zip(order, numbered):
        state = saved["state"].get(number)
        if state is not None:
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() and value.shape != tuple(
                    values[position].shape
                ):
                    raise LookupError(f"{checkpoint}: optimizer state of "
                                      f"{named_params[position][0]} has another shape")
            states[position] = dict(state)
    return values, states


def _saved_key(name: str, adapter: str | None) -> str:
    """The key PEFT saves a run's parameter under: its name without the adapter's; for its
    copy of a module to save (a reward model's score head), without ``modules_to_save.<adapter>``
    too (``score.modules_to_save.rf0.weight`` is saved as ``score.weight``)."""
    if not adapter:
        return name
    return name.replace(f"modules_to_save.{adapter}.", "").replace(f".{adapter}", "")

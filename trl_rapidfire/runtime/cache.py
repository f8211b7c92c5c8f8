"""Where a run's training state waits while other runs take their turn.

Between chunks a run's state (adapter tensors, optimizer and LR-scheduler state dicts, RNG
states, trainer state) is parked in a :class:`StateCache`. The guarantee everything else rests
on is that parking changes nothing: a run that was swapped out and back in must continue exactly
as if it had never left, so what comes out of the cache is bitwise what went in, whether it
stayed in host memory or was spilled to disk.

What a state may hold, and its on-disk form (``tensors.safetensors`` + ``tree.json``, never
pickled), are those of a state tree (:mod:`.state_tree`). Spilled entries are written beside
their final name and renamed into place, so a crash never leaves a half-written entry where a
complete one is expected; a new cache on the same folder picks the complete entries up, which is
what lets a killed experiment continue.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from ..storage.atomic_folders import TMP_PREFIX, TRASH_PREFIX, remove_folder, replace_folder
from .state_tree import (
    TENSORS_FILE,
    TREE_FILE,  # noqa: F401 - re-exported: the entry's file names were first defined here
    copy_tree,
    load_tree,
    map_tensors,
    read_meta,
    save_tree,
    tree_nbytes,
)

# load_tree, save_tree and replace_folder were first defined here and are still imported from here.
__all__ = ["StateCache", "load_tree", "replace_folder", "save_tree"]


# --------------------------------------------------------------------------- host memory


def _host_copy(t: torch.Tensor, pin: bool) -> torch.Tensor:
    t = t.detach()
    if pin:
        try:
            # One copy straight into page-locked memory, so the later upload can be async.
            out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            out.copy_(t)
            return out
        except RuntimeError:  # no usable CUDA driver after all: plain memory will do
            pass
    return t.to("cpu", copy=True)


def _pinned(t: torch.Tensor) -> torch.Tensor:
    try:
        return t.pin_memory()
    except RuntimeError:
        return t


# --------------------------------------------------------------------------- the cache


@dataclass
class _Entry:
    tree: Any
    nbytes: int
    in_memory: bool
    # A complete copy exists on disk. It is kept while the entry is read back into memory, so
    # spilling it again costs nothing; put/pop/delete remove it.
    on_disk: bool


def _folder_name(key: str) -> str:
    # Readable, filesystem-safe, never dot-prefixed; the hash keeps distinct keys apart. The
    # exact key is stored in tree.json.
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:64].lstrip(".") or "entry"
    return f"{safe}-{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


class StateCache:
    """Run states keyed by run name, held in host memory up to a budget and spilled to disk.

    Args:
        budget_bytes: most tensor/array bytes held in memory; least recently used entries are
            spilled to ``spill_dir`` beyond it. ``0`` spills everything.
        spill_dir: folder for spilled entries (created at the first spill). Complete entries already
            there (from a previous process) are registered as on-disk entries; leftovers of
            interrupted writes are removed. One cache uses a folder at a time.
        pin_memory: copy tensors into page-locked memory for fast uploads; default: when CUDA
            is available.

    Aliasing: :meth:`put` stores copies. :meth:`get` returns the cached tensors themselves, to
    be read only (e.g. ``param.copy_(t)``). ``Optimizer.load_state_dict`` keeps the tensors it
    is given and steps them in place, so restore live objects from :meth:`pop` (which hands the
    entry over) or ``get(key, copy=True)``. Not thread-safe.
    """

    def __init__(
        self,
        budget_bytes: int,
        spill_dir: str | os.PathLike,
        *,
        pin_memory: bool | None = None,
    ) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget_bytes must be an integer >= 0, got {budget_bytes!r}.")
        self.budget_bytes = budget_bytes
        self.spill_dir = Path(spill_dir)
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._scan()

    def _scan(self) -> None:
        if not self.spill_dir.is_dir():
            return  # made at the first spill: an experiment writes nothing before it trains
        for folder in sorted(self.spill_dir.iterdir()):
            if folder.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(folder, ignore_errors=True)  # an interrupted write or removal
                continue
            if not folder.is_dir() or folder.name.startswith("."):
                continue
            try:
                meta = read_meta(folder)
                key, nbytes = meta["key"], meta["nbytes"]
                if not isinstance(key, str) or _folder_name(key) != folder.name:
                    raise ValueError("the key does not match the folder name")
                if not (folder / TENSORS_FILE).is_file():
                    raise ValueError(f"{TENSORS_FILE} is missing")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                warnings.warn(
                    f"Ignoring {folder}: not a complete cache entry ({exc}).",
                    UserWarning,
                    stacklevel=3,
                )
                continue
            self._entries[key] = _Entry(None, int(nbytes), in_memory=False, on_disk=True)

    # ------------------------------------------------------------------ queries

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[str]:
        """Keys from least to most recently used."""
        return list(self._entries)

    def _entry(self, key: str) -> _Entry:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"no cached state for {key!r}") from None

    def location(self, key: str) -> Literal["memory", "disk"]:
        """``"memory"`` if the entry is held in memory, else ``"disk"``."""
        return "memory" if self._entry(key).in_memory else "disk"

    def nbytes(self, key: str) -> int:
        """Tensor and array bytes of the entry (what it counts against the budget)."""
        return self._entry(key).nbytes

    @property
    def bytes_in_memory(self) -> int:
        """Tensor and array bytes of the entries held in memory."""
        return self._bytes

    def folder(self, key: str) -> Path:
        """Where the entry is (or would be) spilled."""
        return self.spill_dir / _folder_name(key)

    # ------------------------------------------------------------------ updates

    def put(self, key: str, tree: Any, *, copy: bool = True) -> None:
        """Store ``tree`` under ``key``, replacing any entry of that key.

        Tensors are copied to host memory, so the caller may go on changing its own. With
        ``copy=False`` the caller hands its tensors over instead: host tensors that need no
        pinning are kept as they are (no copy), others are still copied to the host. Raises
        ``TypeError`` (and stores nothing) if the tree holds something that cannot be stored.
        """
        if not isinstance(key, str):
            raise TypeError(f"keys are run names (str), got {type(key).__name__}")
        pin = self.pin_memory
        sizes: list[int] = []  # counted as they are copied: no second walk of the tree

        def to_host(t: torch.Tensor) -> torch.Tensor:
            out = t.detach() if not copy and not pin and t.device.type == "cpu" else \
                _host_copy(t, pin)
            sizes.append(out.untyped_storage().nbytes())
            return out

        def array_copy(a: Any) -> Any:
            out = a.copy()
            sizes.append(out.nbytes)
            return out

        copied = copy_tree(tree, "tree", to_host, array_copy)
        if key in self._entries:
            self._drop(key)
        nbytes = sum(sizes)
        self._entries[key] = _Entry(copied, nbytes, in_memory=True, on_disk=False)
        self._bytes += nbytes
        self._enforce_budget(key)

    def get(self, key: str, *, copy: bool = False) -> Any:
        """The tree stored under ``key``, read back from disk if it was spilled.

        The entry becomes the most recently used. Without ``copy`` the returned tensors and
        arrays are the cache's own: read them, do not change them (see the class docstring).
        Raises ``KeyError`` for an unknown key.
        """
        entry = self._entry(key)
        self._entries.move_to_end(key)
        if entry.in_memory:
            tree = entry.tree
        else:
            tree = self._load(key)
            entry.tree, entry.nbytes, entry.in_memory = tree, tree_nbytes(tree), True
            self._bytes += entry.nbytes
            self._enforce_budget(key)
        if copy:
            return copy_tree(tree, "tree", lambda t: t.clone())
        return tree

    def pop(self, key: str) -> Any:
        """Remove the entry (memory and disk) and return its tree, which the caller now owns."""
        entry = self._entry(key)
        tree = entry.tree if entry.in_memory else self._load(key)
        self._drop(key)
        return tree

    def delete(self, key: str) -> None:
        """Remove the entry from memory and disk. Raises ``KeyError`` for an unknown key."""
        self._entry(key)
        self._drop(key)

    # ------------------------------------------------------------------ internals

    def _load(self, key: str) -> Any:
        tree = load_tree(self.folder(key))
        return map_tensors(tree, _pinned) if self.pin_memory else tree

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        if entry.in_memory:
            self._bytes -= entry.nbytes
        if entry.on_disk:
            remove_folder(self.folder(key))

    def _spill(self, key: str) -> None:
        entry = self._entries[key]
        if not entry.on_disk:
            self.spill_dir.mkdir(parents=True, exist_ok=True)
            save_tree(entry.tree, self.folder(key), meta={"key": key, "nbytes": entry.nbytes})
            entry.on_disk = True
        entry.tree, entry.in_memory = None, False
        self._bytes -= entry.nbytes

    def _enforce_budget(self, newest: str) -> None:
        # An entry over the budget on its own goes straight to disk, sparing the others;
        # otherwise least recently used entries other than the newest make room.
        entry = self._entries[newest]
        if entry.in_memory and entry.nbytes > self.budget_bytes:
            self._spill(newest)
        while self._bytes > self.budget_bytes:
            victim = next(k for k, e in self._entries.items() if e.in_memory and k != newest)
            self._spill(victim)

    def __repr__(self) -> str:
        on_disk = sum(not e.in_memory for e in self._entries.values())
        return (
            f"StateCache({len(self)} entries, {on_disk} on disk, "
            f"{self._bytes}/{self.budget_bytes} bytes in memory, spill_dir={str(self.spill_dir)!r})"
        )

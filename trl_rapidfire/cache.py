"""Where a run's training state waits while other runs take their turn.

Between chunks a run's state (adapter tensors, optimizer and LR-scheduler state dicts, RNG
states, trainer state) is parked in a :class:`StateCache`. The guarantee everything else rests
on is that parking changes nothing: a run that was swapped out and back in must continue exactly
as if it had never left, so what comes out of the cache is bitwise what went in, whether it
stayed in host memory or was spilled to disk.

A *state tree* is nested dicts (``OrderedDict`` too), lists and tuples whose leaves are torch
tensors, numpy arrays or scalars, and JSON scalars (``int``, ``float`` including nan and inf,
``str``, ``bool``, ``None``). Dict keys are JSON scalars and keep their type and order
(optimizer state dicts are keyed by ints). Tensors keep dtype, shape and values; they come back
on the CPU, contiguous once they have been on disk, without ``requires_grad`` and without the
storage sharing they may have had with each other.

On disk an entry is a folder with ``tensors.safetensors`` and ``tree.json`` (the structure, with
placeholders for tensors and arrays). Nothing is ever pickled, so a spill folder is safe to read
and can be inspected with ordinary tools. Folders are written beside their final name and
renamed into place, so a crash never leaves a half-written entry where a complete one is
expected; a new cache on the same folder picks the complete entries up, which is what lets a
killed experiment continue.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import uuid
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import load_file, save_file

__all__ = ["StateCache", "load_tree", "replace_folder", "save_tree"]

TENSORS_FILE = "tensors.safetensors"
TREE_FILE = "tree.json"
_FORMAT = "trl-rapidfire/state-tree"
_VERSION = 1
# Dot-prefixed names are never entries: folders being written, and old ones being removed.
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"

# dtypes that safetensors can both write and read back. Other strided dtypes (complex128,
# complex32, float8_e8m0fnu, ...) are stored as their raw bytes plus a dtype marker.
_NATIVE_DTYPES = {
    torch.float64, torch.float32, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.complex64,
}  # fmt: skip
for _name in (
    "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
):  # fmt: skip
    if hasattr(torch, _name):
        _NATIVE_DTYPES.add(getattr(torch, _name))

_SCALAR_TYPES = (str, int, float, bool, type(None))


# --------------------------------------------------------------------------- validation / copies


def _check_tensor(t: torch.Tensor, path: str) -> None:
    if t.layout != torch.strided:
        raise TypeError(f"{path}: cannot store a {t.layout} tensor; make it dense first.")
    if t.is_quantized:
        raise TypeError(f"{path}: cannot store a quantized tensor.")


def _check_array(a: np.ndarray | np.generic, path: str) -> None:
    # The dtype is written as ``dtype.str``, which loses object and structured dtypes.
    if a.dtype.hasobject or a.dtype.fields is not None or np.dtype(a.dtype.str) != a.dtype:
        raise TypeError(f"{path}: cannot store a numpy array of dtype {a.dtype}.")


def _check_key(k: Any, path: str) -> None:
    if type(k) not in _SCALAR_TYPES:
        raise TypeError(f"{path}: dict key {k!r} of type {type(k).__name__} is not a JSON scalar.")


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


def _copy_tree(x: Any, path: str, tensor_copy) -> Any:
    """A validated copy of ``x``: new containers, ``tensor_copy`` of each tensor, copied arrays."""
    kind = type(x)
    if isinstance(x, torch.Tensor):
        _check_tensor(x, path)
        return tensor_copy(x)
    if kind is np.ndarray:
        _check_array(x, path)
        return x.copy()
    if isinstance(x, np.generic):
        _check_array(x, path)
        return x  # numpy scalars are immutable
    if kind in _SCALAR_TYPES:
        return x
    if kind is dict or kind is OrderedDict:
        out = kind()
        for k, v in x.items():
            _check_key(k, path)
            out[k] = _copy_tree(v, f"{path}[{k!r}]", tensor_copy)
        return out
    if kind is list or kind is tuple:
        return kind(_copy_tree(v, f"{path}[{i}]", tensor_copy) for i, v in enumerate(x))
    raise TypeError(
        f"{path}: cannot store a {kind.__name__}; a state tree holds dicts, lists, tuples, "
        "tensors, numpy arrays and JSON scalars."
    )


def _tree_nbytes(x: Any) -> int:
    """Bytes of tensor and array data held by a tree (what counts against the budget)."""
    if isinstance(x, torch.Tensor):
        return x.untyped_storage().nbytes()
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, dict):
        return sum(_tree_nbytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_tree_nbytes(v) for v in x)
    return 0


def _map_tensors(x: Any, fn) -> Any:
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, dict):
        return type(x)((k, _map_tensors(v, fn)) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return type(x)(_map_tensors(v, fn) for v in x)
    return x


# --------------------------------------------------------------------------- disk format


def _encode_scalar(x: Any) -> Any:
    # JSON has no nan/inf; finite floats round-trip exactly (json writes repr()).
    if type(x) is float and not math.isfinite(x):
        return {"float": repr(x)}
    return x


def _decode_scalar(x: Any) -> Any:
    if type(x) is dict:
        return float(x["float"])
    return x


class _Encoder:
    """Turns a tree into JSON with placeholders, collecting tensors for safetensors."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._storages: set[int] = set()

    def _add(self, path: str, t: torch.Tensor) -> str:
        name = path or "root"
        if name in self.tensors:  # two paths can print alike ("a.b" vs a -> b)
            name = f"{name}#{len(self.tensors)}"
        if t.device.type != "cpu":
            t = t.cpu()
        if t.numel():
            # safetensors refuses tensors sharing memory and non-contiguous ones.
            ptr = t.untyped_storage().data_ptr()
            if ptr in self._storages or not t.is_contiguous():
                t = t.clone(memory_format=torch.contiguous_format)
            self._storages.add(t.untyped_storage().data_ptr())
        self.tensors[name] = t
        return name

    def encode(self, x: Any, path: str) -> Any:
        kind = type(x)
        if isinstance(x, torch.Tensor):
            _check_tensor(x, path)
            # Lazy conjugate/negative views cannot be written as they are.
            x = x.detach().resolve_conj().resolve_neg()
            if x.dtype in _NATIVE_DTYPES:
                return {"tensor": self._add(path, x)}
            raw = x.contiguous().reshape(-1).view(torch.uint8)
            return {
                "tensor": self._add(path, raw),
                "dtype": str(x.dtype).removeprefix("torch."),
                "shape": list(x.shape),
            }
        if kind is np.ndarray or isinstance(x, np.generic):
            _check_array(x, path)
            arr = np.asarray(x)
            raw = torch.from_numpy(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).copy())
            tag = "ndarray" if kind is np.ndarray else "npscalar"
            return {tag: self._add(path, raw), "dtype": arr.dtype.str, "shape": list(arr.shape)}
        if kind in _SCALAR_TYPES:
            return _encode_scalar(x)
        if kind is dict or kind is OrderedDict:
            items = []
            for k, v in x.items():
                _check_key(k, path)
                items.append([_encode_scalar(k), self.encode(v, f"{path}.{k}".lstrip("."))])
            return {"dict" if kind is dict else "odict": items}
        if kind is list or kind is tuple:
            items = [self.encode(v, f"{path}.{i}".lstrip(".")) for i, v in enumerate(x)]
            return {kind.__name__: items}
        raise TypeError(
            f"{path or 'root'}: cannot store a {kind.__name__}; a state tree holds dicts, lists, "
            "tuples, tensors, numpy arrays and JSON scalars."
        )


def _decode(x: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if type(x) is not dict:
        return x
    if "dict" in x or "odict" in x:
        kind = dict if "dict" in x else OrderedDict
        items = x.get("dict", x.get("odict"))
        return kind((_decode_scalar(k), _decode(v, tensors)) for k, v in items)
    if "list" in x:
        return [_decode(v, tensors) for v in x["list"]]
    if "tuple" in x:
        return tuple(_decode(v, tensors) for v in x["tuple"])
    if "float" in x:
        return float(x["float"])
    for tag in ("tensor", "ndarray", "npscalar"):
        if tag in x:
            try:
                t = tensors[x[tag]]
            except KeyError:
                raise ValueError(f"{TENSORS_FILE} has no tensor {x[tag]!r}") from None
            break
    else:
        raise ValueError(f"unknown node in {TREE_FILE}: {sorted(x)}")
    if tag == "tensor":
        if "dtype" not in x:
            return t
        return t.view(getattr(torch, x["dtype"])).reshape(x["shape"])
    arr = t.numpy().view(np.dtype(x["dtype"])).reshape(x["shape"])
    return arr[()] if tag == "npscalar" else arr


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    # Makes renames and new names durable; not possible (nor needed) on Windows.
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_folder(folder: Path) -> None:
    """Remove ``folder`` so that no half-deleted entry is ever left under its name."""
    trash = folder.with_name(f"{_TRASH_PREFIX}{folder.name}-{uuid.uuid4().hex}")
    try:
        os.replace(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def save_tree(tree: Any, folder: str | os.PathLike, *, meta: dict[str, Any] | None = None) -> None:
    """Write a state tree to ``folder`` (``tensors.safetensors`` + ``tree.json``), atomically.

    The files are written and fsynced in a temporary folder beside ``folder`` and then renamed
    into place, replacing an existing ``folder``. ``meta`` (JSON-serialisable) is stored in
    ``tree.json`` alongside the tree. Raises ``TypeError`` for leaves that cannot be stored.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    encoder = _Encoder()
    doc = {
        "format": _FORMAT,
        "version": _VERSION,
        "meta": meta or {},
        "tree": encoder.encode(tree, ""),
    }
    text = json.dumps(doc, allow_nan=False)
    tmp = folder.with_name(f"{_TMP_PREFIX}{folder.name}-{uuid.uuid4().hex}")
    tmp.mkdir()
    try:
        save_file(encoder.tensors, tmp / TENSORS_FILE, metadata={"format": "pt"})
        _fsync_file(tmp / TENSORS_FILE)
        with open(tmp / TREE_FILE, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        replace_folder(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_folder(tmp: Path, folder: Path) -> None:
    """Rename the complete folder ``tmp`` (its files already on disk) to ``folder``, replacing
    one that is there, and make the rename durable. On failure ``folder`` is as it was."""
    _fsync_dir(tmp)
    trash = None
    # A directory cannot be renamed over a non-empty one: move the old one aside first.
    if folder.exists():
        trash = folder.with_name(f"{_TRASH_PREFIX}{folder.name}-{uuid.uuid4().hex}")
        os.replace(folder, trash)
    try:
        os.replace(tmp, folder)
    except BaseException:
        if trash is not None:
            os.replace(trash, folder)
        raise
    _fsync_dir(folder.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def _read_doc(folder: Path) -> dict[str, Any]:
    with open(folder / TREE_FILE, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise ValueError(f"{folder / TREE_FILE} is not a state tree")
    if doc.get("version") != _VERSION:
        raise ValueError(f"{folder / TREE_FILE} has unsupported version {doc.get('version')!r}")
    return doc


def load_tree(folder: str | os.PathLike) -> Any:
    """Read a state tree written by :func:`save_tree`; tensors are on the CPU."""
    folder = Path(folder)
    doc = _read_doc(folder)
    tensors = load_file(folder / TENSORS_FILE, device="cpu")
    return _decode(doc["tree"], tensors)


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
        spill_dir: folder for spilled entries (created if missing). Complete entries already
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
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        self._scan()

    def _scan(self) -> None:
        for folder in sorted(self.spill_dir.iterdir()):
            if folder.name.startswith((_TMP_PREFIX, _TRASH_PREFIX)):
                shutil.rmtree(folder, ignore_errors=True)  # an interrupted write or removal
                continue
            if not folder.is_dir() or folder.name.startswith("."):
                continue
            try:
                meta = _read_doc(folder)["meta"]
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

        def to_host(t: torch.Tensor) -> torch.Tensor:
            if not copy and not pin and t.device.type == "cpu":
                return t.detach()
            return _host_copy(t, pin)

        copied = _copy_tree(tree, "tree", to_host)
        if key in self._entries:
            self._drop(key)
        nbytes = _tree_nbytes(copied)
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
            entry.tree, entry.nbytes, entry.in_memory = tree, _tree_nbytes(tree), True
            self._bytes += entry.nbytes
            self._enforce_budget(key)
        if copy:
            return _copy_tree(tree, "tree", lambda t: t.clone())
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
        return _map_tensors(tree, _pinned) if self.pin_memory else tree

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        if entry.in_memory:
            self._bytes -= entry.nbytes
        if entry.on_disk:
            _remove_folder(self.folder(key))

    def _spill(self, key: str) -> None:
        entry = self._entries[key]
        if not entry.on_disk:
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

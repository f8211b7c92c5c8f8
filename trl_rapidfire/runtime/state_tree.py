"""The state tree: what a run's parked state may hold, and how it is written to disk.

A *state tree* is nested dicts (``OrderedDict`` too), lists and tuples whose leaves are torch
tensors, numpy arrays or scalars, and JSON scalars (``int``, ``float`` including nan and inf,
``str``, ``bool``, ``None``). Dict keys are JSON scalars and keep their type and order
(optimizer state dicts are keyed by ints). Tensors keep dtype, shape and values; they come back
on the CPU, contiguous once they have been on disk, without ``requires_grad`` and without the
storage sharing they may have had with each other.

On disk a tree is a folder with ``tensors.safetensors`` and ``tree.json`` (the structure, with
placeholders for tensors and arrays). Nothing is ever pickled, so such a folder is safe to read
and can be inspected with ordinary tools. Folders are written beside their final name and
renamed into place (:mod:`.atomic_folders`), so a crash never leaves a half-written tree where
a complete one is expected.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..storage.atomic_folders import TMP_PREFIX, fsync_file, replace_folder
from ..storage.outside_text import STATE_BYTES
from ..storage.own_files import read_by_descriptor, read_json

__all__ = [
    "TENSORS_FILE",
    "TREE_FILE",
    "copy_tree",
    "load_tree",
    "map_tensors",
    "read_meta",
    "save_tree",
    "tree_nbytes",
]

TENSORS_FILE = "tensors.safetensors"
TREE_FILE = "tree.json"
_FORMAT = "trl-rapidfire/state-tree"
_VERSION = 1
# A state tree nests as deep as an optimizer's state dict inside a run's parked state.
_TREE_DEPTH = 64

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


def copy_tree(x: Any, path: str, tensor_copy, array_copy=np.copy) -> Any:
    """A validated copy of ``x``: new containers, ``tensor_copy`` of each tensor,
    ``array_copy`` of each numpy array.

    ``path`` names ``x`` in errors. Raises ``TypeError`` for what a state tree cannot hold.
    """
    return _copy(x, (path,), tensor_copy, array_copy)


def _where(at: tuple) -> str:
    # ``at`` is (name,) or (parent, key, in_dict): a leaf's path is only spelt out for an
    # error (formatting it at every leaf was most of parking a run's state).
    if len(at) == 1:
        return at[0]
    parent, key, in_dict = at
    return f"{_where(parent)}[{key!r}]" if in_dict else f"{_where(parent)}[{key}]"


def _copy(x: Any, at: tuple, tensor_copy, array_copy) -> Any:
    kind = type(x)
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided or x.is_quantized:
            _check_tensor(x, _where(at))
        return tensor_copy(x)
    if kind in _SCALAR_TYPES:
        return x
    if kind is dict or kind is OrderedDict:
        out = kind()
        for k, v in x.items():
            if type(k) not in _SCALAR_TYPES:
                _check_key(k, _where(at))
            out[k] = _copy(v, (at, k, True), tensor_copy, array_copy)
        return out
    if kind is list or kind is tuple:
        return kind([_copy(v, (at, i, False), tensor_copy, array_copy)
                     for i, v in enumerate(x)])
    if kind is np.ndarray:
        _check_array(x, _where(at))
        return array_copy(x)
    if isinstance(x, np.generic):
        _check_array(x, _where(at))
        return x  # numpy scalars are immutable
    raise TypeError(
        f"{_where(at)}: cannot store a {kind.__name__}; a state tree holds dicts, lists, "
        "tuples, tensors, numpy arrays and JSON scalars."
    )


def tree_nbytes(x: Any) -> int:
    """Bytes of tensor and array data held by a tree (what counts against the budget)."""
    if isinstance(x, torch.Tensor):
        return x.untyped_storage().nbytes()
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, dict):
        return sum(tree_nbytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(tree_nbytes(v) for v in x)
    return 0


def map_tensors(x: Any, fn) -> Any:
    """``x`` with each tensor ``t`` replaced by ``fn(t)``, in new containers of the same types."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, dict):
        return type(x)((k, map_tensors(v, fn)) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return type(x)(map_tensors(v, fn) for v in x)
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
        items = x["dict"] if "dict" in x else x["odict"]
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
    tmp = folder.with_name(f"{TMP_PREFIX}{folder.name}-{uuid.uuid4().hex}")
    tmp.mkdir()
    try:
        save_file(encoder.tensors, tmp / TENSORS_FILE, metadata={"format": "pt"})
        fsync_file(tmp / TENSORS_FILE)
        with open(tmp / TREE_FILE, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        replace_folder(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read_doc(folder: Path) -> dict[str, Any]:
    doc = read_json(folder / TREE_FILE, max_bytes=STATE_BYTES, max_depth=_TREE_DEPTH)
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise ValueError(f"{folder / TREE_FILE} is not a state tree")
    if doc.get("version") != _VERSION:
        raise ValueError(f"{folder / TREE_FILE} has unsupported version {doc.get('version')!r}")
    return doc


def load_tree(folder: str | os.PathLike) -> Any:
    """Read a state tree written by :func:`save_tree`; tensors are on the CPU."""
    folder = Path(folder)
    doc = _read_doc(folder)
    with read_by_descriptor(folder / TENSORS_FILE) as tensors_file:  # no link, no FIFO
        tensors = load_file(tensors_file, device="cpu")
    return _decode(doc["tree"], tensors)


def read_meta(folder: str | os.PathLike) -> Any:
    """The ``meta`` that :func:`save_tree` stored with the tree in ``folder``, without reading
    its tensors. Raises ``OSError`` if it cannot be read, ``ValueError`` if ``folder`` holds no
    state tree of this version."""
    return _read_doc(Path(folder))["meta"]

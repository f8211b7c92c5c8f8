"""Names and paths from outside the script: text read back from tags, the CLI and the files
under ``<output_dir>/.rapidfire`` is data, never a path that leaves the experiment folder.

A run name is ``run-<n>``; every path built from one is resolved and checked to be inside
``output_dir`` before anything is written or removed there. What a tag's clone may change is
the control layer's rule (:mod:`trl_rapidfire.control.ops.trust`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

__all__ = ["UntrustedValue", "check_run_name", "inside", "is_run_name"]


class UntrustedValue(ValueError):
    """A value from a tag, the CLI or a state file that may not be used as given."""


_RUN_NAME = re.compile(r"run-(0|[1-9][0-9]{0,8})")


def is_run_name(name: Any) -> bool:
    """Whether ``name`` is a run name this package makes (``run-<n>``)."""
    return isinstance(name, str) and _RUN_NAME.fullmatch(name) is not None


def check_run_name(name: Any, where: str = "") -> str:
    """``name`` if it is a run name (``run-<n>``), else :class:`UntrustedValue`."""
    if not is_run_name(name):
        at = f" in {where}" if where else ""
        raise UntrustedValue(f"{name!r}{at} is not a run name (run-<n>)")
    return name


def inside(root: str | os.PathLike, path: str | os.PathLike) -> Path:
    """``path`` resolved, if it lies inside ``root`` (resolved); else :class:`UntrustedValue`.

    Call it on every path built from a name read from a file before writing or removing there.
    """
    base = Path(root).resolve()
    target = Path(path).resolve()
    if target != base and base not in target.parents:
        raise UntrustedValue(f"{path} is outside {base}; refusing to write or remove it")
    return target

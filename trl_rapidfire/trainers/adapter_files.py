"""A run's adapter as PEFT reads and writes it, when the shared model holds many: PEFT shown
only the adapters in the module tree, the adapter saved alone where a one-adapter model keeps
its files."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

__all__ = ["attached_configs_only", "save_adapter_alone"]


def save_adapter_alone(save_all: Callable[..., None], model: Any, adapter: str,
                       attached: Collection[str] | None, save_directory: Path,
                       **kwargs: Any) -> None:
    """Write ``adapter`` alone with PEFT's ``save_all`` (the model's own ``save_pretrained``)
    at ``save_directory``'s root, where a single-adapter model keeps its files.

    ``attached``: the adapters in the model's module tree now (``None``: every adapter): PEFT
    is shown just their configs while it saves (:func:`attached_configs_only`; 9.5 ms a save
    at 512 runs against 2.5 ms at 8 without).
    """
    kwargs["selected_adapters"] = [adapter]
    save_directory.mkdir(parents=True, exist_ok=True)
    with attached_configs_only(model, adapter, attached):
        # PEFT writes a non-"default" adapter into a subfolder named after it: written
        # beside, its files are moved to the root.
        with tempfile.TemporaryDirectory(dir=save_directory, prefix=".rf-save-") as tmp:
            save_all(tmp, **kwargs)
            for folder in (Path(tmp) / adapter, Path(tmp)):
                if folder.is_dir():
                    for f in folder.iterdir():
                        if f.is_file():
                            os.replace(f, save_directory / f.name)


@contextlib.contextmanager
def attached_configs_only(model: Any, adapter: str,
                          attached: Collection[str] | None) -> Iterator[None]:
    """Show PEFT only the configs of ``adapter`` and of the adapters in the model's module
    tree (``attached``; ``None``: every adapter) while it reads the model's state dict.

    PEFT filters that state dict against every *other* adapter it knows of, a check per key
    and name: O(runs) per save or first boundary checkpoint, O(runs^2) an experiment (6.3 ms a
    call at 512 runs). Only adapters in the module tree have keys in it, so leaving the others
    out filters the same keys."""
    configs = model.peft_config
    if attached is not None:
        shown = [adapter, *sorted(set(attached) - {adapter})]
        model.peft_config = {name: configs[name] for name in shown if name in configs}
    try:
        yield
    finally:
        model.peft_config = configs

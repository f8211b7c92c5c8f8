"""Second models the runs read but never train (a distillation teacher), each loaded once.

Every run of a kind that names a second model by path would load its own copy: N runs, N
teachers. The runs of one experiment share a :class:`ResidentModels` instead: each distinct
(path, load arguments) is loaded once, on first use, and handed to every run that names it, so
a teacher that is a knob (``teacher_model=List([a, b])``) is loaded once per candidate. The
models are only read (no gradients, no optimizer), so sharing one object changes nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

__all__ = ["ResidentModels"]


class ResidentModels:
    """Models loaded once per (path, load arguments) and shared.

    Attributes:
        loads: how many times each path was loaded (tests assert 1 per distinct model).
    """

    def __init__(self) -> None:
        self._models: dict[str, Any] = {}
        self.loads: Counter[str] = Counter()

    def get(self, path: str, init_kwargs: dict[str, Any]) -> Any:
        """The model at ``path`` loaded with ``init_kwargs`` (as TRL's
        ``create_model_from_path`` loads it), loaded now if no run asked for it before."""
        key = f"{path}|{json.dumps(init_kwargs, sort_keys=True, default=repr)}"
        model = self._models.get(key)
        if model is None:
            from trl.trainer.utils import create_model_from_path

            self.loads[path] += 1
            model = self._models[key] = create_model_from_path(path, **init_kwargs)
        return model

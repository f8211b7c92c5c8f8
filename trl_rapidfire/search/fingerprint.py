"""What identifies an experiment: its expanded runs (names, knobs, concrete configs, and the
trainer-level arguments that make a run: model, LoRA config, formatting and reward functions)
and its data. A re-run on the same ``output_dir`` continues the experiment there only if the
fingerprints agree; they must agree between two processes running the same script, so nothing
here depends on object identities or addresses."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from ..runtime.foreign_internals import dataset_fingerprint
from .searches import RunSpec

__all__ = ["config_doc", "describe", "experiment_fingerprint"]

# Config fields that name places or secrets, not training: they may differ between two
# launches of the same experiment.
_NOT_FINGERPRINTED = frozenset({"output_dir", "logging_dir", "hub_token", "run_name",
                                "push_to_hub_token", "hub_model_id", "report_to",
                                "disable_tqdm", "dataloader_num_workers"})


def experiment_fingerprint(specs: Sequence[RunSpec], shared: dict[str, Any],
                           search: Any = None,
                           configs: dict[str, dict[str, Any]] | None = None) -> str:
    """A hash of everything that makes the experiment's runs. ``search``: what identifies an
    adaptive search (its runs are proposed later, so ``specs`` is empty then). ``configs``:
    filled with each run's ``config.to_dict()`` as read here (what a tracker records of the
    run, without a second pass over ~200 fields a run)."""
    doc: list[Any] = [] if search is None else [["search", search]]
    # The runs share most trainer arguments (datasets, the model, a LoRA config): each object
    # is described once (by identity, while the specs hold it), not once a run.
    described: dict[int, Any] = {}

    def once(value: Any) -> Any:
        if id(value) not in described:
            described[id(value)] = describe(value)
        return described[id(value)]

    for spec in specs:
        whole = spec.config.to_dict()
        if configs is not None:
            configs[spec.name] = whole
        config = {k: v for k, v in whole.items() if k not in _NOT_FINGERPRINTED}
        doc.append([spec.name, {k: describe(v) for k, v in sorted(spec.knobs.items())},
                    {k: once(v) for k, v in sorted(spec.trainer_kwargs.items())}, config])
    for key in ("train_dataset", "eval_dataset"):
        doc.append([key, dataset_fingerprint(shared.get(key))])
    text = json.dumps(doc, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def config_doc(config: Any) -> dict[str, Any]:
    """A run's TRL config as it identifies the experiment (places and secrets left out)."""
    return {k: v for k, v in config.to_dict().items() if k not in _NOT_FINGERPRINTED}


def describe(value: Any) -> Any:
    """A stable description of a run's argument: the same in every process for the same
    script (a model by its class and where it was loaded from, a PEFT config by its fields,
    a function by its qualified name)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): describe(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if callable(getattr(value, "to_dict", None)) and type(value).__name__.endswith("Config"):
        fields = value.to_dict()
        return [type(value).__name__, {k: describe(sorted(v) if isinstance(v, set) else v)
                                       for k, v in sorted(fields.items())}]
    config = getattr(value, "config", None)
    if config is not None and hasattr(config, "name_or_path"):
        return [type(value).__name__, config.name_or_path]
    if hasattr(value, "name_or_path"):  # a tokenizer or processor
        return [type(value).__name__, value.name_or_path]
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    return type(value).__name__

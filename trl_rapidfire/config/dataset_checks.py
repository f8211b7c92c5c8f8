"""Pre-flight checks of the datasets: what TRL only finds out when a run's trainer is built
(an empty dataset's first row, a missing text, prompt or preference column), said before any
model loads, with the columns found and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .preflight import PreflightError

__all__ = ["check_dataset_rows", "check_dpo_dataset", "check_grpo_dataset", "check_sft_dataset"]


def _each_dataset(label: str, value: Any) -> list[tuple[str, Any]]:
    """``eval_dataset`` may be one dataset or a dict of them."""
    if value is None:
        return []
    if isinstance(value, Mapping) and not label.startswith("eval"):
        raise PreflightError(
            f"{label} is a {type(value).__name__} of splits {list(value)}; the trainer takes one "
            f"split. Pass e.g. {label}=dataset[{next(iter(value), 'train')!r}]."
        )
    if isinstance(value, Mapping):
        return [(f"{label}[{key!r}]", ds) for key, ds in value.items()]
    return [(label, value)]


def _first_row(label: str, dataset: Any) -> Mapping[str, Any]:
    try:
        empty = hasattr(dataset, "__len__") and len(dataset) == 0
        row = None if empty else next(iter(dataset))
    except StopIteration:
        row = None
    if row is None:
        raise PreflightError(
            f"{label} is empty (0 rows): TRL's trainer reads its first row when it is built, and "
            "no run could train on it. Pass a dataset with rows (check the split and any filter "
            "that produced it)."
        )
    return row


def _columns(dataset: Any, row: Mapping[str, Any]) -> list[str]:
    names = getattr(dataset, "column_names", None)  # None for some streaming datasets
    return list(names) if isinstance(names, (list, tuple)) else list(row)


def check_dataset_rows(datasets: Mapping[str, Any]) -> None:
    """Raise :class:`PreflightError` if any of ``{"train_dataset": ds, "eval_dataset": ...}`` has
    no rows (TRL's trainers fail on ``next(iter(dataset))``)."""
    for label, value in datasets.items():
        for name, dataset in _each_dataset(label, value):
            _first_row(name, dataset)


def _messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) \
        and "role" in value[0]


def _column_guess(row: Mapping[str, Any], columns: list[str], likely: tuple[str, ...] = (),
                  messages: bool = False) -> str | None:
    """The column the user most likely meant: a usual name, else the first holding text."""
    for name in (*likely, *columns):
        value = row.get(name)
        if name in columns and (isinstance(value, str) or (messages and _messages(value))):
            return name
    return None


def check_sft_dataset(
    dataset: Any, config: Any, *, formatting_func: Any = None, label: str = "train_dataset"
) -> None:
    """Raise :class:`PreflightError` if ``SFTTrainer`` could not prepare ``dataset`` with this
    run's ``config``: no rows, or none of the forms it reads (a ``dataset_text_field`` column,
    ``messages``, ``prompt`` + ``completion``, ShareGPT ``conversations``). Datasets TRL does not
    prepare (tokenized ones, vision ones, ``skip_prepare_dataset``) are only checked for rows."""
    for name, ds in _each_dataset(label, dataset):
        row = _first_row(name, ds)
        options = getattr(config, "dataset_kwargs", None) or {}
        columns = _columns(ds, row)
        if (isinstance(options, Mapping) and options.get("skip_prepare_dataset")) or {
                "input_ids", "image", "images"} & set(columns):
            continue
        text_field = getattr(config, "dataset_text_field", "text")
        # TRL maps the formatting function's output to "text", then reads dataset_text_field.
        present = set(columns) | ({"text"} if formatting_func is not None else set())
        if "prompt" in present:
            if "completion" in present:
                for column in ("prompt", "completion"):
                    _check_text_column(name, ds, column)
                continue
            raise PreflightError(
                f"{name} has a 'prompt' column but no 'completion' (columns: {columns}): SFT's "
                "prompt-completion form needs both. Add a 'completion' column, or drop 'prompt' "
                f"and train on a text column named by dataset_text_field (now {text_field!r})."
            )
        conversational = _messages(row.get("messages")) or isinstance(
            row.get("conversations"), list)
        if conversational:
            continue
        if text_field in present:
            if formatting_func is None:
                _check_text_column(name, ds, text_field)
            continue
        guess = _column_guess(row, columns, ("content", "body", "document", "sentence"))
        fix = (f"Set dataset_text_field={guess!r}, or rename the column: "
               f"dataset.rename_column({guess!r}, {text_field!r})." if guess else
               "Give a text column and name it in dataset_text_field.")
        written = " (formatting_func writes 'text')" if formatting_func is not None else ""
        raise PreflightError(
            f"{name} has no column {text_field!r} (`dataset_text_field`){written}; its columns "
            f"are {columns}. SFT reads a text column named by dataset_text_field, a 'messages' "
            f"column of chat messages, or 'prompt' + 'completion' columns. {fix}"
        )


def _check_text_column(label: str, dataset: Any, column: str) -> None:
    """Every row of a text column of an Arrow-backed dataset holds text (or, for a prompt or
    completion, chat messages): TRL fails on a ``None`` or a number only when the run's
    trainer prepares the data, with ``'NoneType' object has no attribute 'endswith'``."""
    from datasets import Dataset

    if not isinstance(dataset, Dataset) or column not in dataset.column_names:
        return  # a list, a streamed dataset: TRL's own error stands
    import pyarrow as pa
    import pyarrow.compute as pc

    # The rows the dataset shows (after any select or filter), as Arrow: no Python loop.
    values = dataset.with_format("arrow")[column]
    kind = values.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_struct(kind):
        return  # conversational: chat messages
    fix = (f"Drop or fill those rows first, e.g. {label}.filter(lambda row: "
           f"isinstance(row[{column!r}], str)).")
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_null(kind)):
        raise PreflightError(
            f"{label}: column {column!r} holds {kind} values, not text: SFT tokenizes it as "
            f"text. Convert it (e.g. {label}.map(lambda row: {{{column!r}: "
            f"str(row[{column!r}])}})) or name a text column in dataset_text_field.")
    if values.null_count:
        first = pc.index(pc.is_null(values), True).as_py()
        raise PreflightError(
            f"{label}: column {column!r} is empty (None) in {values.null_count} row(s), the "
            f"first at row {first}; SFT needs text in every row. {fix}")


# The column sets a preference pair is read from: text, or already tokenized (TRL's names, and
# the legacy ones it still renames).
_PAIR_FORMS = (("chosen", "rejected"), ("chosen_ids", "rejected_ids"),
               ("chosen_input_ids", "rejected_input_ids"))
# KTO's unpaired rows (text or tokenized), or preference pairs, which it unpairs itself.
_UNPAIRED_FORMS = (("completion", "label"), ("completion_ids", "label"), *_PAIR_FORMS)


def _check_forms(dataset: Any, label: str, forms: tuple[tuple[str, ...], ...],
                 reads: str, rename: str) -> None:
    """Raise :class:`PreflightError` unless each dataset of ``dataset`` has rows and every
    column of one of ``forms`` (a vision dataset is TRL's to judge); ``reads``: what the
    trainer reads, in words, and ``rename`` a column it might be under, for the message."""
    for name, ds in _each_dataset(label, dataset):
        row = _first_row(name, ds)
        columns = _columns(ds, row)
        if any(set(form) <= set(columns) for form in forms) or {"image", "images"} & set(columns):
            continue
        missing = [c for c in forms[0] if c not in columns]
        raise PreflightError(
            f"{name} has no {' or '.join(repr(c) for c in missing)} column; its columns are "
            f"{columns}. {reads} Rename the columns, e.g. "
            f"dataset.rename_column({rename!r}, {forms[0][0]!r}).")


def check_dpo_dataset(dataset: Any, *, label: str = "train_dataset", kind: str = "DPO") -> None:
    """Raise :class:`PreflightError` unless ``dataset`` has rows and ``chosen`` and
    ``rejected`` columns, or their tokenized forms (``prompt`` is optional: TRL extracts an
    implicit one); ``kind``: the trainer that reads them (DPO, Reward)."""
    _check_forms(dataset, label, _PAIR_FORMS,
                 f"{kind} reads preference pairs: 'prompt', 'chosen', 'rejected' (or 'chosen' "
                 "and 'rejected' with the prompt inside them).", "preferred")


def check_kto_dataset(dataset: Any, *, label: str = "train_dataset") -> None:
    """Raise :class:`PreflightError` unless ``dataset`` has rows and ``completion`` and
    ``label`` columns (``prompt`` is optional), their tokenized forms, or preference pairs
    (``chosen``/``rejected``, which KTO unpairs)."""
    _check_forms(dataset, label, _UNPAIRED_FORMS,
                 "KTO reads unpaired feedback: 'prompt', 'completion' and 'label' (True: "
                 "desirable), or preference pairs ('chosen', 'rejected'), which it unpairs.",
                 "response")


def check_grpo_dataset(dataset: Any, *, label: str = "train_dataset", kind: str = "GRPO") -> None:
    """Raise :class:`PreflightError` unless ``dataset`` has rows and a ``prompt`` column;
    ``kind``: the trainer that generates from them (GRPO, RLOO, Distillation)."""
    for name, ds in _each_dataset(label, dataset):
        row = _first_row(name, ds)
        columns = _columns(ds, row)
        if "prompt" not in columns:
            guess = _column_guess(row, columns, ("question", "query", "instruction", "input"),
                                  messages=True) or "question"
            raise PreflightError(
                f"{name} has no 'prompt' column; its columns are {columns}. {kind} generates "
                "completions for each row's 'prompt' (a string or a list of chat messages). "
                f"Rename the column: dataset.rename_column({guess!r}, 'prompt')."
            )

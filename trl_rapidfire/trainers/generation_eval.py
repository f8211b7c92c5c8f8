"""Judging a run by what it generates.

At each evaluation (every chunk end with ``eval_strategy="chunk"``, or wherever the config
evaluates), a run with a ``generation_config`` answers the eval set's prompts with its own
adapter, and the ``compute_metrics`` of the user scores the decoded answers against the
references. The scores are logged as TRL logs its own (``eval_<name>``), so they reach the
trackers, the runs table, the report, ``metric_for_best_model``, the policies and Optuna.

What is generated from what:

* SFT, prompt/completion rows (plain or conversational): the prompt; the reference is the
  completion. Conversational ``messages`` rows ending with an assistant turn: the turns before
  it; the reference is that turn.
* DPO: the prompt; the reference is the chosen answer.

Prompts are tokenized as TRL tokenizes them for training (a conversational prompt through the
chat template with the generation prompt), left-padded into batches of
``per_device_eval_batch_size``. Generation never moves the run's random streams: it runs in a
fork of torch's generator seeded with ``seed + global_step``, so a sampling config gives the
same answers at the same step whatever ran before.
"""

from __future__ import annotations

import copy
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from transformers import EvalPrediction, GenerationConfig

from ..config.generation import generation_config_from
from ..storage.own_files import write_under

__all__ = ["Example", "GenerationEval", "Scorer", "answer", "examples_of", "exact_match",
           "generation_file_name", "generation_file_step",
           "prompt_ids"]

Scorer = Callable[[EvalPrediction], Mapping[str, float]]
"""A ``compute_metrics`` for generation: ``EvalPrediction(predictions=[answer, ...],
label_ids=[reference, ...])`` (decoded text, in eval-set order) to ``{name: value}``."""

# Characters of each prompt, answer and reference written to the saved samples.
_SAVED_CHARS = 2000
# Step numbers in file names are zero-padded to this many digits, so that a folder lists them
# in step order (eval-step-00000096 before eval-step-00000128); a run of more steps than that
# gets longer names, which still read back (generation_file_step).
_STEP_DIGITS = 8
_FILE_NAME = re.compile(r"(eval(?:_[A-Za-z0-9_.-]{1,200})?)-step-(\d{1,20})\.jsonl")


def generation_file_name(prefix: str, step: int) -> str:
    """The name of the file that keeps what a run generated at ``step`` for the eval set of
    ``prefix``: ``eval-step-00000096.jsonl``."""
    return f"{prefix}-step-{step:0{_STEP_DIGITS}d}.jsonl"


def generation_file_step(name: str) -> tuple[str, int] | None:
    """``(prefix, step)`` of a generation file's name, zero-padded or not (names written
    before the padding: ``eval-step-96.jsonl``); ``None`` for any other name. Sort a folder's
    files by it to read them in step order whatever their names' form."""
    found = _FILE_NAME.fullmatch(name)
    return None if found is None else (found.group(1), int(found.group(2)))


@dataclass(frozen=True)
class Example:
    """One row of an eval set, for generation: what the model is asked, and the answer a person
    wrote (``None`` where the row has none)."""

    prompt: str | list[dict[str, Any]]
    reference: str | None


def _text_of(value: Any) -> str | None:
    """A completion as text: a string, or the contents of its messages."""
    if value is None or isinstance(value, str):
        return value
    return "".join(str(m.get("content") or "") for m in value if isinstance(m, Mapping))


def examples_of(rows: Iterable[Mapping[str, Any]], reference_column: str) -> list[Example]:
    """The prompts and references of ``rows`` (see the module docstring), but rows labelled
    undesirable (KTO's ``label=False``). Raises ``ValueError`` naming the first row that has
    no prompt."""
    out = []
    for i, row in enumerate(rows):
        if row.get("label") is False:
            continue  # an undesirable completion (KTO's thumbs-down) is no answer to aim at
        if "prompt" in row:
            out.append(Example(row["prompt"], _text_of(row.get(reference_column))))
            continue
        messages = row.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[-1], Mapping) \
                and messages[-1].get("role") == "assistant":
            out.append(Example(list(messages[:-1]), _text_of([messages[-1]])))
            continue
        raise ValueError(
            f"eval row {i} has no prompt to answer (columns {sorted(row)}): generation eval "
            "needs prompt/completion rows, or conversational 'messages' ending with an "
            "assistant turn."
        )
    return out


def prompt_ids(tokenizer: Any, prompt: str | list[dict[str, Any]],
               chat_template: str | None = None) -> list[int]:
    """``prompt``'s token ids as TRL tokenizes a prompt for training."""
    if isinstance(prompt, str):
        return list(tokenizer(text=prompt)["input_ids"])
    kwargs: dict[str, Any] = {"add_generation_prompt": True}
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    encoded = tokenizer.apply_chat_template(prompt, tokenize=True, return_dict=True, **kwargs)
    return list(encoded["input_ids"])


def answer(model: Any, tokenizer: Any, prompts: Sequence[list[int]], config: GenerationConfig,
           *, batch_size: int, seed: int, synced: bool = False) -> list[str]:
    """The decoded answers of ``model`` to ``prompts`` (token ids), ``batch_size`` at a time,
    left-padded, in a fork of torch's random streams seeded with ``seed``."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = copy.deepcopy(config)
    if config.pad_token_id is None:
        # Fills the answers that ended early (the model's own default would be merged in
        # otherwise, or generate warns and uses the eos); unset fields (eos) are the model's.
        config.pad_token_id = pad
    device = next(model.parameters()).device
    forked = [device.index or 0] if device.type == "cuda" else []
    answers: list[str] = []
    with torch.random.fork_rng(devices=forked):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start:start + batch_size]
            width = max(len(ids) for ids in batch)
            ids = torch.tensor([[pad] * (width - len(x)) + list(x) for x in batch], device=device)
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch],
                                device=device)
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                 synced_gpus=synced)
            answers.extend(tokenizer.decode(row, skip_special_tokens=True)
                           for row in out[:, width:])
    return answers


def exact_match(prediction: EvalPrediction) -> dict[str, float]:
    """The share of answers equal to their reference (both stripped): the score logged when a
    generation config is given without a ``compute_metrics``."""
    pairs = [(str(a).strip(), None if r is None else str(r).strip())
             for a, r in zip(prediction.predictions, prediction.label_ids)]
    scored = [a == r for a, r in pairs if r is not None]
    return {"exact_match": sum(scored) / len(scored) if scored else math.nan}


def _numbers(scores: Any, scorer: Callable[..., Any]) -> dict[str, float]:
    name = getattr(scorer, "__qualname__", type(scorer).__name__)
    if not isinstance(scores, Mapping):
        raise TypeError(f"compute_metrics ({name}) must return a dict of numbers, got "
                        f"{type(scores).__name__}.")
    out = {}
    for key, value in scores.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not (
                isinstance(value, torch.Tensor) and value.numel() == 1):
            raise TypeError(f"compute_metrics ({name}) returned {key!r}: {value!r}; every "
                            "value must be a number (it is logged as a metric).")
        out[str(key)] = float(value)
    return out


@dataclass
class GenerationEval:
    """How one run is judged by what it generates.

    Args:
        config: the run's generation config.
        scorer: the run's ``compute_metrics`` (``None``: :func:`exact_match`).
        datasets: the eval sets as the user gave them, by metric prefix (``eval``, or
            ``eval_<name>`` for a dict of eval sets).
        reference_column: where a row's reference is when it has a prompt (``completion``
            for SFT, ``chosen`` for DPO).
        max_rows: generate for the first this many rows of each eval set (``None``: all).
        saved_rows: how many (prompt, answer, reference) rows of each evaluation are written
            to ``<run dir>/generations/`` (never through a link: a link there, or at
            ``generations/`` itself, is refused and fails the run, naming it).
        shared_examples: the eval rows read so far, by prefix: one dict shared by the runs
            that read the same sets alike (same ``max_rows``), so each set is read once.
        folder: the run's folder (``runs/<run>``), where ``generations/`` goes (``None``: the
            trainer's ``output_dir``). The one config of an experiment trains with the
            experiment's ``output_dir`` as its TRL one, and keeps its answers in its run
            folder all the same.
        root: the experiment's folder, below which ``folder`` is made if missing (never
            through a link); ``None``: ``folder`` itself, which exists.
    """

    config: GenerationConfig
    scorer: Scorer | None
    datasets: dict[str, Any]
    reference_column: str
    max_rows: int | None = None
    saved_rows: int = 8
    shared_examples: dict[str, list[Example]] = field(default_factory=dict, repr=False)
    folder: Path | None = None
    root: Path | None = None
    # The prompts' token ids by prefix: the run's own (its tokenizer may be a knob's).
    _prompt_ids: dict[str, list[list[int]]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, config: Any, scorer: Scorer | None, eval_dataset: Any, *,
              reference_column: str, max_rows: int | None, saved_rows: int,
              shared_examples: dict[str, list[Example]] | None = None,
              folder: Path | None = None, root: Path | None = None) -> GenerationEval:
        """From the config fields as the user wrote them (a ``GenerationConfig``, a mapping of
        its fields or their JSON) and the eval set(s) given to the trainer."""
        datasets = ({f"eval_{k}": v for k, v in eval_dataset.items()}
                    if isinstance(eval_dataset, Mapping) else {"eval": eval_dataset})
        return cls(generation_config_from(config, "generation_config"), scorer, datasets,
                   reference_column, max_rows, saved_rows,
                   {} if shared_examples is None else shared_examples, folder, root)

    def examples(self, prefix: str) -> list[Example] | None:
        """The rows evaluated under ``prefix`` (read once), or ``None`` for an eval set this
        run was not given (``trainer.evaluate(other_set)``)."""
        if prefix not in self.datasets or self.datasets[prefix] is None:
            return None
        if prefix not in self.shared_examples:
            rows = self.datasets[prefix]
            if self.max_rows is not None:
                rows = islice(rows, self.max_rows)
            self.shared_examples[prefix] = examples_of(rows, self.reference_column)
        return self.shared_examples[prefix]

    def run(self, trainer: Any, prefix: str) -> dict[str, float]:
        """Generate for the eval set of ``prefix`` with ``trainer``'s model and score the
        answers: the metrics, named ``<prefix>_<name>``. Saves a sample of the answers."""
        examples = self.examples(prefix)
        if not examples:
            return {}
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        if prefix not in self._prompt_ids:  # tokenized once per run, not at every evaluation
            template = getattr(trainer, "chat_template", None)
            self._prompt_ids[prefix] = [prompt_ids(tokenizer, e.prompt, template)
                                        for e in examples]
        ids = self._prompt_ids[prefix]
        step = int(trainer.state.global_step)
        started = time.perf_counter()
        with trainer.autocast_smart_context_manager():
            answers = answer(trainer.model, tokenizer, ids, self.config,
                             batch_size=trainer.args.per_device_eval_batch_size,
                             seed=int(trainer.args.seed) + step,
                             synced=trainer.accelerator.num_processes > 1)
        seconds = time.perf_counter() - started
        scorer = self.scorer or exact_match
        scores = _numbers(scorer(EvalPrediction(predictions=answers,
                                                label_ids=[e.reference for e in examples])),
                          scorer)
        if trainer.is_world_process_zero() and self.saved_rows > 0:
            folder = self.folder or Path(trainer.args.output_dir)
            self._save(self.root or folder, folder, prefix, step, examples, answers)
        metrics = {k if k.startswith(f"{prefix}_") else f"{prefix}_{k}": v
                   for k, v in scores.items()}
        metrics[f"{prefix}_generation_seconds"] = round(seconds, 4)
        return metrics

    def _save(self, root: Path, run_dir: Path, prefix: str, step: int,
              examples: Sequence[Example], answers: Sequence[str]) -> None:
        lines = []
        for example, text in list(zip(examples, answers))[:self.saved_rows]:
            prompt = example.prompt if isinstance(example.prompt, str) else _text_of(
                example.prompt)
            lines.append(json.dumps({
                "step": step, "prompt": (prompt or "")[:_SAVED_CHARS],
                "answer": text[:_SAVED_CHARS],
                "reference": None if example.reference is None
                else example.reference[:_SAVED_CHARS],
            }, ensure_ascii=False))
        # The one write path below the run's folder: prompts and answers never follow a
        # link out of the experiment (docs/security.md).
        write_under(root, run_dir / "generations" / generation_file_name(prefix, step),
                    "\n".join(lines) + "\n")

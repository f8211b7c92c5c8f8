"""The generation config of a run judged by what it generates (``generation_config``), read
from what a user may write: a ``transformers.GenerationConfig``, a mapping of its fields, or
their JSON (a YAML config or the command line), and checked before anything trains."""

from __future__ import annotations

import copy
import difflib
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transformers import GenerationConfig

from ..storage.outside_text import OutsideTextError, loads
from .errors import RFConfigError
from .knobs import List, is_knob

__all__ = ["MAX_BEAMS", "MAX_LENGTH", "MAX_NEW_TOKENS", "MIN_SAMPLING_TEMPERATURE",
           "GenerationEvalFields",
           "check_generation_fields", "generation_config_from"]

# A generation config's JSON is small: a few dozen fields.
_MAX_JSON_BYTES = 64 * 1024

MAX_NEW_TOKENS = 65_536
"""The longest answer an evaluation may ask for: every eval row is answered at every
evaluation, so a longer bound is hours of generation per evaluation, not a measure."""

MAX_LENGTH = 1 << 20
"""``max_length`` (prompt and answer): the longest context windows of today's models."""

MAX_BEAMS = 64
"""``num_beams`` / ``num_beam_groups``: generation memory grows with beams times the batch."""

MIN_SAMPLING_TEMPERATURE = 1e-2
"""The lowest temperature to sample at: logits are divided by it, and far below this they
overflow to infinity and sampling fails (NaN probabilities) after a chunk of training; below
it sampling is greedy in all but name, which ``do_sample=False`` says."""


@dataclass(frozen=True)
class _Bound:
    """What a generation field takes: ``kind`` is int, real, bool or token ids; ``low`` and
    ``high`` bound a number (None: open), ``*_open`` excludes the bound itself."""

    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    example: str = ""

    def says(self) -> str:
        """The rule in words, e.g. "an integer from 1 to 65,536", "a number in (0, 1]"."""
        if self.kind == "bool":
            return "True or False"
        if self.kind == "tokens":
            return "a token id (an integer >= 0) or a list of them"
        what = "an integer" if self.kind == "int" else "a finite number"
        if self.low is not None and self.high is not None:
            if self.low == self.high:
                return f"{self.low:g}"
            if self.kind == "int":
                return f"{what} from {self.low:,} to {self.high:,}"
            return (f"{what} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                    f"{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{what} {'>' if self.low_open else '>='} {self.low:g}"
        return what

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is of this kind and within the bounds."""
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "tokens":
            ids = value if isinstance(value, list) else [value]
            return bool(ids) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                     for i in ids)
        if self.kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            return False
        number = _real(value)
        if number is None:
            return False
        low_ok = self.low is None or (number > self.low if self.low_open else number >= self.low)
        return low_ok and (self.high is None or (
            number < self.high if self.high_open else number <= self.high))


_PROBABILITY = _Bound("real", 0, 1, example="0.9")
_POSITIVE = _Bound("real", 0, low_open=True, example="1.0")
_BOOLEAN = _Bound("bool", example="False")
_TOKEN = _Bound("tokens", example="2")
# The fields a generation eval may set, checked here because transformers' validate() checks
# few of them, and some fail only at the first evaluation, after a chunk of training
# (temperature <= 0 with sampling): each field a user sets must hold its bound.
_BOUNDS: dict[str, _Bound] = {
    "max_new_tokens": _Bound("int", 1, MAX_NEW_TOKENS, example="32"),
    "min_new_tokens": _Bound("int", 0, MAX_NEW_TOKENS, example="0"),
    "max_length": _Bound("int", 1, MAX_LENGTH, example="512"),
    "min_length": _Bound("int", 0, MAX_LENGTH, example="0"),
    "num_beams": _Bound("int", 1, MAX_BEAMS, example="1"),
    "num_beam_groups": _Bound("int", 1, MAX_BEAMS, example="1"),
    # Each prompt's one answer is scored against its reference.
    "num_return_sequences": _Bound("int", 1, 1, example="1"),
    "top_k": _Bound("int", 0, example="50"),
    "no_repeat_ngram_size": _Bound("int", 0, example="0"),
    "encoder_no_repeat_ngram_size": _Bound("int", 0, example="0"),
    "temperature": _Bound("real", 0, low_open=True, example="0.7"),
    "top_p": _Bound("real", 0, 1, low_open=True, example="0.9"),
    "top_h": _Bound("real", 0, 1, low_open=True, example="0.4"),
    "typical_p": _Bound("real", 0, 1, low_open=True, example="0.9"),
    "min_p": _Bound("real", 0, 1, example="0.05"),
    "epsilon_cutoff": _Bound("real", 0, 1, high_open=True, example="0.0003"),
    "eta_cutoff": _Bound("real", 0, 1, high_open=True, example="0.0003"),
    "assistant_confidence_threshold": _PROBABILITY,
    "repetition_penalty": _Bound("real", 0, low_open=True, example="1.1"),
    "encoder_repetition_penalty": _Bound("real", 0, low_open=True, example="1.0"),
    "length_penalty": _Bound("real", example="1.0"),
    "diversity_penalty": _Bound("real", 0, example="0.0"),
    "guidance_scale": _Bound("real", example="1.5"),
    "max_time": _Bound("real", 0, low_open=True, example="30.0"),
    **dict.fromkeys(("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
                     "forced_bos_token_id", "forced_eos_token_id"), _TOKEN),
    **dict.fromkeys(("do_sample", "use_cache", "renormalize_logits", "remove_invalid_values",
                     "output_scores", "output_logits", "output_attentions",
                     "output_hidden_states", "low_memory"), _BOOLEAN),
}


def _shown(value: Any) -> str:
    """``value``'s repr for a message, cut: it may be anyone's text from a YAML or the CLI."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _real(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` (a bool, text, NaN, inf, an int too big)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _check_set_fields(fields: Mapping[str, Any], name: str) -> None:
    """:class:`RFConfigError` for the first field a user set (``fields``: the set ones) to a
    value generation cannot use: the error names the field, the value and the fix. Run before
    ``GenerationConfig`` is made, whose own checks fail on text where a number is."""
    for key, bound in _BOUNDS.items():
        value = fields.get(key)
        if value is None:  # unset: the model's own generation config decides
            continue
        # temperature 0 is a common way to say "greedy"; greedy search never reads it.
        greedy_zero = key == "temperature" and value == 0 and fields.get("do_sample") is False
        if key == "temperature" and fields.get("do_sample") and bound.holds(value) and (
                value < MIN_SAMPLING_TEMPERATURE):
            raise RFConfigError(f"`{name}.temperature` is {_shown(value)} with do_sample=True: "
                                f"sampling divides the logits by it, so it must be at least "
                                f"{MIN_SAMPLING_TEMPERATURE:g} (MIN_SAMPLING_TEMPERATURE). Use "
                                "e.g. temperature=0.7, or do_sample=False for greedy answers.")
        if not greedy_zero and not bound.holds(value):
            unset = "" if key == "max_new_tokens" else (", or leave it unset (the model's "
                                                        "generation config decides)")
            raise RFConfigError(f"`{name}.{key}` is {_shown(value)}: it must be {bound.says()}."
                                f" Use e.g. {key}={bound.example}{unset}.")
    least, most = fields.get("min_new_tokens") or 0, fields.get("max_new_tokens")
    if most is not None and least > most:
        raise RFConfigError(f"`{name}.min_new_tokens` is {least}, over max_new_tokens {most}. "
                            "Lower it or raise max_new_tokens.")
    groups, beams = fields.get("num_beam_groups") or 1, fields.get("num_beams") or 1
    if groups > beams:
        raise RFConfigError(f"`{name}.num_beam_groups` is {groups}, over num_beams {beams}: "
                            "each group needs a beam. Use num_beams >= num_beam_groups.")
    if fields.get("stop_strings"):
        raise RFConfigError(f"`{name}.stop_strings` is {_shown(fields['stop_strings'])}: "
                            "generate needs the tokenizer to match stop strings, and the "
                            "evaluation passes it token ids only. Stop on tokens instead, "
                            "e.g. eos_token_id=[2, 13], or leave stop_strings unset.")
    if fields.get("return_dict_in_generate") not in (None, False):
        raise RFConfigError(f"`{name}.return_dict_in_generate` is "
                            f"{_shown(fields['return_dict_in_generate'])}: the evaluation "
                            "decodes the answers' tokens, which generate then no longer "
                            "returns. Use return_dict_in_generate=False, or leave it unset.")


@functools.cache
def _known_fields() -> frozenset[str]:
    return frozenset(GenerationConfig().to_dict())


def generation_config_from(value: Any, name: str) -> GenerationConfig:
    """``value`` as a ``GenerationConfig`` (a copy), or :class:`RFConfigError` naming the field
    ``name`` and the fix: an unknown field (with the nearest known name), no
    ``max_new_tokens`` (each evaluation would generate up to the model's length), a field set
    to a value of the wrong type or outside its bounds (``temperature=-1``, NaN,
    ``num_beams=0``, ``max_new_tokens`` over :data:`MAX_NEW_TOKENS`, ``"3"`` for a number), or
    what ``GenerationConfig.validate`` refuses."""
    example = f"{name}=GenerationConfig(max_new_tokens=32, do_sample=False)"
    if isinstance(value, str):
        try:
            value = loads(value, what=f"`{name}`", max_bytes=_MAX_JSON_BYTES)
        except OutsideTextError as err:
            raise RFConfigError(f"{err}. Use e.g. {example}.") from None
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in _known_fields())
        if unknown:
            near = difflib.get_close_matches(unknown[0], sorted(_known_fields()), n=1)
            hint = f" (did you mean `{near[0]}`?)" if near else ""
            raise RFConfigError(f"`{name}` has no field `{unknown[0]}`{hint}; it takes the "
                                f"fields of transformers.GenerationConfig, e.g. {example}.")
        _check_set_fields(value, name)
        try:
            value = GenerationConfig(**dict(value))
        except (TypeError, ValueError) as err:
            raise RFConfigError(f"`{name}`: {err}") from None
    if not isinstance(value, GenerationConfig):
        raise RFConfigError(f"`{name}` takes a transformers.GenerationConfig or a dict of its "
                            f"fields, got {type(value).__name__}. Use e.g. {example}.")
    if value.max_new_tokens is None:
        raise RFConfigError(f"`{name}` needs max_new_tokens: every evaluation generates for "
                            f"each eval row, so bound its answers. Use e.g. {example}.")
    _check_set_fields({key: getattr(value, key, None) for key in _BOUNDS} | {
        "return_dict_in_generate": value.return_dict_in_generate,
        "stop_strings": getattr(value, "stop_strings", None)}, name)
    try:
        value.validate()
    except (TypeError, ValueError) as err:
        raise RFConfigError(f"`{name}`: {err}") from None
    return copy.deepcopy(value)


@dataclass
class GenerationEvalFields:
    """The fields of RF configs whose runs may be judged by what they generate (SFT, DPO)."""

    generation_config: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Judge each run by what it generates: at every evaluation the run answers "
            "the eval set's prompts with this transformers.GenerationConfig (or a dict of its "
            "fields; max_new_tokens is required), and the trainer's compute_metrics scores the "
            "decoded answers against the references (EvalPrediction(predictions=[answer, ...], "
            "label_ids=[reference, ...])); without compute_metrics, exact match. Logged as "
            "eval_<name>. May be a knob."
        },
    )
    generation_eval_rows: int | None = field(
        default=None,
        metadata={"help": "Generate for the first this many rows of each eval set (default: all "
                  "of them); the loss is still evaluated on every row."},
    )
    generation_saved_rows: int = field(
        default=8,
        metadata={"help": "How many (prompt, answer, reference) rows of each generation eval "
                  "are written to <run dir>/generations/<eval>-step-<N>.jsonl (0: none)."},
    )


def check_generation_fields(raw: Mapping[str, Any]) -> None:
    """:class:`RFConfigError` for a generation field set wrongly (every candidate of a knob)."""
    config = raw.get("generation_config")
    for value in config.values if isinstance(config, List) else [config]:
        if value is not None:
            generation_config_from(value, "generation_config")
    _check_sampling_fields(raw)
    for name, least in (("generation_eval_rows", 1), ("generation_saved_rows", 0)):
        if name not in raw:  # a config without these fields (GRPO)
            continue
        value = raw[name]
        candidates = value.values if isinstance(value, List) else [value]
        for v in candidates:
            if is_knob(v) or (v is None and name == "generation_eval_rows"):
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise RFConfigError(f"`{name}` must be an integer >= {least}, got {v!r}. Use "
                                    f"e.g. {name}={max(least, 8)}.")


def _check_sampling_fields(raw: Mapping[str, Any]) -> None:
    """The fields of a config that samples by itself (GRPO's ``temperature`` and
    ``generation_kwargs``; a distillation's softmax ``temperature``): every candidate."""
    for name in ("temperature", "generation_kwargs"):
        value = raw.get(name)
        for v in value.values if isinstance(value, List) else [value]:
            number = _real(v) if name == "temperature" else None
            if number is not None and 0 < number < MIN_SAMPLING_TEMPERATURE:
                raise RFConfigError(f"`temperature` is {_shown(v)}: the logits are divided by "
                                    f"it, so it must be at least {MIN_SAMPLING_TEMPERATURE:g} "
                                    "(MIN_SAMPLING_TEMPERATURE). Use e.g. temperature=0.7.")
            if name == "generation_kwargs" and isinstance(v, Mapping):
                # They override the run's sampling: the same bounds as a generation config,
                # sampling included (these trainers always sample).
                _check_set_fields({"do_sample": True, **v}, name)

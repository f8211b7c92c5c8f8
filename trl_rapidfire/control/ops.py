"""Interactive control ops: what a person (or a policy) may do to a run mid-flight.

An op is a short text, the value of the run tag ``rapidfire.op`` in the MLflow UI, the argument
of the CLI, or a call of the functions below:

=============================  ===============================================================
``stop``                       park the run, state kept; it gets no more chunks until resumed
``resume``                     put a stopped run back into the rotation
``delete``                     remove the run for good and free its state
``clone {json}``               a new run: the parent's knobs plus overrides, from scratch
``clone-warm {json}``          the same, starting from the parent's weights (and optimizer
                               moments when the shapes agree) as of its last finished chunk
=============================  ===============================================================

Overrides are a JSON object keyed by knob names as in ``run.knobs`` (config fields such as
``learning_rate``, trainer arguments such as ``peft_config``); fields inside a dataclass-valued
knob are dotted (``"peft_config.r": 32``); a knob whose candidates are objects or functions is
set to one of its original candidates by index: ``{"reward_funcs": {"candidate": 1}}``.

Text is only ever parsed as JSON, never evaluated. Ops take effect at the next chunk boundary;
every op, applied or rejected, is written to the op log with its result.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import math
import os
import time
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config.fields import CLONE_KEEPS
from ..config.knobs import List, is_knob
from ..config.plan_limits import plan_field_problem
from ..storage.csv_logs import append_row, read_rows, utc_seconds, utc_text
from ..storage.names import UntrustedValue
from ..storage.outside_text import OP_TEXT_BYTES, OutsideTextError, check_size, loads
from .clone_resources import (
    ModelShape,
    clone_values,
    free_memory_bytes,
    model_shape_of,
    resource_problems,
)
from .envelope import check_envelope, declared_for
from .override_kinds import OverrideKindError, checked_kind
from .trust import check_tag_override

__all__ = [
    "OP_DEPTH",
    "Op",
    "OpError",
    "OpOrigin",
    "OpOutcome",
    "OpRecord",
    "OpResult",
    "OpSource",
    "VERBS",
    "append_op_row",
    "read_op_rows",
    "parse_op",
    "resolve_overrides",
]

VERBS = ("stop", "resume", "delete", "clone", "clone-warm")
# An override's value is a number, a name, a list of names or a mapping of numbers (3 levels
# with the overrides' own object); a little room beyond that, nothing like a parser's limit.
OP_DEPTH = 8
_HINT = 'use one of: stop, resume, delete, clone {"knob": value}, clone-warm {"knob": value}'


class OpError(ValueError):
    """An op cannot be applied; the message says why (it becomes the op's result tag)."""


@dataclass(frozen=True)
class Op:
    """A parsed op: its verb and, for clones, the knob overrides."""

    verb: str
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_clone(self) -> bool:
        return self.verb in ("clone", "clone-warm")

    @property
    def warm(self) -> bool:
        return self.verb == "clone-warm"

    def __str__(self) -> str:
        if self.is_clone:
            return f"{self.verb} {json.dumps(dict(self.overrides), sort_keys=True)}"
        return self.verb


class OpOrigin(enum.Enum):
    """Who sent an op."""

    PYTHON = "python"  # the script's own calls: the author's, not restricted
    TAG = "tag"  # a run tag (the MLflow UI; the CLI on a tracked experiment)
    CLI = "cli"  # an op file the CLI left in an untracked experiment's inbox
    POLICY = "policy"  # the experiment's policy: the author's, but a person's op wins


@dataclass(frozen=True)
class OpSource:
    """Where an op came from; as text (``ops.csv``, tags): ``python``, ``tag``, ``cli`` or
    ``policy:<Name>``."""

    origin: OpOrigin
    policy: str | None = None  # the deciding policy's name (POLICY only)

    @classmethod
    def from_text(cls, text: str) -> OpSource:
        origin, _, name = text.partition(":")
        try:
            kind = OpOrigin(origin)
        except ValueError:
            raise ValueError(f"unknown op source {text!r}: python, tag, cli or "
                             "policy:<Name>") from None
        if (kind is OpOrigin.POLICY) != bool(name):
            raise ValueError(f"op source {text!r}: only a policy's source names it "
                             "(policy:<Name>)")
        return cls(kind, name or None)

    @property
    def outside(self) -> bool:
        """Text anyone with access to the tracking server or the folder may write: held to
        hyperparameters only."""
        return self.origin in (OpOrigin.TAG, OpOrigin.CLI)

    @property
    def automatic(self) -> bool:
        return self.origin is OpOrigin.POLICY

    def __str__(self) -> str:
        return f"policy:{self.policy}" if self.automatic else self.origin.value


class OpOutcome(enum.Enum):
    """How an op ended."""

    OK = "ok"
    ERROR = "error"
    SKIPPED = "skipped"  # a policy's op when a person's op on the run came at that boundary


@dataclass(frozen=True)
class OpResult:
    """An op's answer; as text (``ops.csv``, the ``rapidfire.op.result`` tag):
    ``<outcome>: <detail>``."""

    outcome: OpOutcome
    detail: str

    def __str__(self) -> str:
        return f"{self.outcome.value}: {self.detail}"


def parse_op(text: Any) -> Op:
    """Parse op text (``"stop"``, ``'clone-warm {"learning_rate": 1e-4}'``, ...)."""
    if not isinstance(text, str) or not text.strip():
        raise OpError(f"empty op: {_HINT}")
    try:
        check_size(text, what="the op", max_bytes=OP_TEXT_BYTES)
    except OutsideTextError as err:
        raise OpError(str(err)) from None
    verb, _, rest = text.strip().partition(" ")
    verb = verb.lower()
    rest = rest.strip()
    if verb not in VERBS:
        raise OpError(f"unknown op {verb!r}: {_HINT}")
    if verb in ("stop", "resume", "delete"):
        if rest:
            raise OpError(f"`{verb}` takes no argument, got {rest!r}")
        return Op(verb)
    if not rest:
        return Op(verb, {})
    try:
        overrides = loads(rest, what=f"the argument of `{verb}`", max_depth=OP_DEPTH)
    except OutsideTextError as err:
        shown = rest if len(rest) <= 200 else rest[:200] + "..."
        raise OpError(f"{err}: {shown!r}") from None
    if not isinstance(overrides, dict):
        raise OpError(f"`{verb}` overrides must be a JSON object like "
                      f'{{"learning_rate": 1e-4}}, got {rest!r}')
    # Said by every sender (the CLI, the panel) before the op is sent, and again when the
    # op is applied (resolve_overrides).
    for key, value in overrides.items():
        _check_value(key, value)
    return Op(verb, overrides)


def resolve_overrides(
    overrides: Mapping[str, Any],
    parent_knobs: Mapping[str, Any],
    knob_specs: Mapping[str, Any],
    config_fields: Mapping[str, Any],
    trainer_args: Mapping[str, Any],
    *,
    untrusted: bool = False,
    allowed: Collection[str] = (),
    config_class: type | None = None,
    model_shape: ModelShape | None = None,
) -> dict[str, Any]:
    """The clone's values for every overridden knob.

    Args:
        overrides: the op's JSON object.
        parent_knobs: the parent run's knob values (``run.knobs``).
        knob_specs: the experiment's knobs as declared (``List``/``Range``), by name.
        config_fields: the RF config's fields and current values (a field that was not a knob
            may be overridden too).
        trainer_args: trainer-level arguments (``peft_config``, ``model``, ...) and their
            values in the parent run.
        untrusted: the op came from a tag, the CLI or a state file, not from the script:
            only training hyperparameters may change (see :mod:`trl_rapidfire.storage.names`).
        allowed: keys the author lets tags change anyway (the config's ``clone_overrides``).
        config_class: the class of the run's config (its fields' enumerated names).
        model_shape: the parent's model's sizes, for the clone's resource estimate (default:
            read from the ``model`` trainer argument's config).

    Raises:
        OpError: unknown knob, dotted path into something that is not a dataclass, a field
            that does not exist, a candidate index out of range; for an untrusted op, a value
            outside its envelope (:mod:`~trl_rapidfire.control.envelope`) or past the clone's
            resource estimate (:mod:`~trl_rapidfire.control.clone_resources`), which the
            author's own ops get as a ``RuntimeWarning``.
    """
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        name, _, attr = key.partition(".")
        if name in CLONE_KEEPS:
            raise OpError(f"{name!r} describes the whole experiment; a clone cannot change it")
        _check_value(key, value)
        if name in parent_knobs:
            current = parent_knobs[name]
        elif name in trainer_args:
            current = trainer_args[name]
        elif name in config_fields:
            current = config_fields[name]
        else:
            known = sorted(set(parent_knobs) | {k for k in trainer_args if k != "model"})
            raise OpError(f"unknown knob {name!r}: overridable are the config fields and "
                          f"the trainer arguments {known}")
        if isinstance(value, dict) and set(value) == {"candidate"}:
            spec = knob_specs.get(key, knob_specs.get(name))
            if not isinstance(spec, List):
                raise OpError(f"{name!r} was not a List knob, so it has no candidates to pick")
            index = value["candidate"]
            if isinstance(index, bool) or not isinstance(index, int) or not (
                0 <= index < len(spec.values)
            ):
                raise OpError(f"{name!r} candidate must be an index in 0..{len(spec.values) - 1}, "
                              f"got {index!r}")
            value = spec.values[index]
        if untrusted:
            spec = knob_specs.get(name)
            declared = spec.values if isinstance(spec, List) else ()
            owner = config_class
            if attr:
                owner = type(out.get(name, current))
                declared = ()  # a candidate is a whole value, not one of its fields
            try:
                check_tag_override(key, value, owner=owner, candidates=declared,
                                   allowed=allowed, trainer_arg=name in trainer_args)
            except UntrustedValue as err:
                raise OpError(str(err)) from None
        if attr:
            base = out.get(name, current)
            if not dataclasses.is_dataclass(base) or isinstance(base, type):
                raise OpError(f"{key!r}: {name!r} holds {type(base).__name__}, not a config "
                              "object with fields")
            names = {f.name for f in dataclasses.fields(base)}
            if attr not in names:
                raise OpError(f"{key!r}: {type(base).__name__} has no field {attr!r}")
            value = _kind(key, value, getattr(base, attr), type(base), attr)
            _envelope(key, value, knob_specs, current, allowed, untrusted=untrusted)
            try:
                # replace() re-runs the config's own validation (__post_init__).
                base = dataclasses.replace(copy.deepcopy(base), **{attr: value})
            except Exception as err:  # noqa: BLE001 - reported as the op's result
                raise OpError(f"{key!r}: {type(err).__name__}: {err}") from None
            if key in parent_knobs:
                # A knob of its own (a knob inside the config object, see
                # search/object_knobs.py): the run's object is made from it when it is built.
                out[key] = value
            else:
                out[name] = base
            continue
        if is_knob(value):
            raise OpError(f"{key!r}: give one value, not a knob")
        field_of = name in config_fields and name not in trainer_args
        out[name] = _kind(key, value, current, config_class if field_of else None, name)
        _envelope(key, out[name], knob_specs, current, allowed, untrusted=untrusted)
    _check_resources(out, overrides, {**config_fields, **trainer_args, **parent_knobs},
                     model_shape, untrusted=untrusted)
    return out


def _kind(key: str, value: Any, current: Any, owner: type | None, name: str) -> Any:
    try:
        return checked_kind(key, value, current, owner, name)
    except OverrideKindError as err:
        raise OpError(str(err)) from None


def _envelope(key: str, value: Any, knob_specs: Mapping[str, Any], parent: Any,
              allowed: Collection[str], *, untrusted: bool) -> None:
    """What the experiment declared bounds what an op from outside may ask (envelope.py)."""
    if untrusted:
        try:
            check_envelope(key, value, declared_for(key, knob_specs, parent), allowed=allowed)
        except UntrustedValue as err:
            raise OpError(str(err)) from None


def _check_resources(out: Mapping[str, Any], overrides: Mapping[str, Any],
                     parent: Mapping[str, Any], shape: ModelShape | None, *,
                     untrusted: bool) -> None:
    """The clone's resource estimate (clone_resources.py): past it, an op from outside is
    refused and the author's own op is warned."""
    parent_values = {k: v for k, v in parent.items() if "." not in k and not is_knob(v)}
    if shape is None:
        shape = model_shape_of(out.get("model", parent_values.get("model")))
    problems = resource_problems(
        parent_values, clone_values(parent_values, out),
        {key.partition(".")[0]: (key, value) for key, value in overrides.items()},
        shape, free_memory_bytes())
    for problem in problems:
        if untrusted:
            raise OpError(problem.message())
        warnings.warn(problem.message(), RuntimeWarning, stacklevel=4)


def _check_value(key: str, value: Any) -> None:
    """What an override's value must be whatever its field: within the limit of a field that
    sizes the run's chunk plan (checked before anything of the clone is built: an absurd
    value would stall every run while its plan is made), and free of NaN (Python's JSON
    reads ``NaN``; a NaN ``lora_alpha`` makes the run diverge at once). A config field's own
    NaN is left to the config's checks, which word it as for the script's values."""
    problem = plan_field_problem(key, value)
    if problem is not None:
        raise OpError(problem)
    if "." not in key and isinstance(value, float):
        return
    stack, seen = [value], 0
    while stack and seen < 10_000:  # op text is bounded; so is this walk
        item = stack.pop()
        seen += 1
        if isinstance(item, float) and math.isnan(item):
            raise OpError(f"{key!r} holds NaN, which no setting takes: give a number")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


@dataclass(frozen=True)
class OpRecord:
    """One op as it was handled.

    Attributes:
        time: when it was applied (``time.time()``).
        source: ``tag`` (MLflow UI or CLI), ``python``, or ``policy:<Name>`` (the policy
            that decided).
        run: the run it targeted.
        op: the op text.
        result: ``ok: ...``, ``error: ...``, or ``skipped: ...`` (a policy's op when a
            person's op on the same run was applied at the same boundary).
    """

    time: float
    source: str
    run: str
    op: str
    result: str

    @classmethod
    def now(cls, source: str, run: str, op: str, result: str) -> OpRecord:
        return cls(time.time(), source, run, op, result)


_OP_FIELDS = [f.name for f in dataclasses.fields(OpRecord)]


def append_op_row(record: OpRecord, path: str | os.PathLike) -> None:
    """Append one record to ``ops.csv`` (the header is written with the first row), its time
    as ISO-8601 UTC text (see :mod:`~trl_rapidfire.storage.csv_logs`)."""
    append_row(path, _OP_FIELDS, {**dataclasses.asdict(record), "time": utc_text(record.time)})


def read_op_rows(path: str | os.PathLike) -> list[OpRecord]:
    """The records of the ``ops.csv`` at ``path`` (none if it does not exist), as
    :func:`append_op_row` wrote them, oldest first; a row cut short by a crash is skipped.
    Raises ``ValueError`` for a file that is not ours to read (too large, a link)."""
    out = []
    for row in read_rows(path):
        try:
            out.append(OpRecord(utc_seconds(row["time"]), row["source"] or "", row["run"] or "",
                                row["op"] or "", row["result"] or ""))
        except (KeyError, TypeError, ValueError):
            continue
    return out

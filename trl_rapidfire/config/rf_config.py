"""The RF config mixin: what makes a TRL config's fields knobs (the public configs of every
trainer kind are in :mod:`.configs`).

An RF config is the user's *description of a config group*. It keeps exactly what the user
wrote (a field holding ``List([...])`` reads back as that ``List``; ``eval_strategy="chunk"``
reads back as ``"chunk"``) and builds, for each run the search picks, a *concrete* config: an
instance of the TRL parent class with every knob replaced by one value and every
trl-rapidfire-only setting translated into something TRL accepts.

Validation happens twice, both before any training: once when the RF config is built (the
parent's own ``__post_init__`` runs on the first candidate of every knob, so a plain typo
fails as it would in TRL), and once per run when the search builds each concrete config.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..runtime.accelerate_state import preserved_accelerate_state
from ..runtime.workers import detach_from_launch
from .cadence import parse_cadence
from .errors import RFConfigError
from .fields import (
    CHUNK,
    ENGINE_EVALS,
    EXPERIMENT_WIDE,
    POLICY,
    RF_ONLY,
    STOP_DIVERGED_ATTR,
    admits,
    field_types,
    numeric_field,
    type_members,
)
from .fsdp import gang_config, normalize_fsdp_config, validating_world
from .generation import check_generation_fields
from .knobs import Knob, List, Range, describe_value, is_knob, knob_from_json
from .plan_limits import check_plan_fields
from .preflight import PreflightError, check_field_values, scalar_kind
from .removed_options import Removed

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["RFConfigMixin", "strategy_field"]


# --------------------------------------------------------------------------------------------
# The RF config mixin
# --------------------------------------------------------------------------------------------


def strategy_field(parent: type[DataclassInstance], name: str) -> Any:
    """Redeclare ``eval_strategy``/``save_strategy`` as plain strings so ``"chunk"`` parses.

    HfArgumentParser derives argparse ``choices`` from the field's enum type; redeclaring the
    field with explicit choices is what lets ``--save_strategy chunk`` through TrlParser.
    """
    original = parent.__dataclass_fields__[name]
    enum_type = next(
        m for m in type_members(field_types(parent)[name]) if isinstance(m, type) and m is not str
    )
    assert issubclass(enum_type, enum.Enum)  # transformers' IntervalStrategy / SaveStrategy
    ours = [CHUNK, POLICY] if name == "eval_strategy" else [CHUNK]
    choices = [e.value for e in enum_type] + ours
    help_text = original.metadata.get("help", "") + (
        f' trl-rapidfire adds "{CHUNK}": act at every chunk end.'
        + (f' And "{POLICY}": evaluate where the policy reads the metric and at each run\'s '
           "last chunk." if name == "eval_strategy" else "")
    )
    return field(default=original.default, metadata={"help": help_text, "choices": choices})


@dataclass
class RFConfigMixin:
    """Fields and behaviour shared by the RF configs of every trainer kind (see
    :class:`~trl_rapidfire.config.configs.RFSFTConfig`)."""

    num_chunks: int = field(
        default=4,
        metadata={
            "help": "Number of chunks each epoch of each run is cut into; runs are switched at "
            "chunk boundaries."
        },
    )
    cache_budget_bytes: int = field(
        default=4 * 2**30,
        metadata={
            "help": "Host-memory budget (bytes) of the state cache that holds swapped-out runs' "
            "adapters and optimizer states; beyond it, least recently used entries spill to "
            "<output_dir>/.rapidfire/cache on disk."
        },
    )
    checkpoint_every: str = field(
        default="60s",
        metadata={
            "help": "How often a run's state (adapter, optimizer, scheduler, random streams, "
            "data position) is written at a chunk boundary: a time of that run's training "
            '("60s", "5m", or a number of seconds) or a number of chunks ("4 chunks"; "chunk": '
            "every boundary). A crash costs at most that much of each run's training, which a "
            "re-run trains again exactly. A run's state is always written when it is stopped, "
            "finished, or leaves the worker (end of train(), Ctrl-C); a warm clone's start "
            "when the clone is made."
        },
    )
    clone_overrides: list[str] | None = field(
        default=None,
        metadata={
            "help": "Knobs or fields (dotted for a field of a config object, e.g. "
            "peft_config.target_modules) that a clone op from a run tag or the CLI may set to any "
            "value. Without it a tag may change training hyperparameters only: fields that load "
            "code or choose where files go (model, trust_remote_code, model_init_kwargs, hub and "
            "logging settings) are refused. Python calls of the script are not restricted."
        },
    )
    stop_diverged: bool | None = field(default=None, metadata={"help": "A run whose loss or "
        "weights stop being finite: True fails it at its next chunk boundary; False warns once "
        "and trains on, as TRL does; None: True when the experiment has several runs."})
    warmup_ratio: float | None = field(
        default=None,
        metadata={
            "help": "Deprecated (removed in transformers 5): the ratio form of `warmup_steps`. "
            "Use warmup_steps=<ratio below 1> instead."
        },
    )

    # The TRL class each run's concrete config is an instance of. (typing.get_type_hints reads
    # this annotation at run time: it names only what is imported at run time.)
    trl_config_class: ClassVar[type[Any]]
    _removed_options: ClassVar[dict[str, Removed]] = {}
    _rf_only_fields: ClassVar[frozenset[str]] = RF_ONLY

    if TYPE_CHECKING:
        # Set by __post_init__ (object.__setattr__), never dataclass fields: declared for the
        # type checker only, as fields it is told not to put in __init__.
        _rf_raw: dict[str, Any] = field(init=False)  # what the user wrote, knobs included
        _rf_knobs: dict[str, Knob] = field(init=False)  # the fields that hold a knob

    # ---- construction ------------------------------------------------------------------------

    def __post_init__(self) -> None:
        # Under accelerate launch / torchrun this process is one worker training whole runs:
        # leave the launcher's world before the first TrainingArguments sees it.
        detach_from_launch()
        raw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        knobs = self._collect_knobs(raw)
        self._check_rf_fields(raw)
        fsdp_config = raw.get("fsdp_config")
        if fsdp_config and isinstance(fsdp_config, Mapping):
            raw["fsdp_config"] = normalize_fsdp_config(fsdp_config)
        elif isinstance(fsdp_config, List):
            # Every candidate is mapped: a seed-era key must not be ignored in any run.
            raw["fsdp_config"] = knobs["fsdp_config"] = List([
                normalize_fsdp_config(v) if isinstance(v, Mapping) else v
                for v in fsdp_config.values
            ])
        if raw.get("warmup_ratio") is not None:
            warnings.warn(
                "`warmup_ratio` was removed in transformers 5; trl-rapidfire passes it on as "
                "`warmup_steps` (values below 1 are ratios of the total steps).",
                FutureWarning,
                stacklevel=3,
            )
        # What the user wrote, knobs included: every concrete config is built from this.
        object.__setattr__(self, "_rf_raw", raw)
        object.__setattr__(self, "_rf_knobs", knobs)

        # Validate through the parent exactly as TRL would, on one representative value per knob.
        representative = {name: _first_value(knob) for name, knob in knobs.items()}
        parent_kwargs = self._parent_kwargs(representative)
        for name, value in parent_kwargs.items():
            object.__setattr__(self, name, _copied(value))
        try:
            # Types before TRL (a wrong type fails there as a bare comparison), ranges after it,
            # so that where TRL checks a range its own words are the ones seen.
            with _as_config_error():
                check_field_values(self.trl_config_class, parent_kwargs, ranges=False)
            # An FSDP value is checked where its run is built: in the launch's world.
            with validating_world(parent_kwargs):
                self.trl_config_class.__post_init__(self)
            with _as_config_error():
                check_field_values(self.trl_config_class,
                                   {n: getattr(self, n) for n in parent_kwargs})
        except (ValueError, TypeError) as err:
            if not knobs:
                raise
            chosen = ", ".join(f"{k}={describe_value(v)}" for k, v in representative.items())
            raise type(err)(f"{err} (checked with the first value of each knob: {chosen})") from err
        finally:
            # Read back what the user wrote: knobs, "chunk", the warm-up ratio.
            restore = list(knobs)
            restore += [n for n in ("eval_strategy", "save_strategy") if raw[n] == CHUNK]
            restore += ["eval_strategy"] if raw["eval_strategy"] == POLICY else []
            if raw["warmup_ratio"] is not None:
                restore.append("warmup_steps")
            for name in restore:
                object.__setattr__(self, name, raw[name])
        if raw["eval_strategy"] in ENGINE_EVALS:
            self.do_eval = True
        object.__setattr__(self, "_rf_ready", True)

    def __setattr__(self, name: str, value: Any) -> None:
        # Scripts set fields after parsing (TRL's sft.py sets `model_init_kwargs`): every run's
        # concrete config is built from the raw values, so they must follow such assignments.
        super().__setattr__(name, value)
        if not self.__dict__.get("_rf_ready") or name not in self._rf_raw:
            return
        raw = dict(self._rf_raw)
        raw[name] = value
        knobs = self._collect_knobs(raw)
        object.__setattr__(self, "_rf_raw", raw)
        object.__setattr__(self, "_rf_knobs", knobs)

    def _collect_knobs(self, raw: dict[str, Any]) -> dict[str, Knob]:
        # Typed `type`: mypy finds type[RFConfigMixin] unhashable, a class being hashable
        # (python/mypy#11470).
        owner: type = type(self)
        types = field_types(owner)
        knobs: dict[str, Knob] = {}
        for name, value in raw.items():
            tp = types.get(name, Any)
            if not is_knob(value):
                # YAML's {List: [...]}; fields that take mappings are read too, since a knob is
                # the only meaning a lone List/Range key can have there.
                parsed = knob_from_json(value, name)
                if parsed is not None:
                    value = raw[name] = parsed
            if is_knob(value):
                if name in EXPERIMENT_WIDE:
                    raise RFConfigError(
                        f"`{name}` describes the whole experiment and cannot be a knob; "
                        "give one value."
                    )
                if isinstance(value, Range) and not numeric_field(tp):
                    raise RFConfigError(
                        f"`{name}` is not numeric ({tp}); a Range cannot set it. Use List([...])."
                    )
                if isinstance(value, Range) and scalar_kind(tp) in ("int", "int_or_str"):
                    value = value.for_integer_field(name)  # raw keeps what the user wrote
                knobs[name] = value
            elif isinstance(value, (list, tuple)) and not admits(tp, (list, tuple)):
                shown = ", ".join(str(v) for v in value)
                raise RFConfigError(
                    f"`{name}` takes a single value, got the plain list {value!r}. To compare "
                    f"several values, write {name}=List({list(value)!r}) in Python, or "
                    f"{name}: {{List: [{shown}]}} in YAML."
                )
        return knobs

    def _check_rf_fields(self, raw: dict[str, Any]) -> None:
        chunks = raw["num_chunks"]
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise RFConfigError(
                f"`num_chunks` must be an integer >= 1, got {chunks!r}. Use e.g. num_chunks=4."
            )
        budget = raw["cache_budget_bytes"]
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise RFConfigError(
                f"`cache_budget_bytes` must be an integer >= 0, got {budget!r}. "
                "Use e.g. cache_budget_bytes=4 * 2**30 (4 GiB); 0 keeps parked runs on disk."
            )
        if not isinstance(raw["stop_diverged"], (bool, type(None))):
            raise RFConfigError(f"`stop_diverged` is True, False or None, got "
                                f"{raw['stop_diverged']!r}.")
        check_plan_fields(raw)  # before TRL's own checks: nothing is sized by a bomb
        parse_cadence(raw["checkpoint_every"])
        check_generation_fields(raw)
        allowed = raw.get("clone_overrides")
        if allowed is not None and (isinstance(allowed, str) or not all(
                isinstance(k, str) and k for k in allowed)):
            raise RFConfigError(
                f"`clone_overrides` is a list of knob or field names, got {allowed!r}. Use e.g. "
                'clone_overrides=["model", "peft_config.target_modules"].'
            )
        ratio = raw.get("warmup_ratio")
        if ratio is not None and not is_knob(ratio):
            _check_warmup_ratio(ratio, raw.get("warmup_steps"))
        for name, removed in self._removed_options.items():
            value = raw.get(name)
            if any(value is h or value == h for h in removed.harmless):
                if value is not None:
                    warnings.warn(
                        f"`{name}={value!r}` is ignored: {removed.message}",
                        FutureWarning,
                        stacklevel=4,
                    )
                continue
            raise RFConfigError(f"`{name}={value!r}`: {removed.message}")

    # ---- concrete configs ----------------------------------------------------------------------

    def raw_values(self) -> dict[str, Any]:
        """Every field as the user wrote it (knobs, ``"chunk"``, ``warmup_ratio``): what each
        run's concrete config is built from."""
        return dict(self._rf_raw)

    @property
    def knobs(self) -> dict[str, Knob]:
        """The config fields that hold a knob, in field order."""
        return dict(self._rf_knobs)

    def _parent_kwargs(self, choices: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of the TRL parent for one choice of every knob."""
        kwargs: dict[str, Any] = {}
        for name, value in self._rf_raw.items():
            if name in self._rf_only_fields or name in self._removed_options:
                continue
            kwargs[name] = value
        for name, value in choices.items():
            if name not in self._rf_raw:
                raise RFConfigError(f"{type(self).__name__} has no field `{name}`.")
            if name not in self._rf_only_fields:
                kwargs[name] = value
        for name in ("eval_strategy", "save_strategy"):
            if kwargs[name] == CHUNK or (name == "eval_strategy" and kwargs[name] == POLICY):
                # TRL never sees "chunk": the engine does the chunk-time work itself.
                kwargs[name] = "no"
        if kwargs.get("activation_checkpointing", False) is None and "gradient_checkpointing" \
                not in self._rf_knobs and kwargs.get("gradient_checkpointing") == \
                self.trl_config_class.__dataclass_fields__["gradient_checkpointing"].default:
            # TRL defaults gradient_checkpointing, the name transformers 5 deprecates, and
            # TrainingArguments warns (FutureWarning) on every config that leaves it so. Pass
            # TRL's default under the new name, as TrainingArguments itself moves it over; a
            # value the user wrote under the old name still gets transformers' warning.
            kwargs["activation_checkpointing"] = kwargs["gradient_checkpointing"]
        if not kwargs.get("fsdp"):
            # Each run trains in a world of one (see workers.py): a DDP backend would make
            # the Trainer ask for a process group that does not exist outside a launch.
            kwargs["ddp_backend"] = None
        ratio = choices.get("warmup_ratio", self._rf_raw.get("warmup_ratio"))
        if ratio is not None:
            _check_warmup_ratio(ratio, kwargs.get("warmup_steps"))
            kwargs["warmup_steps"] = float(ratio)
        return kwargs

    def concrete_config(self, choices: Mapping[str, Any] | None = None, **overrides: Any) -> Any:
        """Build the TRL config of one run.

        Args:
            choices: one value for each knob field (missing knobs are an error).
            **overrides: further field values (e.g. a run's own ``output_dir``).

        Returns:
            An instance of the TRL parent class (``SFTConfig``, ``DPOConfig``, ...).
        """
        choices = dict(choices or {})
        missing = [k for k in self._rf_knobs if k not in choices and k not in overrides]
        if missing:
            raise RFConfigError(f"No value chosen for knob(s) {missing}.")
        kwargs = self._parent_kwargs({**choices, **overrides})
        with _as_config_error():  # ranges are checked by check_run, after TRL's own checks
            check_field_values(self.trl_config_class, kwargs, ranges=False)
        kwargs = {k: _copied(v) for k, v in kwargs.items()}
        if kwargs.get("fsdp"):
            config = gang_config(self.trl_config_class, kwargs)
        else:
            with preserved_accelerate_state():
                config = self.trl_config_class(**kwargs)
        setattr(config, STOP_DIVERGED_ATTR, self._rf_raw["stop_diverged"])  # not a TRL field
        return config

    def to_dict(self) -> dict[str, Any]:
        """Like ``TrainingArguments.to_dict()``, with knobs written as ``{"List": [...]}`` /
        ``{"Range": {...}}`` (the form YAML configs use)."""
        out = super().to_dict()  # type: ignore[misc]
        if hasattr(out.get("generation_config"), "to_diff_dict"):
            out["generation_config"] = {k: v for k, v in out["generation_config"].to_diff_dict()
                                        .items() if k != "transformers_version"}
        for name, knob in self._rf_knobs.items():
            out[name] = knob.to_json()
        return out


@contextlib.contextmanager
def _as_config_error() -> Iterator[None]:
    try:
        yield
    except PreflightError as err:
        raise RFConfigError(str(err)) from None


def _check_warmup_ratio(ratio: Any, warmup_steps: Any) -> None:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
        raise RFConfigError(
            f"`warmup_ratio` must be a number in [0, 1), got {ratio!r}. In transformers 5 write "
            "warmup_steps=<ratio> instead (values below 1 are ratios)."
        )
    if warmup_steps not in (None, 0, 0.0):
        raise RFConfigError(
            f"Both `warmup_ratio`={ratio!r} and `warmup_steps`={warmup_steps!r} are set. "
            "Keep one: warmup_steps=<ratio below 1, or a step count>."
        )


def _first_value(knob: Knob) -> Any:
    if isinstance(knob, List):
        return knob.values[0]
    assert isinstance(knob, Range)  # a knob is a List or a Range
    return knob.low


def _copied(value: Any) -> Any:
    # TRL normalises some values in place (fsdp_config, lists): give every run its own copy.
    try:
        return copy.deepcopy(value)
    except Exception:
        return value

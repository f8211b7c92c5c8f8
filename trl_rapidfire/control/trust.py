"""What text from outside the script may change: a clone from a run tag, the CLI or an op file
changes training hyperparameters only.

Anyone who can set a tag on the tracking server (or write into the experiment folder) is not
necessarily the experiment's author. A field may be overridden when its value is a number, a
bool, one of the names the field enumerates (``lr_scheduler_type``, ``loss_type``, ...), a
module name (``peft_config.target_modules``), or one of the candidates the script itself
declared for that knob. Fields that load code, name files, hosts or hub repositories
(``model``, ``trust_remote_code``, ``model_init_kwargs``, ``output_dir``, ``hub_*``,
``report_to``, ...) are refused, whatever the value, unless the author lists them in
``clone_overrides``. Python calls in the script's own process are the author's and are not
restricted. Names and paths read back from files: :mod:`trl_rapidfire.storage.names`.

How large a number may be is not this module's: :mod:`trl_rapidfire.control.envelope` holds
every number to what the experiment declared, and
:mod:`trl_rapidfire.control.clone_resources` the clone to what the machine holds.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
import typing
from collections.abc import Collection, Sequence
from typing import Any

from ..config.fields import allowed_values
from ..storage.names import UntrustedValue

__all__ = ["UntrustedValue", "check_tag_override", "refused_by_name"]


# Fields that load or run code, or choose files, hosts, repositories or logging destinations.
# Matched against the field's own name (the part after the last dot).
_CODE_OR_PLACE = re.compile(
    r"remote_code|hub|push_to|(^|_)token$|auth_token|vllm|_port$|^port$|(^|_)host|(^|_)url|"
    r"_dir$|_dirs?_|^dir_|path|(^|_)file|report_to|deepspeed|fsdp|accelerator_config|"
    r"local_rank|ddp|use_cpu|compile|liger|kernel|init_kwargs|callback|resume|revision|"
    r"template|^device|(^|_)device(_map)?$|tpu|xla|debug|^output|_output_dir|run_name|use_mps|"
    r"jit|ipex|backend|mp_parameters|project|trackio|wandb|(^|_)model$|^tokenizer|processor|"
    r"processing_class|^ref_model|^reward_model|dataset_name"
)
# Fields whose strings are module names: not code, not paths.
_MODULE_NAME_FIELDS = frozenset({"target_modules", "modules_to_save", "exclude_modules"})
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*|all-linear")


def _refusal(key: str, why: str) -> UntrustedValue:
    return UntrustedValue(
        f"{key!r} {why}; a tag or the CLI may change training hyperparameters only. Set it "
        f"in the script, or let tags change it with clone_overrides=[{key!r}] in the config"
    )


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: no enumerated names known
        return {}


def _enumerated(cls: type | None, name: str) -> frozenset[str] | None:
    """The names a string field of ``cls`` takes (metadata choices, Enum or Literal types, or
    the names TRL lists in its help text), or ``None`` for free-form text."""
    if cls is None or not dataclasses.is_dataclass(cls):
        return None
    fld = cls.__dataclass_fields__.get(name)
    if fld is None:
        return None
    if fld.metadata.get("choices"):
        return frozenset(str(c) for c in fld.metadata["choices"])
    names: set[str] = set()
    stack = [_hints(cls).get(name)]
    while stack:
        tp = stack.pop()
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            names |= {str(m.value) for m in tp}
        elif typing.get_origin(tp) is typing.Literal:
            names |= {str(a) for a in typing.get_args(tp) if isinstance(a, str)}
        else:
            stack.extend(typing.get_args(tp))
    if names:
        return frozenset(names)
    for base in cls.__mro__:
        if dataclasses.is_dataclass(base) and name in base.__dataclass_fields__:
            found = allowed_values(base, name)
            if found is not None:
                return found
    return None


def _check_leaves(key: str, field_name: str, value: Any, cls: type | None) -> None:
    if value is None or isinstance(value, (bool, int, float)):
        return
    if isinstance(value, str):
        if field_name in _MODULE_NAME_FIELDS:
            if _MODULE_NAME.fullmatch(value) is None:
                raise _refusal(key, f"takes module names, and {value!r} is not one")
            return
        names = _enumerated(cls, field_name)
        if names is None:
            raise _refusal(key, "is free-form text (it could name a file, module or host)")
        if value not in names:
            raise UntrustedValue(f"{key!r}={value!r} is not one of {sorted(names)}")
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_leaves(key, field_name, item, cls)
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)):
                raise _refusal(key, f"has the key {k!r}, which is not a plain name")
            if isinstance(item, str) or not isinstance(item, (bool, int, float, type(None))):
                raise _refusal(key, "holds a mapping with text or nested values")
        return
    raise _refusal(key, f"holds {type(value).__name__} values")


def refused_by_name(key: str) -> str | None:
    """Why a tag may never set ``key`` whatever its value (it loads code or names a place),
    or ``None`` when its value decides. What a clone form offers to edit; the script's
    ``clone_overrides`` can still let such a key through, and the op's answer says so."""
    field_name = key.rpartition(".")[2]
    if _CODE_OR_PLACE.search(field_name):
        return "loads code or chooses where files, logs or models go"
    return None


def check_tag_override(
    key: str, value: Any, *, owner: type | None, candidates: Sequence[Any] = (),
    allowed: Collection[str] = (), trainer_arg: bool = False,
) -> None:
    """Raise :class:`UntrustedValue` unless a tag may set ``key`` (``name`` or
    ``name.field``) to ``value``.

    Args:
        key: the override's key as written in the op.
        value: its JSON value, or the candidate a ``{"candidate": i}`` picked.
        owner: the dataclass the field belongs to (the config class, or the class of a
            dataclass knob such as ``LoraConfig`` for a dotted key), for its enumerated names.
        candidates: the values the script declared for this knob (``List`` candidates): one
            of them is always allowed, it is the author's own.
        allowed: the author's ``clone_overrides``: keys (or knob names) let through as given.
        trainer_arg: ``key`` names a trainer argument (``model``, ``reward_funcs``, ...):
            those are objects or places; only a declared candidate may be picked.
    """
    name = key.partition(".")[0]
    if key in allowed or name in allowed:
        return
    if any(value is c or (type(value) is type(c) and value == c) for c in candidates):
        return
    field_name = key.rpartition(".")[2]
    if trainer_arg and "." not in key:
        raise _refusal(key, "is a trainer argument (an object, function or model); pick one "
                       f'of the script\'s candidates with {{"{key}": {{"candidate": 0}}}}')
    why = refused_by_name(key)
    if why is not None:
        raise _refusal(key, why)
    _check_leaves(key, field_name, value, owner)

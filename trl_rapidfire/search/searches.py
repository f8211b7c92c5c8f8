"""The search: how knobs expand into runs.

``GridSearch`` takes the cartesian product of every ``List``; ``RandomSearch`` draws each run's
values at random. Both accept *zip groups*: knobs that move together instead of being crossed
(reward-function sets with their weights, a model with its tokenizer).

Expansion order is fixed and documented, so run names are stable across re-runs of a script:
axes are the config's knob fields in dataclass field order, then the trainer-level knobs in the
order they were passed; a zip group sits where its first member would; the last axis varies
fastest. Runs are named ``run-0``, ``run-1``, ... in that order.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import itertools
import random
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.configs import RFConfigError, RFConfigMixin
from ..config.knobs import Knob, KnobError, List, Range, describe_value, is_knob, same_value
from ..config.preflight import PreflightError, check_run
from ..runtime.accelerate_state import preserved_accelerate_state
from .object_knobs import build_objects, inner_knobs, knob_fields

__all__ = ["AdaptiveSearch", "Axis", "GridSearch", "RandomSearch", "RunSpec",
           "Search", "SearchError"]


class SearchError(ValueError):
    """The search cannot expand these knobs. The message names the knob (and run) and the fix."""


@dataclass
class RunSpec:
    """One run of a config group.

    Attributes:
        name: ``run-<index>``.
        index: position in expansion order.
        knobs: knob name -> the value chosen for this run, names exactly as the user wrote them
            (config field names and trainer argument names). Only knobs, not fixed values.
        config: the run's concrete TRL config (an ``SFTConfig``/``DPOConfig``/``GRPOConfig``).
        trainer_kwargs: every trainer-level argument given to the search, with knobs resolved.
    """

    name: str
    index: int
    knobs: dict[str, Any]
    config: Any
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """``learning_rate=0.0002, lr_scheduler_type='cosine'``: the knob values, for humans."""
        shown = ", ".join(f"{k}={describe_value(v)}" for k, v in self.knobs.items())
        return shown or "(single config)"


@dataclass(frozen=True)
class Axis:
    """One dimension of the search: a single knob, or a zip group of Lists of equal length."""

    names: tuple[str, ...]
    knobs: tuple[Knob, ...]

    @property
    def is_range(self) -> bool:
        return isinstance(self.knobs[0], Range)

    @property
    def lists(self) -> tuple[List, ...]:
        """The knobs of an axis that is not a Range: Lists (a zip group holds Lists only)."""
        lists = tuple(k for k in self.knobs if isinstance(k, List))
        assert len(lists) == len(self.knobs), self.knobs
        return lists

    def __len__(self) -> int:
        return len(self.knobs[0])  # type: ignore[arg-type]

    def values(self, draw: Any) -> dict[str, Any]:
        """Knob values for one draw: an index into the Lists, or a sampled Range value."""
        if self.is_range:
            return {self.names[0]: draw}
        return {n: k.values[draw] for n, k in zip(self.names, self.lists)}


def _check_distinct(axis: Axis) -> None:
    """Two positions of an axis with the same values would train one configuration twice."""
    if axis.is_range:
        return
    lists = axis.lists
    for j, i in _repeated_positions(axis):
        names = " and ".join(f"`{n}`" for n in axis.names)
        shown = ", ".join(describe_value(k.values[i]) for k in lists)
        raise SearchError(
            f"{names} holds the candidate {shown} twice (positions {j} and {i}); each "
            "candidate must be distinct, or one configuration would be trained twice."
        )


def _repeated_positions(axis: Axis) -> Iterator[tuple[int, int]]:
    """Pairs ``(j, i)``, ``j < i``, of an axis's positions that hold the same values
    (:func:`same_value`), the first repeat first. Hashable values are looked up (a thousand
    learning rates compared pairwise took half a second); others are compared pairwise."""
    lists = axis.lists
    first: dict[tuple[Any, ...], int] = {}
    try:
        for i in range(len(axis)):
            key = tuple((type(k.values[i]), k.values[i]) for k in lists)
            j = first.setdefault(key, i)
            if j != i:
                yield j, i
                return
        return
    except TypeError:  # an unhashable candidate (a LoRA config, a list): pairwise
        pass
    for i in range(len(axis)):
        for j in range(i):
            if all(same_value(k.values[i], k.values[j]) for k in lists):
                yield j, i
                return


class Search:
    """What every search shares: the knob axes of a config group, zip groups, and building one
    run's spec from a draw. Grid and random searches expand a config group into all their runs
    before training (:class:`ExpandingSearch`); an adaptive search proposes them while it
    trains (:class:`AdaptiveSearch`).

    Args:
        zip: groups of knob names whose ``List``s are paired element-wise instead of crossed,
            e.g. ``[("reward_funcs", "reward_weights")]``. All Lists in a group must have the
            same length.
    """

    def __init__(self, zip: Sequence[Sequence[str]] = ()):  # noqa: A002 - the public name
        groups: list[tuple[str, ...]] = []
        seen: set[str] = set()
        for group in zip:
            if isinstance(group, str) or not isinstance(group, Sequence) or len(group) < 2:
                raise SearchError(
                    f"zip takes groups of at least two knob names, e.g. "
                    f'zip=[("reward_funcs", "reward_weights")]; got {group!r}.'
                )
            for name in group:
                if name in seen:
                    raise SearchError(f"Knob `{name}` appears in more than one zip group.")
                seen.add(name)
            groups.append(tuple(group))
        self.zip_groups: tuple[tuple[str, ...], ...] = tuple(groups)

    def objective(self) -> tuple[str, bool] | None:
        """What the search optimizes, ``(metric, greater_is_better)``, or ``None`` for a
        search that only enumerates (grid, random): the best run is the search's best unless
        the config names ``metric_for_best_model``."""
        return None

    def knob_axes(self, rf_config: Any,
                  trainer_level: Mapping[str, Any]) -> tuple[dict[str, Knob], list[Axis]]:
        """Every knob of the config group (config fields first, in field order, then the
        trainer-level ones as passed) and the axes they form (a zip group is one axis),
        checked."""
        config_knobs: Mapping[str, Knob] = (
            rf_config.knobs if isinstance(rf_config, RFConfigMixin) else {}
        )
        clash = sorted(set(config_knobs) & set(trainer_level))
        if clash:
            raise SearchError(f"{clash} given both as config fields and as trainer arguments.")
        for name, value in trainer_level.items():
            if isinstance(value, Range):
                raise SearchError(
                    f"`{name}`={value!r}: a Range draws numbers, and `{name}` is a trainer "
                    f"argument, not a number. Give its candidates: {name}=List([...])."
                )
            for candidate in (value.values if isinstance(value, List) else ()):
                _check_no_nested_knob(name, candidate)
        all_knobs: dict[str, Knob] = dict(config_knobs)
        for name, value in trainer_level.items():
            if is_knob(value):
                all_knobs[name] = value
                continue
            try:  # knobs inside a config object: LoraConfig(r=List([8, 16]))
                all_knobs.update(inner_knobs(name, value))
            except KnobError as err:
                raise SearchError(str(err)) from None
        return all_knobs, self._axes(all_knobs)

    def _axes(self, knobs: Mapping[str, Knob]) -> list[Axis]:
        group_of = {name: group for group in self.zip_groups for name in group}
        for group in self.zip_groups:
            for name in group:
                if name not in knobs:
                    raise SearchError(
                        f"zip names `{name}`, which is not a knob here: make it a List([...]) "
                        "or remove it from zip."
                    )
                if not isinstance(knobs[name], List):
                    raise SearchError(
                        f"zip pairs Lists element-wise, but `{name}` is {knobs[name]!r}. "
                        "Use a List of the same length as the other members."
                    )
            lengths = {name: len(knobs[name]) for name in group}  # type: ignore[arg-type]
            if len(set(lengths.values())) > 1:
                raise SearchError(
                    f"Zipped Lists must have equal lengths, got {lengths}. Give each member one "
                    "candidate per position."
                )
        axes: list[Axis] = []
        placed: set[tuple[str, ...]] = set()
        for name in knobs:
            group = group_of.get(name, (name,))
            if group in placed:
                continue
            placed.add(group)
            axis = Axis(group, tuple(knobs[n] for n in group))
            _check_distinct(axis)
            axes.append(axis)
        return axes

    @staticmethod
    def build_run(
        name: str,
        index: int,
        knobs: dict[str, Any],
        rf_config: Any,
        trainer_level: Mapping[str, Any],
    ) -> RunSpec:
        """The run ``name`` with these ``knobs`` chosen (a draw of :meth:`expand`, or a
        clone's: its parent's knobs and the op's overrides), validated.

        ``trainer_level``: the trainer arguments (chosen ones replace them); every other knob
        is a config field, set on a concrete copy of ``rf_config``. Raises
        :class:`SearchError` naming the run, its values and the field at fault."""
        desc = ", ".join(f"{k}={describe_value(v)}" for k, v in knobs.items())
        where = f"{name} ({desc})" if desc else name
        try:
            # A config object's fields chosen by dotted knobs (peft_config.r): the object is
            # made by its own class from the argument as given, with the run's values in.
            objects = build_objects(knobs, trainer_level)
            trainer_kwargs = {k: objects.get(k, knobs.get(k, v))
                              for k, v in trainer_level.items()}
            config_choices = {k: v for k, v in knobs.items() if k not in trainer_level
                              and k.partition(".")[0] not in objects}
            for arg, value in trainer_kwargs.items():
                if unchosen := knob_fields(value):
                    raise KnobError(f"`{arg}` still holds knobs: no value was chosen for "
                                    f"{sorted(unchosen)}")
            if isinstance(rf_config, RFConfigMixin):
                config = rf_config.concrete_config(config_choices)
            elif config_choices:
                # A clone of a plain TRL config: its __post_init__ runs again, and sets up
                # accelerate's state, which stays the script's.
                with preserved_accelerate_state():
                    config = dataclasses.replace(copy.deepcopy(rf_config), **config_choices)
            else:
                config = copy.deepcopy(rf_config)
            check_run(config, trainer_kwargs)
        except (RFConfigError, PreflightError, KnobError) as err:
            raise SearchError(f"{where}: {err}") from err
        except (ValueError, TypeError) as err:
            # TRL's own validation error: keep its words, say which run and values caused it.
            raise SearchError(f"{where}: {type(err).__name__}: {err}") from err
        return RunSpec(name=name, index=index, knobs=knobs, config=config,
                       trainer_kwargs=trainer_kwargs)


class ExpandingSearch(Search, abc.ABC):
    """A search whose runs are all known before training: it expands a config group into them
    (:class:`GridSearch`, :class:`RandomSearch`)."""

    @abc.abstractmethod
    def _draws(self, axes: Sequence[Axis]) -> list[tuple[Any, ...]]:
        """One tuple of value indices (or ``Range`` draws) per run, one entry per axis."""

    # ---- expansion ----------------------------------------------------------------------------

    def expand(self, rf_config: Any, **trainer_level: Any) -> list[RunSpec]:
        """Expand a config group into its runs, validating every run before returning.

        Args:
            rf_config: an ``RFSFTConfig``/``RFDPOConfig``/``RFGRPOConfig`` (a plain TRL config is
                taken as a single configuration).
            **trainer_level: trainer arguments that may be knobs (``model``, ``peft_config``,
                ``formatting_func``, ``reward_funcs``, ``processing_class``, ...). Plain values
                are passed through unchanged to every run.

        Raises:
            SearchError: a knob cannot be searched this way, or a run's values are invalid (the
                message names the run, its knob values and the field at fault).
        """
        all_knobs, axes = self.knob_axes(rf_config, trainer_level)
        runs: list[RunSpec] = []
        first_of: dict[tuple[Any, ...], str] = {}
        for draw_no, draw in enumerate(self._draws(axes)):
            key = tuple(draw)
            if key in first_of:
                warnings.warn(
                    f"{type(self).__name__} draw {draw_no} is identical to {first_of[key]}; it is "
                    "trained once.",
                    UserWarning,
                    stacklevel=2,
                )
                continue
            chosen: dict[str, Any] = {}
            for axis, d in zip(axes, draw):
                chosen.update(axis.values(d))
            # Report knobs in the order the user declared them, whatever the zip grouping.
            knobs = {name: chosen[name] for name in all_knobs}
            name = f"run-{len(runs)}"
            first_of[key] = name
            runs.append(self.build_run(name, len(runs), knobs, rf_config, trainer_level))
        return runs


class GridSearch(ExpandingSearch):
    """Every combination of the ``List`` knobs (their cartesian product).

    A ``Range`` has no finite set of values and is an error here; use :class:`RandomSearch`.

    Example::

        GridSearch().expand(RFSFTConfig(..., learning_rate=List([1e-4, 1e-3])),
                            peft_config=List([lora_r8, lora_r16]))   # 4 runs
        GridSearch(zip=[("reward_funcs", "reward_weights")])          # pair, don't cross
    """

    def _draws(self, axes: Sequence[Axis]) -> list[tuple[Any, ...]]:
        for axis in axes:
            if axis.is_range:
                raise SearchError(
                    f"`{axis.names[0]}`={axis.knobs[0]!r} is a Range, which grid search cannot "
                    "enumerate. Use RandomSearch(num_runs=...) or a List of values."
                )
        return list(itertools.product(*(range(len(axis)) for axis in axes)))

    def __repr__(self) -> str:
        return f"GridSearch(zip={list(self.zip_groups)!r})" if self.zip_groups else "GridSearch()"


class RandomSearch(ExpandingSearch):
    """``num_runs`` draws: each ``List`` uniformly, each ``Range`` uniformly (log-uniformly with
    ``log=True``). Deterministic given ``seed``. Identical draws are reported and trained once.

    Args:
        num_runs: how many draws (>= 1).
        seed: seed of the search's own random generator (independent of training seeds).
        zip: as for :class:`GridSearch`.
    """

    def __init__(self, num_runs: int, seed: int = 0, zip: Sequence[Sequence[str]] = ()):  # noqa: A002
        if isinstance(num_runs, bool) or not isinstance(num_runs, int) or num_runs < 1:
            raise SearchError(f"RandomSearch needs num_runs >= 1, got {num_runs!r}.")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise SearchError(f"RandomSearch seed must be an integer, got {seed!r}.")
        super().__init__(zip=zip)
        self.num_runs = num_runs
        self.seed = seed

    def _draws(self, axes: Sequence[Axis]) -> list[tuple[Any, ...]]:
        rng = random.Random(self.seed)
        draws = []
        for _ in range(self.num_runs):
            draws.append(
                tuple(axis.knobs[0].sample(rng) if axis.is_range
                      else axis.lists[0].sample_index(rng)
                      for axis in axes)
            )
        return draws

    def __repr__(self) -> str:
        zipped = f", zip={list(self.zip_groups)!r}" if self.zip_groups else ""
        return f"RandomSearch(num_runs={self.num_runs}, seed={self.seed}{zipped})"


class AdaptiveSearch(Search, abc.ABC):
    """A search that proposes its runs while the experiment trains, from the results of the
    runs before them (:class:`~trl_rapidfire.integrations.optuna.search.OptunaSearch`).

    The RF trainers set it up in two steps: :meth:`describe` (before anything is written:
    what identifies the experiment, with every knob checked) and :meth:`start` (the first
    runs, and the proposer the engine asks for more; see
    :mod:`trl_rapidfire.engine.proposals`)."""

    metric: str  # the logged metric the search optimises (e.g. "eval_loss"), set by subclasses
    metrics: tuple[str, ...]  # every objective (several: a multi-objective search), the first
    # of them `metric`

    @abc.abstractmethod
    def describe(self, rf_config: Any, **trainer_level: Any) -> Any:
        """What identifies this search over this config group (JSON-able, the same in every
        process running the script); raises :class:`SearchError` for a bad knob."""

    @abc.abstractmethod
    def start(self, rf_config: Any, layout: Any,
              **trainer_level: Any) -> tuple[list[RunSpec], Any]:
        """The runs to build before training, and the proposer for the rest (its state kept
        in the experiment's folder, ``layout``: shared by every worker, continued by a
        re-run)."""


def _check_no_nested_knob(name: str, value: Any) -> None:
    """A knob inside a config object that is a candidate of a List (``List([LoraConfig(r=List(
    [8, 16]))])``) would reach PEFT as a ``List``: say how to write it instead."""
    for field_name, inner in knob_fields(value).items():
        kind = type(value).__name__
        raise SearchError(
            f"{name}: {kind}({field_name}={inner!r}) has a knob inside it, and is itself a "
            f"candidate of a List. Put the knobs in one {kind} ({name}={kind}("
            f"{field_name}=List([...]))), or list concrete objects ({name}=List([{kind}("
            f"{field_name}=...), {kind}({field_name}=...)]))."
        )

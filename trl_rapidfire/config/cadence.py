"""How often a run's state reaches disk: ``checkpoint_every``.

A boundary checkpoint is what lets a run continue on another worker or after a crash, and it
is the largest fixed cost of a turn (a rank-16 adapter of a 135M model and its Adam moments
are 22 MB). Written at every chunk boundary it makes fine chunks expensive, so a run's state
is written at most every ``checkpoint_every`` of that run's training: a time (``"60s"``,
``"5m"``, a number of seconds) or a number of chunks (``"4 chunks"``; ``"chunk"`` for every
boundary). Between two durable points a run's progress is *volatile*: a crash (kill -9, power
loss) costs the chunks trained since, which a re-run trains again, exactly. Whatever the
cadence, a run's state is written when it leaves the worker (a stop, the end of ``train()``,
Ctrl-C, another worker idle for want of it) and when it finishes (its final weights); a warm
clone's starting state is written when the clone is made.
"""

from __future__ import annotations

import math
import re

from ..storage.checkpoints import CheckpointCadence
from .errors import RFConfigError

__all__ = ["parse_cadence"]

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0,
          "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0}
_FORM = re.compile(r"^\s*(?:every\s+)?(\d+(?:\.\d+)?)?\s*([a-z]*)\s*$")
_HINT = ('Use e.g. checkpoint_every="60s" (at most every 60 s of a run\'s training), "5m", '
         '"4 chunks", or "chunk" (every chunk boundary).')


def parse_cadence(value: object, field: str = "checkpoint_every") -> CheckpointCadence:
    """``checkpoint_every`` as the user wrote it (seconds as a number, or text) -> the
    cadence; :class:`RFConfigError` naming ``field`` for anything else."""
    if isinstance(value, CheckpointCadence):
        return value
    if isinstance(value, bool) or value is None:
        raise RFConfigError(f"`{field}` must be a time or a number of chunks, got {value!r}. "
                            + _HINT)
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise RFConfigError(f"`{field}` must be a finite number of seconds >= 0, got "
                                f"{value!r}. " + _HINT)
        return CheckpointCadence(chunks=1) if value == 0 else CheckpointCadence(float(value))
    if not isinstance(value, str) or len(value) > 64:
        raise RFConfigError(f"`{field}` must be a time or a number of chunks, got {value!r}. "
                            + _HINT)
    match = _FORM.match(value.lower())
    if match is None:
        raise RFConfigError(f"`{field}`={value!r} is neither a time nor a number of chunks. "
                            + _HINT)
    number, unit = match.groups()
    unit = unit or ("s" if number is not None else "")  # "60" from a command line: seconds
    if unit in ("chunk", "chunks"):
        count = float(number) if number is not None else 1.0
        if count < 1 or count != int(count):
            raise RFConfigError(f"`{field}`={value!r}: the number of chunks must be a whole "
                                "number >= 1. " + _HINT)
        return CheckpointCadence(chunks=int(count))
    if unit not in _UNITS or number is None:
        raise RFConfigError(f"`{field}`={value!r}: unknown unit {unit!r} (s, m, h or chunks). "
                            + _HINT)
    seconds = float(number) * _UNITS[unit]
    return CheckpointCadence(chunks=1) if seconds == 0 else CheckpointCadence(seconds)

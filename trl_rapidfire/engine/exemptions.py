"""A person's resume wins over the policy: the runs a person put back in the rotation, kept
from the policy's verdict at the boundary where they were resumed.

Policies judge from the runs' histories alone, so asked again about a resumed run at the
boundary where it was stopped they answer as before: ``SuccessiveHalving`` and ``Hyperband``
judge a run waiting at its rung again whenever another run arrives there (seconds after the
resume, before the run trained a step), and a re-run asks every policy about every run. The
rule kept here: a run a person resumed at global step ``s`` is not stopped by a policy, nor
replaced by a clone made to replace it (``PopulationBased``), while it has trained no chunk
that ends past ``s``. From its next chunk on it is judged as every run is, at the policy's
next decision point (its next rung, interval or report). A person's later stop ends the
exemption (a stopped run gets no verdict); a later resume starts another at that step.

No state of its own: the resumes are the op log's (``ops.csv``, which a re-run reads back),
so a Ctrl-C or a crash between the resume and the run's next chunk keeps the exemption.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence

from ..control.ops import OpOrigin, OpRecord, OpSource
from ..control.policies import Context, Decision, RunHistory

__all__ = ["PersonResumes", "resumed_text"]

# The answer to a resume (engine.ops.change_status), the step the exemption is kept at.
_RESUMED = "resumed at step {step}"
_RESUMED_ANSWER = re.compile(r"ok: resumed at step (\d+)")


def resumed_text(step: int) -> str:
    """What a resume at ``step`` answers (after ``ok: ``), as the op log keeps it."""
    return _RESUMED.format(step=step)


class PersonResumes:
    """Where each run was last resumed by a person, read from the op log and kept up to date
    with every op handled since.

    Args:
        log: the experiment's op log so far (``ops.csv``), oldest first.
    """

    def __init__(self, log: Iterable[OpRecord] = ()) -> None:
        self._at: dict[str, int] = {}  # run -> the global step it was last resumed at
        for record in log:
            self.note(record)

    def note(self, record: OpRecord) -> None:
        """Take one handled op into account (a person's successful resume counts)."""
        try:
            source = OpSource.from_text(record.source)
        except ValueError:
            return  # not a source this version writes: no person's op it can honour
        if source.origin is OpOrigin.POLICY:
            return
        match = _RESUMED_ANSWER.fullmatch(record.result)
        if match is not None:
            self._at[record.run] = int(match.group(1))

    def exempt(self, history: RunHistory) -> bool:
        """Whether ``history``'s run is still at (or before) the boundary a person resumed it
        at: no chunk it trained since ends past that step."""
        step = self._at.get(history.name)
        if step is None:
            return False
        return history.chunks_done <= bisect_right(history.chunk_ends, step)

    def standing(self, decisions: Sequence[Decision], context: Context) -> list[Decision]:
        """The policy's ``decisions`` less those a person's resume overrules: a stop of an
        exempt run, and a clone made to replace it. A ``fail`` stands (a NaN metric is a
        fact about the run, not a verdict a person can overrule)."""
        def overruled(run: str | None) -> bool:
            history = context.runs.get(run) if run is not None else None
            return history is not None and self.exempt(history)

        return [d for d in decisions
                if not (d.action == "stop" and overruled(d.run))
                and not (d.action == "clone" and overruled(d.replaces))]

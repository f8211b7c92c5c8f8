"""Where an experiment keeps its files, in one place; and run names.

Everything under ``<output_dir>``::

    schedule.csv, ops.csv          what ran when; every op and its result
    search.csv                     an adaptive search's proposals and told results
    runs/<run>/                    a run's TRL output_dir (its own checkpoints, logs)
    runs/<run>/final/              its final adapter or model, trainer state, train output
    runs/<run>/generations/        what it generated at each evaluation (a generation eval)
    runs/<run>/runs/               its TensorBoard logs (transformers' default logging_dir)
    .rapidfire/scheduler.json      the shared scheduler state (store.py), and its lock
    .rapidfire/experiment.json     which MLflow experiment tracks it (tracking.py)
    .rapidfire/checkpoints/<run>/  its boundary checkpoints (checkpoint-<step>)
    .rapidfire/warm/<run>/         a warm clone's starting state
    .rapidfire/cache/              parked run state spilled to disk (cache.py)
    .rapidfire/optuna.journal      an Optuna search's study, and its lock (optuna_study.py)
    .rapidfire/inbox/, alive.json  ops from the CLI for an untracked experiment; who trains it
                                   now (folder_control.py)
    previous/<time>/               an earlier, different experiment of this output_dir,
                                   moved aside when this one started (nothing is deleted)

Every path built from a run name is checked to stay inside ``<output_dir>``
(:func:`trl_rapidfire.storage.names.inside`): names also come from files. Every folder above
(each run's too) is checked for links out of ``<output_dir>`` when an experiment is built and
when it starts training (:meth:`Layout.check_links`).
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from .names import UntrustedValue, check_run_name, inside, is_run_name
from .write_path import hard_linked, refused_link, register_root

__all__ = ["RUN_SUBFOLDERS", "Layout", "run_index", "run_name", "run_order"]

_PREFIX = "run-"
# The folders written inside each run's folder: by the package (final/, generations/) and by
# the Trainer's TensorBoard callback (runs/, transformers' default logging_dir).
RUN_SUBFOLDERS = ("final", "generations", "runs")


def run_name(index: int) -> str:
    """The name of run number ``index``."""
    return f"{_PREFIX}{index}"


def run_index(name: str) -> int | None:
    """The number of run ``name`` (``run-7`` -> 7), or ``None`` for another name."""
    tail = name[len(_PREFIX):] if name.startswith(_PREFIX) else ""
    return int(tail) if tail.isdigit() else None


def run_order(name: str) -> tuple[int, str]:
    """Sort key of run names: ``run-2`` before ``run-10``, other names after all numbered ones."""
    index = run_index(name)
    return (index if index is not None else 1 << 30, name)


@dataclass(frozen=True)
class Layout:
    """The paths of the experiment in ``output_dir``."""

    output_dir: Path

    def __init__(self, output_dir: str | os.PathLike) -> None:
        object.__setattr__(self, "output_dir", Path(output_dir))
        # Every write below it walks down from it, never through a link (write_path.py).
        register_root(output_dir)

    @property
    def state_dir(self) -> Path:
        """``.rapidfire``: what the package keeps for itself."""
        return self.output_dir / ".rapidfire"

    @property
    def schedule(self) -> Path:
        return self.output_dir / "schedule.csv"

    @property
    def ops_log(self) -> Path:
        return self.output_dir / "ops.csv"

    @property
    def search_log(self) -> Path:
        """An adaptive search's log: what it proposed, what it was told."""
        return self.output_dir / "search.csv"

    @property
    def study_journal(self) -> Path:
        """An Optuna search's study (Optuna's journal storage file)."""
        return self.state_dir / "optuna.journal"

    @property
    def study_lock(self) -> Path:
        return self.state_dir / "optuna.lock"

    @property
    def scheduler_state(self) -> Path:
        return self.state_dir / "scheduler.json"

    @property
    def experiment_marker(self) -> Path:
        return self.state_dir / "experiment.json"

    @property
    def cache(self) -> Path:
        return self.state_dir / "cache"

    @property
    def inbox(self) -> Path:
        """Ops for an untracked experiment, left by the CLI (folder_control.py)."""
        return self.state_dir / "inbox"

    @property
    def alive_file(self) -> Path:
        """Which process trains the experiment now (folder_control.py)."""
        return self.state_dir / "alive.json"

    @property
    def checkpoint_root(self) -> Path:
        return self.state_dir / "checkpoints"

    @property
    def runs_root(self) -> Path:
        return self.output_dir / "runs"

    def run_dir(self, run: str) -> Path:
        """``runs/<run>``: the run's own TRL ``output_dir``."""
        return self._own(self.runs_root / check_run_name(run))

    def final_dir(self, run: str) -> Path:
        return self.run_dir(run) / "final"

    def checkpoints(self, run: str) -> Path:
        return self._own(self.checkpoint_root / check_run_name(run))

    def warm_dir(self, run: str) -> Path:
        """Where a warm clone's starting state is kept for the other workers and re-runs."""
        return self._own(self.warm_root / check_run_name(run))

    @property
    def previous_root(self) -> Path:
        """``previous/``: earlier experiments of this output_dir, moved aside, one folder each."""
        return self.output_dir / "previous"

    @property
    def warm_root(self) -> Path:
        return self.state_dir / "warm"

    def folders(self) -> tuple[Path, ...]:
        """The folders the package makes and uses under ``output_dir``."""
        return (self.state_dir, self.inbox, self.checkpoint_root, self.warm_root, self.cache,
                self.runs_root, self.previous_root)

    def own_files(self) -> tuple[Path, ...]:
        """The files the package keeps under ``output_dir`` (never links)."""
        state = self.scheduler_state
        return (self.schedule, self.ops_log, self.search_log, state,
                state.with_name("scheduler.journal"), state.with_name(state.name + ".lock"),
                self.alive_file, self.experiment_marker, self.study_journal, self.study_lock)

    def check_links(self) -> None:
        """Refuse (:class:`~trl_rapidfire.storage.names.UntrustedValue`, naming the path) a folder
        of the experiment that is a link (one leading out of ``output_dir`` says so), and any
        link, symbolic or hard, where the experiment keeps a file: nothing it reads, writes,
        moves or deletes may lie outside, and every write walks down from ``output_dir``
        through real folders only (:mod:`~trl_rapidfire.storage.write_path`).
        A few ``lstat`` calls, and one listing of each folder of run folders; done when an
        experiment is built and when it starts training."""
        for folder in self.folders():
            self._own(folder)
            if os.path.islink(folder):  # inside: still never written through (write_path.py)
                raise refused_link(folder)
        for folder in self.run_folders():
            # Listed parents first: a real folder in one found inside is inside; only a link
            # needs resolving (0.2 s for 1000 runs otherwise).
            if os.path.islink(folder):
                self._own(folder)
                raise refused_link(folder)
        for path in self.own_files():
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISLNK(st.st_mode):
                raise refused_link(path)
            if stat.S_ISREG(st.st_mode) and st.st_nlink != 1:
                raise hard_linked(path, st.st_nlink)

    def run_folders(self) -> list[Path]:
        """The folders of the runs already on disk: ``runs/<run>/`` and the folders inside
        it (:data:`RUN_SUBFOLDERS`), ``.rapidfire/checkpoints/<run>/`` and
        ``.rapidfire/warm/<run>/``; and ``generations/`` of a one-config experiment, whose run
        writes in ``output_dir`` itself. Only run names are listed (never a name that could
        lead elsewhere); one listing of each folder."""
        found = [self.output_dir / "generations"]
        for root in (self.runs_root, self.checkpoint_root, self.warm_root):
            try:
                names = [e.name for e in os.scandir(self._own(root)) if is_run_name(e.name)]
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in sorted(names):
                found.append(root / name)
                if root == self.runs_root:
                    found += [root / name / sub for sub in RUN_SUBFOLDERS]
        return found

    def check_inbox(self) -> None:
        """The op inbox lies inside ``output_dir`` (checked before every read of it)."""
        self._own(self.state_dir)
        self._own(self.inbox)

    def move_aside(self) -> Path | None:
        """Move this folder's experiment (its state, schedule, op log and runs) into a new
        folder under ``previous/``, named for the time; nothing is deleted. Returns that
        folder, or ``None`` if there was nothing to move."""
        present = [p for p in (self.state_dir, self.schedule, self.ops_log, self.search_log,
                               self.runs_root) if p.exists()]
        if not present:
            return None
        self.check_links()  # previous/ (or what moves) a link out: nothing is moved
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        target = self.previous_root / stamp
        n = 1
        while target.exists():
            n += 1
            target = self.previous_root / f"{stamp}-{n}"
        target.mkdir(parents=True)
        for path in present:
            os.replace(path, target / path.name)
        return target

    def _own(self, path: Path) -> Path:
        try:
            inside(self.output_dir, path)
        except UntrustedValue:
            target = os.path.realpath(path)
            raise UntrustedValue(
                f"{path} leads out of {self.output_dir} (to {target}): trl-rapidfire reads, "
                "writes, moves and deletes only inside the experiment's folder. Remove the "
                "link and run again.") from None
        return path

"""The trackers TRL streams to (``report_to``), one stream per run.

TensorBoard writes through an object of its own per trainer, so each run's callback writes to
its own folder as it is. Trackio and Weights & Biases keep one *current run* per process:
``trackio.init`` finishes the run before it, and ``trackio.log`` / ``wandb.log`` write to the
current one. An experiment's runs train in turns in one process, so left as they are, every
run after the first would finish the one before and log into whichever started last.

* Trackio: each run's ``TrackioCallback`` is wrapped (:class:`RunTrackio`): it keeps its own
  trackio run and makes it the current one around every call, so each RF run is one trackio
  run, named ``<experiment>-<run>`` (``<run_name>-<run>`` when the config names one) in the
  config's ``project``; a re-run of the experiment continues the same trackio runs.
* Weights & Biases: its callback reuses the process's current run; with several runs that
  would merge them, so it is refused before training (:func:`check_shared_trackers`).

TensorBoard's writer takes a path, and its default folder's name
(``runs/<Mon DD_HH-MM-SS_host>``) can be guessed: a link left there would be written through.
So each run's TensorBoard folder is made afresh by descriptor (:class:`FreshTensorBoardFolder`,
reached from ``output_dir`` without a link) and handed to the writer by that descriptor.
"""

from __future__ import annotations

import copy
import os
import secrets
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ..config.errors import RFConfigError
from ..storage.write_path import FolderWrite, open_folder

__all__ = ["FreshTensorBoardFolder", "RunTrackio", "check_shared_trackers",
           "one_stream_per_run"]


def _reports_to(config: Any, name: str) -> bool:
    report_to = getattr(config, "report_to", None) or []
    return name in ([report_to] if isinstance(report_to, str) else report_to)


def check_shared_trackers(configs: Sequence[Any]) -> None:
    """:class:`RFConfigError` for an experiment of several runs that reports to W&B."""
    if len(configs) > 1 and any(_reports_to(c, "wandb") for c in configs):
        raise RFConfigError(
            "report_to='wandb' with several runs: W&B's callback logs to the process's one "
            "current W&B run, so every run would be merged into the first. Report to "
            "'trackio' (one trackio run per RF run), 'tensorboard' or 'mlflow' (the "
            "experiment's tracker) instead, or train one config.")


class RunTrackio(TrainerCallback):
    """A run's ``TrackioCallback``, called with the run's own trackio run as trackio's current
    one (and with ``args.run_name`` set to the run's stream name), the process's current run
    put back afterwards.

    Args:
        inner: the ``TrackioCallback`` the run's trainer was built with.
        name: the trackio run's name.
    """

    def __init__(self, inner: TrainerCallback, name: str) -> None:
        import trackio

        self.inner = inner
        self.name = name
        self._current = trackio.context_vars.current_run
        self._run: Any = None  # this RF run's trackio run, once the inner callback made it

    def _call(self, event: str, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        before = self._current.get()
        self._current.set(self._run)  # None at first: trackio.init must not finish another
        named = copy.copy(args)
        named.run_name = self.name
        try:
            return getattr(self.inner, event)(named, state, control, **kwargs)
        finally:
            self._run = self._current.get()  # made by init, or None once finished
            self._current.set(before if before is not self._run else None)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self._call("on_train_begin", args, state, control, **kwargs)

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self._call("on_log", args, state, control, **kwargs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self._call("on_train_end", args, state, control, **kwargs)


class FreshTensorBoardFolder(TrainerCallback):
    """Placed just before a run's ``TensorBoardCallback`` (``inner``): when it is about to
    open its writer, its folder is made afresh under ``<run>/runs/`` by descriptor (every
    folder from ``output_dir`` down opened without following a link: a link is
    :class:`~trl_rapidfire.storage.write_path.LinkRefused`, naming it, and fails the run),
    under the name transformers would give it, or that name with a random tail if something
    is there already; the writer is given the folder by its descriptor (``/proc/self/fd/<n>``),
    so a folder above swapped for a link later cannot redirect it. The descriptor stays open
    while the callback lives (a later ``evaluate()`` may open the writer again)."""

    def __init__(self, inner: TrainerCallback) -> None:
        self.inner = inner
        self.folder: Path | None = None  # where the run's logs are, as a person finds them
        self._fd: list[int] = []
        weakref.finalize(self, _close_all, self._fd)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if (not state.is_world_process_zero or self.inner.tb_writer is not None
                or os.getenv("TENSORBOARD_LOGGING_DIR")):  # the user's own folder: theirs
            return
        from transformers.integrations.integration_utils import default_logdir

        runs, name = Path(args.output_dir) / "runs", Path(default_logdir()).name
        fd = open_folder(runs)
        try:
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:  # left there (maybe a link): never used; a name of ours
                name = f"{name}-{secrets.token_hex(4)}"
                os.mkdir(name, 0o700, dir_fd=fd)
            folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                             dir_fd=fd)
        finally:
            os.close(fd)
        self._fd.append(folder)
        self.folder = runs / name
        self.inner.logging_dir = str(FolderWrite.by_descriptor(folder, self.folder))


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def one_stream_per_run(trainer: Any, name: str) -> None:
    """Wrap ``trainer``'s per-process trackers so that its run is a stream of its own, and
    have its TensorBoard logs written only into a fresh folder of its own."""
    try:
        from transformers.integrations import TensorBoardCallback, TrackioCallback
    except ImportError:  # pragma: no cover - a transformers without it
        return
    callbacks = trainer.callback_handler.callbacks
    for i, callback in enumerate(callbacks):
        if isinstance(callback, TrackioCallback):
            callbacks[i] = RunTrackio(callback, name)
    for callback in list(callbacks):
        if isinstance(callback, TensorBoardCallback):
            callbacks.insert(callbacks.index(callback), FreshTensorBoardFolder(callback))

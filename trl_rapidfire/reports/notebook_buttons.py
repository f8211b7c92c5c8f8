"""The notebook panel's op buttons (:mod:`.notebook_rows`): pressed while their op is pending,
and a Delete that asks to be confirmed.

A front end sends a click to the kernel and shows nothing of it by itself: while a cell keeps
the kernel busy (a blocking ``train()``), a click is read only at the next chunk boundary
(:mod:`.notebook_events`), and nothing on the page said it had been made. Stop, Resume and
Delete are therefore toggle buttons: the front end draws one pressed the moment it is
clicked, without the kernel, and the panel keeps it pressed while its op is pending (queued,
not yet applied or refused) and lets it go with the experiment's answer. A person's second
click on a pressed button does not take the op back (an op once queued is applied or refused
at the boundary): the button is pressed again.

Delete frees a run's state for good, and sat one click away, next to Stop. Its first click
turns it into "Confirm" for :data:`CONFIRM_SECONDS`; only a click on Confirm deletes. Clicks
that arrive together (a double click, read at one boundary) confirm nothing: a confirmation
counts only :data:`CONFIRM_GAP` seconds after Confirm was shown.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from .notebook_form import widgets

__all__ = ["CONFIRM_GAP", "CONFIRM_SECONDS", "DeleteConfirmation", "ask_button"]

CONFIRM_SECONDS = 30.0
CONFIRM_GAP = 0.4


@functools.cache
def _ask_button_class() -> Any:
    """The toggle button class, made once ipywidgets is imported (only when a panel is)."""
    w = widgets()

    class AskButton(w.ToggleButton):  # type: ignore[name-defined]
        """A toggle button a person presses to ask an op: :meth:`on_click` is told of each
        press (as a ``Button``'s callbacks are of each click); the panel :meth:`hold`\\ s it
        pressed while the op is pending and :meth:`release`\\ s it with the answer."""

        value: Any  # the toggle's trait (annotated only: the trait stays ipywidgets')

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.held = False
            self._callbacks: list[Callable[[Any], None]] = []
            self._setting = False
            self.observe(self._changed, names="value")

        def on_click(self, callback: Callable[[Any], None]) -> None:
            """Call ``callback(button)`` when a person presses the button."""
            self._callbacks.append(callback)

        def click(self) -> None:
            """Press it, as a person's click does."""
            if self.value:
                self._pressed()
            else:
                self.value = True  # through the observer, as a front end's press

        def hold(self) -> None:
            """Keep it pressed: its op is pending."""
            self.held = True
            self._set(True)

        def release(self) -> None:
            """Let it go: its op was answered, or never queued."""
            self.held = False
            self._set(False)

        def _set(self, value: bool) -> None:
            if self.value != value:
                self._setting = True
                try:
                    self.value = value
                finally:
                    self._setting = False

        def _changed(self, change: dict[str, Any]) -> None:
            if self._setting:
                return
            if change["new"]:
                self._pressed()
            elif self.held:  # let go by a person while pending: the op stays queued
                self._set(True)

        def _pressed(self) -> None:
            for callback in list(self._callbacks):
                callback(self)

    return AskButton


def ask_button(**kwargs: Any) -> Any:
    """A new op button (an ``ipywidgets.ToggleButton``; see the module's docstring)."""
    return _ask_button_class()(**kwargs)


class DeleteConfirmation:
    """Which runs' Delete buttons show "Confirm", and since when.

    Args:
        clock: seconds, monotonic (a test's own clock).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: dict[str, float] = {}

    def armed(self, run: str) -> bool:
        """Whether ``run``'s Delete asks to be confirmed now."""
        since = self._since.get(run)
        return since is not None and self._clock() - since <= CONFIRM_SECONDS

    def press(self, run: str, button: Any) -> bool:
        """A press on ``run``'s Delete ``button``: ``True`` if it confirms a delete; else it
        arms the button (or, a press too soon after the first, leaves it armed)."""
        since, now = self._since.get(run), self._clock()
        if since is not None and now - since < CONFIRM_GAP:
            button.release()  # one double click, read at once: not a confirmation
            return False
        if since is not None and now - since <= CONFIRM_SECONDS:
            self.disarm(run, button)
            return True
        self._since[run] = now
        button.release()
        button.description, button.button_style = "Confirm", "danger"
        button.tooltip = f"delete {run} for good (its state is freed): click to confirm"
        return False

    def disarm(self, run: str, button: Any) -> None:
        """``run``'s Delete back to a first click."""
        self._since.pop(run, None)
        if button.description != "Delete":
            button.description, button.button_style = "Delete", ""
            button.tooltip = f"delete {run}"

    def expire(self, buttons: dict[str, Any]) -> list[str]:
        """Disarm the runs whose confirmation timed out (``buttons``: run -> its Delete);
        returns them."""
        expired = [r for r in self._since if not self.armed(r)]
        for run in expired:
            if run in buttons:
                self.disarm(run, buttons[run])
            self._since.pop(run, None)
        return expired

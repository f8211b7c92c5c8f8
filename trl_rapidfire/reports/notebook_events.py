"""Clicks on the notebook panel while a cell keeps the kernel busy.

A Jupyter kernel reads the front end's messages (a button's click is a ``comm_msg`` to its
widget) on its main thread, between two cells: while a cell runs a blocking ``train()`` or
``wait()`` the clicks wait in the kernel's queue, and used to act only once the cell ended,
after the experiment they were meant to steer had trained to its end. Here the cell itself
takes the widget messages that arrived (at every chunk boundary of a blocking ``train()``, and
every :data:`WAIT_SLICE` seconds inside ``wait()``) and hands each to the kernel's own handler,
as the kernel would between cells; every other message (the next cell's ``execute_request``,
a completion request, ...) is given back to the kernel, in its order, to run after this cell
as it would have. What a click does then is the panel's business (:mod:`.notebook_panel`): it
queues its op, which the experiment applies at that same boundary.

How the kernel receives: ipykernel 6 reads its shell socket with a ``ZMQStream`` on the main
thread's event loop; ipykernel 7 reads it on a thread of its own and passes the main shell's
messages on through an in-process socket, read by a ``ZMQStream`` on the main thread. Either
way the stream's own ``flush()`` (pyzmq's way to take what is pending without the loop) runs
the messages through a callback of ours in place of the kernel's, put back right after. A
message's header is read without its content (which records no signature: the kernel reads
it in full later); only a widget message is read whole, here, once. Anything else about the
kernel that is not as expected (another kernel, a thread that does not own the stream) means
no events are taken: clicks act when the cell ends, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

__all__ = ["WAIT_SLICE", "KernelEvents", "join_taking_clicks", "taking_clicks_at_boundaries"]

WAIT_SLICE = 0.1  # seconds between two looks for clicks while wait() waits
# The front end's messages to widgets, handled synchronously by the kernel's comm manager.
_WIDGET_MESSAGES = ("comm_open", "comm_msg", "comm_close")
# What is used of the kernel (ipykernel 6 and 7 have them all).
_KERNEL_NEEDS = ("shell_handlers", "set_parent", "get_parent", "_parent_ident",
                 "_publish_status", "log")


class _Hooks(Protocol):
    """The engine's loop hooks (``engine.records.LoopHooks``): a call at every boundary."""

    at_boundary: Callable[[], None] | None


class _Shown(Protocol):
    """A panel: clicks are taken only while one is open."""

    @property
    def closed(self) -> bool: ...


class KernelEvents:
    """The widget messages of this process's Jupyter kernel, taken while a cell runs.

    Made by :meth:`here`, which answers ``None`` wherever messages cannot be taken safely.
    """

    def __init__(self, kernel: Any, stream: Any) -> None:
        self._kernel = kernel
        self._stream = stream
        self._taking = False
        self.handled = 0
        """How many widget messages were handled so far."""

    @classmethod
    def here(cls) -> KernelEvents | None:
        """This kernel's events, when called on the thread that runs its cells (inside its
        event loop) of an ipykernel whose main shell stream is found; else ``None``."""
        try:
            from IPython import get_ipython
        except ImportError:
            return None
        shell = get_ipython()
        kernel = getattr(shell, "kernel", None)
        if kernel is None or getattr(kernel, "session", None) is None or not all(
                hasattr(kernel, name) for name in _KERNEL_NEEDS):
            return None
        channel = getattr(kernel, "shell_channel_thread", None)
        if channel:  # ipykernel 7: the main shell's messages come from the channel's thread
            try:
                stream = channel.manager.get_shell_channel_to_subshell_pair(None).to_stream
            except (AttributeError, KeyError, TypeError):
                return None
        else:  # ipykernel 6 (or 7 without subshells): the shell socket's own stream
            stream = getattr(kernel, "shell_stream", None)
        if stream is None or not callable(getattr(stream, "flush", None)):
            return None
        try:  # only the loop that owns the stream may read it: this cell's own
            running = asyncio.get_running_loop()
        except RuntimeError:
            return None
        if getattr(getattr(stream, "io_loop", None), "asyncio_loop", None) is not running:
            return None
        return cls(kernel, stream)

    def take(self) -> int:
        """Handle the widget messages that arrived since the last look (their widgets'
        callbacks run now, on this thread) and give every other message back to the kernel
        in its order; returns how many widget messages were handled."""
        stream = self._stream
        kept = getattr(stream, "_recv_callback", None)  # the kernel's: put back below
        if self._taking or kept is None or stream.closed():
            return 0
        import zmq

        self._taking = True  # a widget's callback that waits in turn takes nothing
        before = self.handled
        copy = bool(getattr(stream, "_recv_copy", False))
        try:
            stream.on_recv(lambda frames: self._one(frames, kept), copy=copy)
            stream.flush(zmq.POLLIN)
        except Exception:  # noqa: BLE001 - a click's trouble must not end the training
            self._kernel.log.error("Taking the widget messages failed:", exc_info=True)
        finally:
            stream.on_recv(kept, copy=copy)
            self._taking = False
        return self.handled - before

    def _one(self, frames: list[Any], kernel_callback: Callable[..., Any]) -> None:
        """One message the stream read: a widget's handled now, any other passed on."""
        kernel = self._kernel
        session = kernel.session
        try:
            idents, rest = session.feed_identities(frames, copy=False)
            # The header only: this records no signature, so the kernel can read it again.
            header = session.deserialize(rest, content=False, copy=False)["header"]
            kind = header.get("msg_type")
        except Exception:  # noqa: BLE001 - the kernel says what is wrong with it, later
            kind = None
        handler = kernel.shell_handlers.get(kind) if kind in _WIDGET_MESSAGES else None
        if handler is None or inspect.iscoroutinefunction(handler):
            _pass_on(kernel_callback, frames)
            return
        try:
            message = session.deserialize(rest, content=True, copy=False)
        except Exception:  # noqa: BLE001 - dropped, as the kernel drops what it cannot read
            kernel.log.error("Invalid Message", exc_info=True)
            return
        self._handle(handler, idents, message)
        self.handled += 1

    def _handle(self, handler: Callable[..., Any], idents: Any, message: dict) -> None:
        """Run ``handler`` as the kernel would: the message as the parent of what its
        callbacks send (a widget's echo is matched to it), the kernel busy with it and then
        idle, as for any message it handles. The idle matters: a front end sends a widget's
        next change only once the kernel said it is idle after the last one (ipywidgets'
        message throttle), so without it a second click on the same button would wait for
        the cell's end. Then the kernel is said busy again, with this cell, and this cell is
        the parent of what it prints."""
        kernel = self._kernel
        ident, parent = kernel._parent_ident["shell"], kernel.get_parent("shell")
        _flush_output()
        kernel.set_parent(idents, message, channel="shell")
        kernel._publish_status("busy", "shell", message)
        try:
            handler(_reply_stream(kernel), idents, message)
        except Exception:  # noqa: BLE001 - logged as the kernel logs a handler's error
            kernel.log.error("Exception in message handler:", exc_info=True)
        finally:
            _flush_output()
            kernel._publish_status("idle", "shell", message)
            kernel.set_parent(ident, parent, channel="shell")
            kernel._publish_status("busy", "shell", parent)


def _pass_on(callback: Callable[..., Any], frames: list[Any]) -> None:
    """Give a message to the kernel's own callback, as the stream would: what it returns to
    await (ipykernel 7's dispatch) is scheduled on this loop, behind the cell; ipykernel 6
    queues it in its order."""
    result = callback(frames)
    if inspect.isawaitable(result):
        asyncio.ensure_future(result)


def _reply_stream(kernel: Any) -> Any:
    """Where the kernel's handlers answer a main-shell message (widget handlers answer on
    IOPub instead, but get it as every handler does)."""
    channel = getattr(kernel, "shell_channel_thread", None)
    if channel:
        with contextlib.suppress(AttributeError, KeyError):
            return channel.manager.get_subshell_to_shell_channel_socket(None)
    return getattr(kernel, "shell_stream", None)


def _flush_output() -> None:
    # Printed text goes out under the parent it was printed under.
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()


def _open(panel: _Shown | None) -> bool:
    return panel is not None and not panel.closed


@contextlib.contextmanager
def taking_clicks_at_boundaries(hooks: _Hooks, panel: _Shown | None) -> Iterator[None]:
    """While the body trains (a blocking ``train()``), take the kernel's widget messages at
    every chunk boundary, before the engine looks for pending ops: a click made during a
    chunk queues its op in time for that chunk's end. Nothing changes where no panel is
    open or the kernel's messages cannot be taken (:meth:`KernelEvents.here`)."""
    events = KernelEvents.here() if _open(panel) else None
    if events is None:
        yield
        return
    before = hooks.at_boundary

    def at_boundary() -> None:
        if before is not None:
            before()
        if _open(panel):
            events.take()

    hooks.at_boundary = at_boundary
    try:
        yield
    finally:
        hooks.at_boundary = before


def join_taking_clicks(thread: threading.Thread, timeout: float | None,
                       panel: _Shown | None) -> None:
    """``thread.join(timeout)``, taking the kernel's widget messages every
    :data:`WAIT_SLICE` seconds while a panel is open (``wait()`` on a training thread)."""
    events = KernelEvents.here() if _open(panel) else None
    if events is None:
        thread.join(timeout)
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    while thread.is_alive():
        if _open(panel):
            events.take()
        left = WAIT_SLICE if deadline is None else min(WAIT_SLICE, deadline - time.monotonic())
        if left <= 0:
            return
        thread.join(left)

"""A total deadline on every network call the CLI and ``doctor`` make.

A socket timeout bounds each wait for a byte, not the call: a server that sends one byte
every 2 s resets a 3 s timeout forever (measured: ``doctor``, ``status --uri`` and
``stop --uri`` hung on such a server), and name resolution has no timeout at all. So the call
runs whole (connect, send, read every byte of the answer) on a daemon thread, and the caller
gives up at the deadline with :class:`CallTimeout`, an ``OSError`` as a socket's own timeout
is, so every handler of a server that does not answer also handles one that answers too
slowly. The abandoned thread ends with its socket's own timeout (or with the process: it is a
daemon and holds no lock of ours).
"""

from __future__ import annotations

import io
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["CallTimeout", "call_within", "fetch_within", "shown_url"]

T = TypeVar("T")
# An answer of the REST API or /health is at most a few MiB (1,000 runs with their tags).
MAX_ANSWER_BYTES = 256 << 20


class CallTimeout(TimeoutError):
    """A network call had no whole answer within its deadline."""


def call_within(seconds: float, fn: Callable[[], T], what: str) -> T:
    """``fn()``, or :class:`CallTimeout` naming ``what`` once ``seconds`` have passed.
    Whatever ``fn`` raises is raised here."""
    done: list[tuple[bool, Any]] = []

    def work() -> None:
        try:
            done.append((True, fn()))
        except BaseException as err:  # handed to the caller, raised there
            done.append((False, err))

    worker = threading.Thread(target=work, name=f"trl-rapidfire: {what}", daemon=True)
    worker.start()
    worker.join(seconds)
    if not done:
        raise CallTimeout(f"no whole answer from {what} within {seconds:g} s")
    ok, value = done[0]
    if ok:
        return value
    raise value


def _whole(request: str | urllib.request.Request, seconds: float) -> bytes:
    try:
        with urllib.request.urlopen(request, timeout=seconds) as answer:
            return answer.read(MAX_ANSWER_BYTES)
    except urllib.error.HTTPError as err:
        # Its body is read here, within the deadline, and handed on readable.
        body = err.read(MAX_ANSWER_BYTES) if err.fp is not None else b""
        raise urllib.error.HTTPError(err.filename, err.code, err.msg, err.hdrs,
                                     io.BytesIO(body)) from None


def fetch_within(request: str | urllib.request.Request, seconds: float) -> bytes:
    """The body of ``urlopen(request)``, read whole within ``seconds`` in all.

    Raises:
        CallTimeout: no whole answer in time (a server that trickles its answer).
        urllib.error.HTTPError: it answered with an error status (its body readable).
        OSError, ValueError, http.client.HTTPException: as ``urlopen`` raises them.
    """
    url = request.full_url if isinstance(request, urllib.request.Request) else request
    return call_within(seconds, lambda: _whole(request, seconds), shown_url(url))


def shown_url(url: str) -> str:
    """``url`` as a message may name it: without ``user:password@`` and the query (either
    may hold a secret)."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"

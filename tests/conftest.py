"""Shared test settings."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    # Everything here is built locally (trl_rapidfire.testing); nothing may reach a hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test whose training stopped as a Ctrl-C stops it (``trainer.train()`` ending with
    trl-rapidfire's marked ``KeyboardInterrupt``, e.g. after a test set the engine's
    ``interrupted`` flag on its way out of a failure) fails alone: pytest would take the
    ``KeyboardInterrupt`` for the person's and end the whole session, hiding every later
    result. A real Ctrl-C still ends the session (pytest's own handler sees it first)."""
    try:
        return (yield)
    except KeyboardInterrupt as err:
        line = getattr(err, "rapidfire_line", None)
        if line is None:
            raise
        pytest.fail(f"training stopped as by Ctrl-C inside the test: {line}", pytrace=True)


def pytest_collection_modifyitems(config, items):
    """The slow tests (servers, browsers, several processes, benchmarks' quick runs) run after
    the fast ones: a plain ``python -m pytest`` shows the fast part's failures within minutes
    instead of after the benchmarks (the order within each part is kept)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)

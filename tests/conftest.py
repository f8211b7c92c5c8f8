"""Shared test settings."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    # Everything here is built locally (trl_rapidfire.testing); nothing may reach a hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

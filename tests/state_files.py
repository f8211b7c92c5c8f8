"""Reading and crafting an experiment's shared state file, as someone with write access to the
folder could (tests of what a re-run accepts from it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_state(out: Path) -> tuple[Path, dict[str, Any]]:
    """``<out>/.rapidfire/scheduler.json`` and its document."""
    path = out / ".rapidfire" / "scheduler.json"
    return path, json.loads(path.read_text())


def add_run(doc: dict[str, Any], name: str, recipe: dict[str, Any]) -> None:
    """A pending run ``name`` like ``run-0``, made by ``recipe`` (a clone's or a proposal's)."""
    entry = dict(doc["runs"]["run-0"], name=name, status="pending", chunks_done=0,
                 global_step=0, error=None)
    doc["runs"][name] = entry
    doc["chunks_total"][name] = doc["chunks_total"]["run-0"]
    doc["order"].append(name)
    doc["clones"][name] = recipe

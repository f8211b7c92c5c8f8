"""Every Python block in README.md and docs/*.md runs, so none goes stale."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _blocks():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, match in enumerate(BLOCK.finditer(path.read_text())):
            yield pytest.param(match.group(1), id=f"{path.name}-{i}")


@pytest.mark.parametrize("code", list(_blocks()))
def test_doc_block_runs(code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, "<doc>", "exec"), {"__name__": "__doc__"})
    assert capsys.readouterr().out.strip(), "a doc example should show the reader something"


def test_docs_have_python_examples():
    assert len(list(_blocks())) >= 6

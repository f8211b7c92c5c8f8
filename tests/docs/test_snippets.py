"""Every Python block of README.md and docs/*.md runs (or is checked), so none goes stale.

A block fenced ```python or ```py runs as it is written, in a fresh namespace, in a temporary
working directory, offline. An HTML comment right before the fence (invisible on the rendered
page) changes that; its reason is part of the page's source:

``<!-- snippet: skip (REASON) -->``
    not run (it needs a GPU, a launch, a hub model, your data, or ``...`` stands for arguments
    shown elsewhere). It is still compiled, and its ``import`` lines run.
``<!-- snippet: signature -->``
    a callable's signature, as ``Name(a, b=None, *, c=None)``: checked against
    ``inspect.signature`` of ``trl_rapidfire.Name``.
``<!-- snippet: continues -->``
    a fragment: it runs right after the page's previous block that runs, in that block's names.
``<!-- snippet: setup (WHAT)`` then lines of code, then ``-->``
    the code runs first, in the block's namespace: it makes what the fragment names
    (``trainer``, ``config``), on the tiny model and tiny data (sizes are chosen there, in
    view, never patched into the block).

Any other fence needs a language (``text`` for output), so Python cannot hide in a bare one.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import warnings
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON = ("python", "py")
FENCE = re.compile(r"^(\s*)(`{3,})(\S*)\s*$")
MARKER = re.compile(r"<!--\s*snippet:\s*(skip|signature|continues|setup)\b(.*?)-->\s*$", re.S)


class Block(NamedTuple):
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    kind: str  # "" (run as is), or a marker's kind
    detail: str  # a skip's reason, a setup's code

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _marker(lines: list[str], fence: int) -> tuple[str, str]:
    """The snippet marker ending on the last non-blank line before ``fence``, if any."""
    end = fence - 1
    while end >= 0 and not lines[end].strip():
        end -= 1
    if end < 0 or not lines[end].rstrip().endswith("-->"):
        return "", ""
    start = end
    while start > 0 and "<!--" not in lines[start]:
        start -= 1
    match = MARKER.search("\n".join(lines[start:end + 1]))
    return (match.group(1), match.group(2)) if match else ("", "")


def page_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        close = next(j for j in range(i + 1, len(lines))
                     if lines[j].strip() == opening.group(2))
        indent = len(opening.group(1))
        code = "\n".join(line[indent:] for line in lines[i + 1:close]) + "\n"
        blocks.append(Block(path.name, i + 1, opening.group(3), code, *_marker(lines, i)))
        i = close + 1
    return blocks


ALL = [b for page in PAGES for b in page_blocks(page)]
SNIPPETS = [b for b in ALL if b.lang in PYTHON]


def _chains() -> list[list[Block]]:
    """Blocks that run, grouped: a block, then the fragments that continue it."""
    chains: list[list[Block]] = []
    for block in SNIPPETS:
        if block.kind in ("skip", "signature"):
            continue
        if block.kind == "continues":
            assert chains and chains[-1][0].page == block.page, (
                f"{block.where}: 'continues' with no block before it on its page")
            chains[-1].append(block)
        else:
            chains.append([block])
    return chains


def _finish_training(namespace: dict) -> list[str]:
    """Wait for the trainers a block left training (``train(blocking=False)``); the answers
    of the ops they refused: a snippet whose op fails as written is wrong, though it runs."""
    from trl_rapidfire.trainers.base import RFTrainerMixin

    refused = []
    for value in list(namespace.values()):
        if isinstance(value, RFTrainerMixin):
            if value.training:
                value.wait()
            refused += [f"{r.run} {r.op}: {r.result}" for r in value.op_log
                        if r.result.startswith("error")]
    return refused


@pytest.mark.parametrize("chain", [pytest.param(c, id=c[0].where) for c in _chains()])
def test_doc_snippet_runs(chain, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__doc__"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for block in chain:
                if block.kind == "setup":
                    setup = block.detail.split("\n", 1)[1]  # after "(WHAT)"
                    exec(compile(setup, f"{block.where} (setup)", "exec"), namespace)
                exec(compile(block.code, block.where, "exec"), namespace)
    finally:
        refused = _finish_training(namespace)
    assert not refused, f"{chain[0].where}: ops refused: {refused}"


SKIPPED = [b for b in SNIPPETS if b.kind == "skip"]


@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in SKIPPED])
def test_skipped_snippet_compiles_and_imports(block, tmp_path, monkeypatch):
    reason = re.fullmatch(r"\s*\((.+)\)\s*", block.detail, re.S)
    assert reason and reason.group(1).strip(), f"{block.where}: a skip says why, in (...)"
    tree = ast.parse(block.code, block.where)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    monkeypatch.chdir(tmp_path)
    exec(compile(ast.Module(body=imports, type_ignores=[]), block.where, "exec"), {})


SIGNATURES = [b for b in SNIPPETS if b.kind == "signature"]


@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in SIGNATURES])
def test_documented_signature_is_the_real_one(block):
    import trl_rapidfire

    (func,) = ast.parse(f"def {block.code.strip()}: pass", block.where).body
    assert isinstance(func, ast.FunctionDef)
    real = inspect.signature(getattr(trl_rapidfire, func.name))
    documented = [(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in func.args.args]
    documented += [(a.arg, inspect.Parameter.KEYWORD_ONLY) for a in func.args.kwonlyargs]
    defaults = [*[None] * (len(func.args.args) - len(func.args.defaults)), *func.args.defaults,
                *func.args.kw_defaults]
    assert [(p.name, p.kind) for p in real.parameters.values()] == documented, block.where
    for (name, _), default in zip(documented, defaults):
        want = real.parameters[name].default
        got = inspect.Parameter.empty if default is None else ast.literal_eval(default)
        assert got == want, f"{block.where}: {name}={got!r}, the code says {want!r}"


def test_every_python_block_is_found_and_markers_sit_on_python_blocks():
    assert len(SNIPPETS) >= 30 and len(_chains()) >= 25
    bare = [b.where for b in ALL if not b.lang]
    assert not bare, f"fences without a language (write ```text for output): {bare}"
    stray = [b.where for b in ALL if b.kind and b.lang not in PYTHON]
    assert not stray, f"snippet markers before blocks that are not Python: {stray}"
    for page in PAGES:  # a marker that no fence follows would be silently ignored
        written = len(re.findall(r"^\s*<!--\s*snippet:", page.read_text(encoding="utf-8"), re.M))
        attached = sum(1 for b in ALL if b.page == page.name and b.kind)
        assert written == attached, f"{page.name}: a snippet marker not right before a fence"


def test_the_api_reference_imports_everything_exported():
    import trl_rapidfire

    (first,) = [b for b in SNIPPETS if b.page == "api.md"][:1]
    (statement,) = ast.parse(first.code).body
    assert isinstance(statement, ast.ImportFrom) and statement.module == "trl_rapidfire"
    assert sorted(a.name for a in statement.names) == sorted(trl_rapidfire.__all__)


def test_the_run_fields_the_docs_name_exist():
    """README's and api.md's lists of what ``trainer.runs`` holds name real ``RunResult``
    fields (README once said ``step`` and ``folder``, and a script written from it crashed)."""
    from trl_rapidfire import RunResult

    fields = {f.name for f in dataclasses.fields(RunResult)}
    attributes = fields | {n for n, v in vars(RunResult).items() if isinstance(v, property)}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for text, start in ((readme, "- `trainer.runs`:"), (api, "- `runs` -> `list[RunResult]`:")):
        item = text.split(start, 1)[1].split("\n- ", 1)[0]
        named = set(re.findall(r"`([a-z_]\w*)`", item))  # not `RunResult`, the class
        assert named and named <= attributes, (start, named - attributes)
    table = api.split("### `RunResult`", 1)[1].split("###", 1)[0]
    assert set(re.findall(r"^\| `(\w+)` \|", table, re.M)) == fields

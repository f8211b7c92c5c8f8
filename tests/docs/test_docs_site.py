"""The documentation site (mkdocs.yml over docs/) builds in strict mode, so a broken link, a
missing anchor or a page left out of the nav fails CI, and every page of the nav is built."""

from __future__ import annotations

import html
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")


def _config() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def _nav(items: list[Any]) -> list[tuple[str | None, str]]:
    """(title, page) for every page of a nav, nested sections included."""
    out: list[tuple[str | None, str]] = []
    for item in items:
        if isinstance(item, str):
            out.append((None, item))
            continue
        for title, value in item.items():
            if isinstance(value, list):
                out.extend(_nav(value))
            elif str(value).endswith(".md"):  # not an external link
                out.append((title, value))
    return out


def _html_path(site: Path, page: str, directory_urls: bool) -> Path:
    stem = page[: -len(".md")]
    if not directory_urls:
        return site / f"{stem}.html"
    if stem == "index" or stem.endswith("/index"):
        return site / f"{stem}.html"
    return site / stem / "index.html"


def test_nav_lists_every_page():
    pages = [page for _, page in _nav(_config()["nav"])]
    on_disk = sorted(p.relative_to(ROOT / "docs").as_posix()
                     for p in (ROOT / "docs").rglob("*.md"))
    assert pages[0] == "index.md"
    assert len(pages) == len(set(pages)), "a page is in the nav twice"
    assert sorted(pages) == on_disk


def test_site_builds_strict_with_every_nav_page(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    config = _config()
    directory_urls = config.get("use_directory_urls", True)
    for title, page in _nav(config["nav"]):
        built = _html_path(site, page, directory_urls)
        assert built.is_file(), f"{page} was not built ({built} is missing)"
        if title is not None:
            assert html.escape(title) in built.read_text(encoding="utf-8"), (
                f"{built} does not show its nav title {title!r}"
            )

"""Headless Chromium for the tests that look at the MLflow UI as a person does (skipped where
Chromium, its driver or Selenium are missing), and reading the UI's runs table."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

_CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_DRIVER = shutil.which("chromedriver")


@contextlib.contextmanager
def chromium(width: int = 1600, height: int = 900) -> Iterator[Any]:
    """A headless Chromium driven through the system's chromedriver (Selenium downloads
    nothing); ``pytest.skip`` without them."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    if _CHROMIUM is None or _DRIVER is None:
        pytest.skip("chromium and chromedriver are not installed "
                    "(Debian: apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(_DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def runs_table_rows(driver: Any) -> dict[str, list[str]]:
    """Run name -> the words of its row in the MLflow runs table now shown (the grid draws a
    row in pieces, one per pinned part, all with the run's id)."""
    from selenium.webdriver.common.by import By

    by_id: dict[str, list[str]] = {}
    for piece in driver.find_elements(By.CSS_SELECTOR, ".ag-row[row-id]"):
        by_id.setdefault(piece.get_attribute("row-id"), []).append(piece.text)
    found = {}
    for texts in by_id.values():
        words = " ".join(texts).split()
        names = [w for w in words if w.startswith("run-")]
        if names:
            found[names[0]] = words
    return found


def wait_for_rows(driver: Any, count: int, timeout: float, debug_dir: Any) -> dict:
    """The runs table's rows once it shows ``count`` runs; on a timeout a screenshot and the
    page source go to ``debug_dir`` before the error is raised."""
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=1).until(
            lambda _: (rows := runs_table_rows(driver)) and len(rows) >= count and rows)
    except Exception:
        driver.save_screenshot(str(debug_dir / "failure.png"))
        (debug_dir / "failure.html").write_text(driver.page_source, encoding="utf-8")
        raise

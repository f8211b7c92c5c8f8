"""Exit 0 when this environment already has what scripts/install.sh would install: every
requirement of pyproject.toml (with the test and docs extras) at a version constraints.txt
allows, and trl_rapidfire installed in editable mode from this checkout. install.sh then
skips pip, which takes a minute even when there is nothing to do. Exit 1 says what is
missing (one line), and install.sh installs."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def missing() -> str | None:
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return "packaging is not installed yet"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("test", "docs"):
        wanted += project["optional-dependencies"][extra]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            pin = Requirement(line)
            pins[pin.name.lower()] = pin
    for text in wanted:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            return f"{req.name} is not installed yet"
        for spec in (req, pins.get(req.name.lower())):
            if spec is not None and not spec.specifier.contains(version, prereleases=True):
                return f"{req.name} {version} does not satisfy {spec}"
    spec = importlib.util.find_spec("trl_rapidfire")
    if spec is None or spec.origin is None:
        return "trl_rapidfire is not installed yet"
    if Path(spec.origin).resolve().parent != ROOT / "trl_rapidfire":
        return f"trl_rapidfire is installed from {Path(spec.origin).parent}, not this checkout"
    return None


if __name__ == "__main__":
    reason = missing()
    if reason is not None:
        print(f"install: installing with pip ({reason})")
    sys.exit(0 if reason is None else 1)

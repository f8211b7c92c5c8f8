#!/usr/bin/env bash
# Install trl-rapidfire (editable, with its test and docs extras) into the current environment.
#
# torch: an installed torch (a GPU build, say) is kept as it is. Without one, torch 2.13.0 is
# installed first, on its own, so that no other package can pull a multi-GB CUDA build onto a
# CPU-only machine. Set TORCH_INDEX_URL to choose the wheel index (for PyTorch's CPU-only
# wheels, its "whl/cpu" index) and TORCH_VERSION to choose the version.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

# Nothing to do (every requirement there at an allowed version, this checkout installed): pip
# would still take a minute to find that out.
if "$PY" scripts/installed.py; then
  echo "install: everything is installed already ($("$PY" -c 'import trl_rapidfire as rf; print("trl-rapidfire", rf.__version__)'))"
  exit 0
fi

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
cp constraints.txt "$constraints"

# torch's version from its metadata: importing torch before numpy is there warns
# ("Failed to initialize NumPy"), and takes seconds.
torch_version='import importlib.metadata as m; print(m.version("torch").split("+")[0])'
if installed=$("$PY" -c "$torch_version" 2>/dev/null); then
  echo "install: keeping the installed torch $installed"
else
  version=${TORCH_VERSION:-2.13.0}
  echo "install: installing torch==$version"
  "$PY" -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$version"
  installed=$("$PY" -c "$torch_version")
fi
# Pin torch to what is there now, so resolving the rest never swaps it.
echo "torch==$installed" >> "$constraints"

"$PY" -m pip install -q -c "$constraints" -e ".[test,docs]"
echo "install: done ($("$PY" -c 'import trl_rapidfire as rf; print("trl-rapidfire", rf.__version__)'))"

# ---- offline redirect (benchmarks/trl_own_tests/offline_conftest.py) ----
# Models/tokenizers come from the Hub cache built by build_assets.py (HF_HUB_OFFLINE=1,
# HF_HUB_CACHE=$WORK/hf_cache, set by run.py). Hub datasets are redirected here to the parquet
# files written by TRL's own generate_*_dataset.py scripts; this must run before the test modules
# do `from datasets import load_dataset`, which conftest import order guarantees.
import os as _os
from pathlib import Path as _Path

import datasets as _datasets

assert _os.environ.get("HF_HUB_OFFLINE") == "1", "run through run.py (HF_HUB_OFFLINE=1)"
_DS_ROOT = _Path(_os.environ.get("WORK", "/tmp/trl_own_tests")) / "hub_datasets"
_orig_load_dataset = _datasets.load_dataset


def _offline_load_dataset(path, name=None, *args, split=None, streaming=False, **kwargs):
    root = _DS_ROOT / str(path)
    if root.is_dir():
        cfg = root / (name or "default")
        files = {p.stem: str(p) for p in sorted(cfg.glob("*.parquet"))}
        if not files:
            raise FileNotFoundError(f"offline stand-in: no config {name!r} for dataset {path!r}")
        return _orig_load_dataset(
            "parquet", data_files=files, split=split, streaming=streaming, **kwargs
        )
    return _orig_load_dataset(path, name, *args, split=split, streaming=streaming, **kwargs)


_datasets.load_dataset = _offline_load_dataset

"""Make two copies of TRL's test tree under $WORK: plain/ (as is) and rf/ (imports swapped).

rf/ differs from plain/ only in the one import line per test file, which is what a user does:
    from trl import SFTConfig, SFTTrainer
 -> from trl_rapidfire import RFSFTConfig as SFTConfig, RFSFTTrainer as SFTTrainer
(so `patch.object(GRPOTrainer, ...)` and every other use refers to the RF class).
Both trees get the same conftest.py: offline_conftest.py (dataset redirect) + TRL's own conftest.py.
"""

import os
import re
import shutil
from pathlib import Path

WORK = Path(os.environ.get("WORK", "/tmp/trl_own_tests"))
SRC = WORK / "trl_src" / "tests"
HERE = Path(__file__).parent
FILES = [
    "__init__.py",
    "testing_utils.py",
    "testing_constants.py",
    "test_sft_trainer.py",
    "test_dpo_trainer.py",
    "test_grpo_trainer.py",
]
SWAPS = {
    "from trl import SFTConfig, SFTTrainer\n": (
        "from trl_rapidfire import RFSFTConfig as SFTConfig, RFSFTTrainer as SFTTrainer\n"
    ),
    "from trl import DPOConfig, DPOTrainer\n": (
        "from trl_rapidfire import RFDPOConfig as DPOConfig, RFDPOTrainer as DPOTrainer\n"
    ),
    "from trl import GRPOConfig, GRPOTrainer\n": (
        "from trl_rapidfire import RFGRPOConfig as GRPOConfig, RFGRPOTrainer as GRPOTrainer\n"
    ),
}

SHIM = """
class _MissingInInstalledTrl:  # added by prepare.py: name absent from the installed trl
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise ImportError(f"{self._name} does not exist in the installed trl")

    def __getattr__(self, attr):
        raise ImportError(f"{self._name} does not exist in the installed trl")


def _trl_name(module, name):
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return _MissingInInstalledTrl(module + "." + name)

"""


def shim_trl_imports(text):
    """`from trl.x import a, b` -> per-name lookups that tolerate names the installed trl lacks.

    The TRL snapshot's tests may import private helpers that trl 1.16.0 does not have; one
    missing name would otherwise fail the whole file at collection. Tests using such a name then
    fail (for plain TRL too) and do not count.
    """

    def repl(m):
        module = m.group(1)
        names = [
            n.strip() for n in m.group(2).replace("(", "").replace(")", "").split(",") if n.strip()
        ]
        return "".join(f"{n} = _trl_name({module!r}, {n!r})\n" for n in names)

    pattern = r"^from (trl(?:\.[\w.]+)?) import (\([^)]*\)|[\w, ]+)\n"
    text, n = re.subn(pattern, repl, text, flags=re.M)
    if n:  # put the helper after the last top-level `from __future__`/import block start
        first = re.search(r"^(import|from) ", text, flags=re.M).start()
        text = text[:first] + SHIM + text[first:]
    return text


for flavour in ("plain", "rf"):
    dst = WORK / flavour / "tests"
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for name in FILES:
        text = (SRC / name).read_text()
        if (
            name == "testing_utils.py"
        ):  # the snapshot is older/newer than installed trl 1.16.0: shim the one
            # helper trl 1.16.0's import_utils lacks (both trees alike)
            text = text.replace("    is_joblib_available,\n", "", 1).replace(
                "\n\nrequire_bitsandbytes",
                "\n\ndef is_joblib_available():\n    import importlib.util\n\n"
                "    return importlib.util.find_spec('joblib') is not None\n\n\n"
                "require_bitsandbytes",
                1,
            )
        if flavour == "rf" and name.startswith("test_"):
            hits = [old for old in SWAPS if old in text]
            assert len(hits) == 1, (name, hits)
            text = text.replace(hits[0], SWAPS[hits[0]])
        if name.startswith("test_"):
            text = shim_trl_imports(text)
        (dst / name).write_text(text)
    if (SRC / "data").is_dir():
        shutil.copytree(SRC / "data", dst / "data")
    conftest = (
        HERE / "offline_conftest.py"
    ).read_text() + "\n\n# ---- TRL's own tests/conftest.py ----\n"
    (dst / "conftest.py").write_text(conftest + (SRC / "conftest.py").read_text())
    (WORK / flavour / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow\n    low_priority\n")
    print("prepared", dst)

"""Make two copies of TRL's test tree under $WORK: plain/ (as is) and rf/ (imports swapped).

rf/ differs from plain/ only in the one import statement per test file that brings in the
trainer's config and trainer classes, which is what a user does:
    from trl import SFTConfig, SFTTrainer
 -> from trl_rapidfire import RFSFTConfig as SFTConfig, RFSFTTrainer as SFTTrainer
(so `patch.object(GRPOTrainer, ...)` and every other use refers to the RF class).
Both trees get the same conftest.py: offline_conftest.py (dataset redirect) + TRL's own conftest.py.
"""

import difflib
import os
import re
import shutil
from pathlib import Path

WORK = Path(os.environ.get("WORK", "/tmp/trl_own_tests"))
SRC = WORK / "trl_src" / "tests"
HERE = Path(__file__).parent
SUPPORT = [
    "__init__.py",
    "testing_utils.py",
    "testing_constants.py",
    "experimental/__init__.py",
]
# test file -> (module the test imports the two classes from, config class, trainer class);
# the RF names are "RF" + the same names, imported from trl_rapidfire
SWAPS = {
    "test_sft_trainer.py": ("trl", "SFTConfig", "SFTTrainer"),
    "test_dpo_trainer.py": ("trl", "DPOConfig", "DPOTrainer"),
    "test_grpo_trainer.py": ("trl", "GRPOConfig", "GRPOTrainer"),
    "test_kto_trainer.py": ("trl", "KTOConfig", "KTOTrainer"),
    "test_reward_trainer.py": ("trl", "RewardConfig", "RewardTrainer"),
    "test_rloo_trainer.py": ("trl", "RLOOConfig", "RLOOTrainer"),
    "experimental/test_distillation_trainer.py": (
        "trl.experimental.distillation",
        "DistillationConfig",
        "DistillationTrainer",
    ),
}
FILES = SUPPORT + list(SWAPS)

# `from <module> import a, b` on one line, or `from <module> import (\n a,\n b,\n)`
IMPORT_STMT = r"^from {module} import (\([^)]*\)|[^\n(]+)\n"


def import_names(group):
    """The names of an import statement's name list (parentheses, newlines, comments dropped)."""
    body = " ".join(line.split("#")[0] for line in group.splitlines())
    return [n.strip() for n in body.strip().strip("()").split(",") if n.strip()]


def swap_import(text, module, config, trainer):
    """Replace the import of `config` and `trainer` from `module` by the RF classes.

    Handles one-line and parenthesised imports, other names in the same statement (kept,
    imported from `module` as before) and the two names coming from separate statements.
    Returns the new text, the lines taken out and the lines put in. Asserts that both names
    are imported exactly once at top level.
    """
    wanted = {config, trainer}
    pattern = re.compile(IMPORT_STMT.format(module=re.escape(module)), flags=re.M)
    stmts = [m for m in pattern.finditer(text) if wanted & set(import_names(m.group(1)))]
    found = [n for m in stmts for n in import_names(m.group(1)) if n in wanted]
    assert sorted(found) == sorted(wanted), (module, config, trainer, found)
    rf_line = f"from trl_rapidfire import RF{config} as {config}, RF{trainer} as {trainer}\n"
    removed, added = [], []
    for i, m in enumerate(reversed(stmts)):  # from the end, so offsets stay valid
        rest = [n for n in import_names(m.group(1)) if n not in wanted]
        new = (f"from {module} import {', '.join(rest)}\n" if rest else "") + (
            rf_line if i == len(stmts) - 1 else ""
        )
        removed += m.group(0).splitlines()
        added += new.splitlines()
        text = text[: m.start()] + new + text[m.end() :]
    return text, removed, added


def check_only_swap(plain, rf, module, config, trainer, removed, added):
    """The rf text has the RF import once, no import of the two names from `module` left, and
    differs from plain only in the lines swap_import took out and put in."""
    rf_line = f"from trl_rapidfire import RF{config} as {config}, RF{trainer} as {trainer}"
    assert rf.splitlines().count(rf_line) == 1, rf_line
    pattern = re.compile(IMPORT_STMT.format(module=re.escape(module)), flags=re.M)
    left = [
        m.group(0)
        for m in pattern.finditer(rf)
        if {config, trainer} & set(import_names(m.group(1)))
    ]
    assert not left, ("still imported from", module, left)
    changed = [
        line
        for line in difflib.unified_diff(plain.splitlines(), rf.splitlines(), n=0, lineterm="")
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    for line in changed:
        assert line[1:] in (removed if line[0] == "-" else added), ("unexpected change", line)
    return changed


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
        if not (SRC / name).exists():
            print("missing in the snapshot, skipped:", name)
            continue
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
        if name in SWAPS:
            module, config, trainer = SWAPS[name]
            if flavour == "rf":
                swapped, removed, added = swap_import(text, module, config, trainer)
                changed = check_only_swap(text, swapped, module, config, trainer, removed, added)
                print(f"  {name}: " + " | ".join(changed))
                text = swapped
            text = shim_trl_imports(text)
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).write_text(text)
    if (SRC / "data").is_dir():
        shutil.copytree(SRC / "data", dst / "data")
    conftest = (
        HERE / "offline_conftest.py"
    ).read_text() + "\n\n# ---- TRL's own tests/conftest.py ----\n"
    (dst / "conftest.py").write_text(conftest + (SRC / "conftest.py").read_text())
    (WORK / flavour / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow\n    low_priority\n")
    print("prepared", dst)

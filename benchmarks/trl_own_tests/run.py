"""Run TRL's trainer tests plain (trl classes) or swapped (trl_rapidfire RF classes), offline.

  python run.py one   --flavour plain|rf  [--files sft,dpo,grpo,kto,reward,rloo,distill]
                      [--timeout 2400] [-k EXPR]
      all tests of a file in ONE pytest process -> $WORK/results/one-<flavour>-<file>.xml
  python run.py fresh --flavour plain|rf  [--files ...] [--every K] [--offset O] [--timeout 240]
      every K-th test (by collection order, starting at O) in its own FRESH pytest process
      -> $WORK/results/fresh-<flavour>-<file>/<i>.xml
Every command runs under `nice -n 19` with OMP_NUM_THREADS=1; hub access is offline.
"""

import argparse
import os
import subprocess
from pathlib import Path

WORK = Path(os.environ.get("WORK", "/tmp/trl_own_tests"))
PY = os.environ.get("PYTHON", "/work/main/.venv/bin/python")
FILES = {
    "sft": "tests/test_sft_trainer.py",
    "dpo": "tests/test_dpo_trainer.py",
    "grpo": "tests/test_grpo_trainer.py",
    "kto": "tests/test_kto_trainer.py",
    "reward": "tests/test_reward_trainer.py",
    "rloo": "tests/test_rloo_trainer.py",
    "distill": "tests/experimental/test_distillation_trainer.py",
}
ENV = dict(
    os.environ,
    WORK=str(WORK),
    OMP_NUM_THREADS="1",
    MKL_NUM_THREADS="1",
    TOKENIZERS_PARALLELISM="false",
    HF_HUB_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    HF_HUB_CACHE=str(WORK / "hf_cache"),
    HF_DATASETS_CACHE=str(WORK / "ds_cache"),
    HF_HUB_DISABLE_TELEMETRY="1",
    WANDB_DISABLED="true",
    WANDB_MODE="disabled",
    MLFLOW_TRACKING_URI="",
    PYTHONDONTWRITEBYTECODE="1",
)
PYTEST = ["-p", "no:cacheprovider", "-q", "-rN", "--tb=line", "-W", "ignore"]


def pytest_cmd(timeout, flavour, args):
    return [
        "timeout",
        "-k",
        "30",
        str(timeout),
        "nice",
        "-n",
        "19",
        PY,
        "-m",
        "pytest",
        *PYTEST,
        *args,
    ]


def collect(flavour, path):
    out = subprocess.run(
        [
            "nice",
            "-n",
            "19",
            PY,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            path,
        ],
        cwd=WORK / flavour,
        env=ENV,
        capture_output=True,
        text=True,
    ).stdout
    return [line.strip() for line in out.splitlines() if line.startswith(path + "::")]


def node_id(classname, name):
    """junit classname `tests.experimental.test_x.TestC` + name -> pytest node id."""
    parts = classname.split(".")
    mod = next(i for i, part in enumerate(parts) if part.startswith("test_"))
    return "/".join(parts[: mod + 1]) + ".py::" + "::".join(parts[mod + 1 :] + [name])


def junit_classname(nodeid):
    """pytest node id -> junit classname (inverse of node_id, for a test killed by timeout)."""
    path, *rest = nodeid.split("::")
    return ".".join([path[: -len(".py")].replace("/", ".")] + rest[:-1])


def one_process_passes(xml):
    import xml.etree.ElementTree as ET

    out = set()
    for tc in ET.parse(xml).getroot().iter("testcase"):
        if any(ch.tag in ("failure", "error", "skipped") for ch in tc):
            continue
        out.add(node_id(tc.get("classname"), tc.get("name")))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["one", "fresh"])
    ap.add_argument("--flavour", choices=["plain", "rf"], required=True)
    ap.add_argument("--files", default="sft,dpo,grpo,kto,reward,rloo,distill")
    ap.add_argument(
        "-k",
        dest="keyword",
        default=None,
        help="one mode: pytest -k expression; results go to one-<flavour>-<file>-k.xml so the "
        "full-file results stay",
    )
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=None)
    ap.add_argument(
        "--from-passed",
        action="store_true",
        help="fresh mode: sample only among the tests that passed plain in one-process mode "
        "(results/one-plain-<file>.xml), in collection order",
    )
    a = ap.parse_args()
    res = WORK / "results"
    res.mkdir(exist_ok=True)
    for key in a.files.split(","):
        path = FILES[key]
        if a.mode == "one":
            stem = f"one-{a.flavour}-{key}" + ("-k" if a.keyword else "")
            xml, log = res / f"{stem}.xml", res / f"{stem}.log"
            extra = ["-k", a.keyword] if a.keyword else []
            cmd = pytest_cmd(a.timeout or 2400, a.flavour, [path, f"--junitxml={xml}", *extra])
            with open(log, "w") as f:
                rc = subprocess.run(
                    cmd, cwd=WORK / a.flavour, env=ENV, stdout=f, stderr=subprocess.STDOUT
                ).returncode
            print(key, a.flavour, "one-process rc", rc, flush=True)
        else:
            ids = collect(a.flavour, path)
            if a.from_passed:
                passed = one_process_passes(res / f"one-plain-{key}.xml")
                ids = [i for i in ids if i in passed]
            sample = ids[a.offset :: a.every]
            outdir = res / f"fresh-{a.flavour}-{key}"
            outdir.mkdir(exist_ok=True)
            (outdir / "sample.txt").write_text("\n".join(sample) + "\n")
            for i, nodeid in enumerate(sample):
                xml = outdir / f"{i:04d}.xml"
                if xml.exists():
                    continue  # resumable
                cmd = pytest_cmd(a.timeout or 300, a.flavour, [nodeid, f"--junitxml={xml}"])
                p = subprocess.run(
                    cmd, cwd=WORK / a.flavour, env=ENV, capture_output=True, text=True
                )
                if not xml.exists():  # killed by timeout: record it
                    name = nodeid.split("::")[-1]
                    cls = junit_classname(nodeid)
                    msg = f"process exit {p.returncode} (timeout {a.timeout or 300}s?)"
                    xml.write_text(
                        f'<testsuites><testsuite><testcase classname="{cls}" name="{name}">'
                        f'<failure message="{msg}">{msg}</failure>'
                        "</testcase></testsuite></testsuites>"
                    )
                print(a.flavour, key, i, len(sample), nodeid, p.returncode, flush=True)


if __name__ == "__main__":
    main()

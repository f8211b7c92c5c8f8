"""The trl-rapidfire command and the quickstart example."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trl_rapidfire.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "usage: trl-rapidfire" in out and "expand" in out


def test_console_script_is_installed():
    out = subprocess.run(["trl-rapidfire", "version"], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("trl-rapidfire ") and "trl 1." in out


def test_expand_the_example_yaml(capsys):
    assert main(["expand", str(ROOT / "examples/configs/sft_grid.yaml")]) == 0
    out = capsys.readouterr().out
    assert "4 run(s)" in out and "run-3" in out and "lr_scheduler_type='cosine'" in out


def test_expand_with_a_flag_override(capsys):
    path = str(ROOT / "examples/configs/sft_grid.yaml")
    assert main(["expand", path, "--learning_rate", "3e-4"]) == 0
    out = capsys.readouterr().out
    assert "2 run(s)" in out and "learning_rate" not in out.split("\n", 1)[1]


def test_expand_random_search_with_a_range(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "output_dir": str(tmp_path / "o"), "use_cpu": True, "bf16": False,
        "learning_rate": {"Range": {"low": 1e-5, "high": 1e-3, "log": True}},
    }))
    assert main(["expand", str(path), "--search", "random", "--num-runs", "3"]) == 0
    assert "3 run(s)" in capsys.readouterr().out


def test_expand_reports_a_bad_config_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path), "use_cpu": True, "bf16": False,
                                    "learning_rate": {"Range": [1e-5, 1e-3]}}))
    assert main(["expand", str(path)]) == 2
    err = capsys.readouterr().err
    assert "learning_rate" in err and "RandomSearch" in err


def test_a_lower_case_knob_in_yaml_is_refused_in_yaml_terms(tmp_path, capsys):
    path = tmp_path / "grid.yaml"
    path.write_text(f"output_dir: {tmp_path}\nuse_cpu: true\nbf16: false\n"
                    "learning_rate: {list: [1.0e-4, 3.0e-4]}\n")
    assert main(["expand", str(path)]) == 2
    err = capsys.readouterr().err
    assert "learning_rate" in err and "'list' is not a knob" in err
    assert "learning_rate: {List: [0.0001, 0.0003]}" in err  # the YAML form of the fix


@pytest.mark.parametrize("argv", [["--dry-run"], ["--dry-run", "--random", "4"]])
def test_quickstart_shows_its_runs(argv, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["quickstart.py", *argv])
    runpy.run_path(str(ROOT / "examples/quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    expected = 4 if "--random" in argv else 8
    assert f"{expected} runs" in out and f"run-{expected - 1}" in out
    assert not (tmp_path / "mlflow.db").exists()  # nothing trained, nothing tracked

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


@pytest.mark.parametrize(("trainer", "field", "values"), [
    ("kto", "desirable_weight", [1.0, 1.33]), ("reward", "center_rewards_coefficient", [0.0, 0.01]),
    ("rloo", "normalize_advantages", [False, True]),
    ("distillation", "teacher_model_revision", ["main", "v2"]),
])
def test_expand_reads_every_kinds_config(tmp_path, capsys, trainer, field, values):
    # Each kind's own field parses as a knob only through its own config class.
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "o"), "bf16": False,
                                    field: {"List": values}}))
    assert main(["expand", str(path), "--trainer", trainer]) == 0
    out = capsys.readouterr().out
    assert "2 run(s)" in out and f"{field}={values[1]!r}" in out
    assert main(["expand", str(path), "--trainer", "grpo"]) == 2  # not a GRPO field


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


def test_status_knob_columns_are_the_knobs_that_differ_a_few_and_cut():
    from trl_rapidfire.client.experiments import KNOB_CHARS, KNOB_COLUMNS, knob_columns

    template = "<|{}|>{{% for m in messages %}}{{{{ m['content'] }}}}{{% endfor %}}"
    runs = [{"learning_rate": lr, "seed": 0, "chat_template": template.format(role),
             **{f"knob_{k}": k * i for k in range(8)}}
            for i, (lr, role) in enumerate([(1e-3, "user"), (3e-4, "assistant")])]
    cols = knob_columns(runs)
    assert cols.names[:2] == ["learning_rate", "chat_template"]  # seed is the same: no column
    assert len(cols.names) == KNOB_COLUMNS and cols.hidden == 9 - KNOB_COLUMNS
    assert [row[0] for row in cols.cells] == ["0.001", "0.0003"]
    assert all(len(cell) <= KNOB_CHARS for row in cols.cells for cell in row)
    assert cols.cells[0][1] != cols.cells[1][1]  # cut in the middle: still told apart
    whole = knob_columns(runs, full=True)
    assert len(whole.names) == 9 and whole.hidden == 0
    assert whole.cells[1][1] == template.format("assistant")
    # A LoRA config (as the state and MLflow give it: its description) by the field that
    # differs, a column of its own, whole: not a long value cut in the middle.
    lora = "LoraConfig(r={}, alpha=16, targets=['q_proj', 'k_proj', 'v_proj', 'o_proj'])"
    loras = knob_columns([{"peft_config": lora.format(r)} for r in (8, 32)])
    assert loras.names == ["peft_config.r"] and loras.cells == [["8"], ["32"]]
    # MLflow params: a param holding the run's own name (its output_dir) is no knob.
    params = [{"learning_rate": "0.001", "output_dir": "out/runs/run-0"},
              {"learning_rate": "0.003", "output_dir": "out/runs/run-1"}]
    assert knob_columns(params, ["run-0", "run-1"]).names == ["learning_rate"]


def test_the_knobs_that_differ_one_rule_from_the_knobs_tag_or_the_whole_config():
    from trl_rapidfire.client.experiments import knob_columns, tracked_knobs
    from trl_rapidfire.reports.display import differing_keys

    # First seen first; a run lacking a key differs in it; values compare as JSON.
    assert differing_keys([{"b": 1, "a": [1, 2]}, {"b": 1, "a": [1, 3]}, {"c": None, "b": 1}]
                          ) == ["a", "c"]
    assert differing_keys([{"lr": 1e-3}, {"lr": 0.001}]) == []
    params = [{"learning_rate": "0.001", "output_dir": "out/runs/run-0", "seed": "0",
               "peft_config": "LoraConfig(r=8)"},
              {"learning_rate": "0.003", "output_dir": "out/runs/run-1", "seed": "0",
               "peft_config": "LoraConfig(r=8)"}]
    tags = [{"rapidfire.run": f"run-{i}", "rapidfire.knobs": '["learning_rate", "peft_config"]'}
            for i in range(2)]
    # The knobs tag names the knobs: those params alone, and only the ones that differ.
    rows, names = tracked_knobs(params, tags)
    assert rows == [{"learning_rate": "0.001", "peft_config": "LoraConfig(r=8)"},
                    {"learning_rate": "0.003", "peft_config": "LoraConfig(r=8)"}]
    assert names is None and knob_columns(rows, names).names == ["learning_rate"]
    # A run without a readable tag (tracked before it; cut at its length limit): the whole
    # config, where output_dir differs too but holds the run's own name.
    tags[1]["rapidfire.knobs"] = '["learning_rate", "peft_con'
    rows, names = tracked_knobs(params, tags)
    assert names == ["run-0", "run-1"] and rows[0]["output_dir"] == "out/runs/run-0"
    assert knob_columns(rows, names).names == ["learning_rate"]
    tags[1]["rapidfire.knobs"] = "[" * 5000  # a person's tag, nested past json's recursion
    assert tracked_knobs(params, tags)[1] == ["run-0", "run-1"]


def test_quickstart_run_again_continues_its_experiment(monkeypatch, tmp_path, capsys):
    """Its folder is ./outputs/quickstart, not a new temporary one: the second run trains
    nothing, says it continues, and the first says how to start over."""
    from trl_rapidfire.storage.schedule import read_schedule_csv

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # ./mlflow.db, as a person has
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    quickstart = runpy.run_path(str(ROOT / "examples/quickstart.py"))
    quickstart["main"](["--random", "2"])  # 2 runs, not 8: the same script, cheaper
    first = capsys.readouterr().out
    folder = tmp_path / "outputs" / "quickstart"
    rows = read_schedule_csv(folder / "schedule.csv")
    assert len(rows) == 16 and (folder / ".rapidfire").is_dir()
    assert "continuing" not in first
    assert "continues this experiment" in first and "--output-dir NEW" in first
    quickstart["main"](["--random", "2"])
    again = capsys.readouterr().out
    assert "continuing: 16 of 16 chunks done; nothing left to train" in again
    assert read_schedule_csv(folder / "schedule.csv") == rows  # no chunk trained again

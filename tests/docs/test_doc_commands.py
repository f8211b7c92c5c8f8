"""Every shell command in README.md, docs/*.md and benchmarks/README.md is accounted for, so
none goes stale unnoticed:

* run here, exactly as written (quick, offline ones);
* run by a named test or by ``.ci/run``: checked here that the test still exists and still
  uses the command's own words;
* a benchmark's full measurement: its ``--quick`` smoke run is run here, the full one makes
  the figures in ``benchmarks/README.md`` (minutes; by hand);
* the reader's own script (``my_experiment.py``) or a GPU launch: it cannot run here, and the
  docs say so beside it.

A command added to the docs without a place here fails ``test_every_doc_command_is_accounted_for``.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
           ROOT / "benchmarks" / "README.md"]
BLOCK = re.compile(r"```(?:bash|sh|shell|console)\n(.*?)```", re.S)

# Run by a test or by .ci/run: command -> [(place, words the place must contain)].
RUN_BY: dict[str, list[tuple[str, list[str]]]] = {
    "python -m venv .venv && . .venv/bin/activate": [
        (".ci/run", ["-m venv .venv", ". .venv/bin/activate"])],
    "bash scripts/install.sh && python examples/quickstart.py": [
        (".ci/run", ["bash scripts/install.sh"]),
        ("tests/docs/test_readme_first_hour.py::test_quickstart_then_dashboard_as_readme_says",
         ['"quickstart.py"'])],
    "bash scripts/install.sh && python -m pytest": [
        (".ci/run", ["bash scripts/install.sh && python -m pytest"])],
    "bash scripts/install.sh": [(".ci/run", ["bash scripts/install.sh"])],
    ". .venv/bin/activate": [(".ci/run", [". .venv/bin/activate"])],
    "python examples/sft_generation_eval.py": [
        ("tests/examples/test_example_generation_eval.py::"
         "test_example_scores_each_run_on_its_answers", ["example.main("])],
    "trl-rapidfire dashboard": [
        ("tests/docs/test_readme_first_hour.py::test_quickstart_then_dashboard_as_readme_says",
         ['"dashboard"', "SIGINT"])],
    "trl-rapidfire dashboard --port 5001 --uri sqlite:////path/to/mlflow.db": [
        ("tests/tracking/test_ops_through_mlflow_server.py::"
         "test_dashboard_command_serves_the_store_and_stops_cleanly",
         ["dashboard", "--port", "--uri"])],
    "trl-rapidfire status": [
        ("tests/client/test_cli_ops.py::test_status_prints_every_run", ['"status"'])],
    "trl-rapidfire status --output-dir outputs/demo": [
        ("tests/client/test_cli_ops.py::test_status_prints_every_run",
         ['"status"', '"--output-dir"'])],
    "trl-rapidfire stop run-2": [
        ("tests/client/test_cli_ops.py::test_op_commands_set_the_tag_the_experiment_reads",
         ['"stop"'])],
    "trl-rapidfire resume run-2": [
        ("tests/client/test_cli_ops.py::test_op_commands_set_the_tag_the_experiment_reads",
         ['"resume"'])],
    "trl-rapidfire delete run-3": [
        ("tests/client/test_cli_ops.py::test_op_commands_set_the_tag_the_experiment_reads",
         ['"delete"'])],
    "trl-rapidfire clone run-1 --set learning_rate=1e-4 --warm": [
        ("tests/client/test_cli_ops.py::test_op_commands_set_the_tag_the_experiment_reads",
         ['"clone"', '"--warm"', '"--set"'])],
    "trl-rapidfire clone run-1 --set peft_config.r=32 --set lr_scheduler_type=cosine": [
        ("tests/client/test_cli_ops.py::test_op_commands_set_the_tag_the_experiment_reads",
         ['"clone"', "peft_config.r=", "lr_scheduler_type=cosine"])],
    "trl-rapidfire report outputs/demo --out report/": [
        ("tests/reports/test_report_plots.py::test_cli_report_by_training_loss_and_a_bad_folder",
         ['"report"', '"--out"'])],
    "trl-rapidfire report outputs/demo --out report/ --metric accuracy": [
        ("tests/reports/test_report_plots.py::test_cli_report_by_training_loss_and_a_bad_folder",
         ['"report"', '"--metric"']),
        ("tests/reports/test_report_plots.py::"
         "test_policy_ops_clones_and_a_higher_is_better_metric_from_written_files",
         ["accuracy"])],
    "trl-rapidfire report outputs/demo --out report/ --uri sqlite:////path/to/mlflow.db": [
        ("tests/reports/test_report_plots.py::test_cli_report_by_training_loss_and_a_bad_folder",
         ['"report"', '"--uri"'])],
    "python benchmarks/cli_startup.py": [
        ("tests/client/test_tracked_runs.py::test_the_cli_startup_benchmark_prints_its_ratios",
         ["cli_startup.py", "--quick"])],
    "python benchmarks/time_to_best.py --quick": [
        ("tests/benchmarks/test_time_to_best_benchmark.py", ["time_to_best", "--quick"])],
}
# Quick enough to run here exactly as written, from the repository root.
RUN_HERE = {
    "trl-rapidfire expand examples/configs/sft_grid.yaml": "4 run(s)",
    # learning_rate is a knob in the YAML: fixing it leaves the scheduler knob's 2 runs
    "trl-rapidfire expand examples/configs/sft_grid.yaml --learning_rate 3e-4": "2 run(s)",
}
# Benchmarks whose --quick smoke run is run here (the full runs make the published figures).
QUICK = {"benchmarks/overhead.py", "benchmarks/durability.py", "benchmarks/workers.py",
         "benchmarks/time_to_best.py", "benchmarks/real_shape.py", "benchmarks/turn_costs.py",
         "benchmarks/scaling.py", "benchmarks/generation_eval.py", "benchmarks/tracking_scale.py",
         "benchmarks/panel_refresh.py", "benchmarks/policy_scale.py",
         "benchmarks/first_metric.py", "benchmarks/kinds_steps.py"}
OWN_SCRIPT = "my_experiment.py"  # the reader's script: the docs show it beside the command


def doc_commands() -> list[tuple[str, str]]:
    """``(source, command)`` for every command line of every shell block (continuation lines
    joined, comments and environment prefixes dropped, blank and comment lines skipped)."""
    found = []
    for path in SOURCES:
        for block in BLOCK.findall(path.read_text(encoding="utf-8")):
            text = re.sub(r"\\\n\s*", " ", block)
            for line in text.splitlines():
                command = _strip(line)
                if command:
                    found.append((path.relative_to(ROOT).as_posix(), command))
    return found


def _strip(line: str) -> str:
    words = shlex.split(line, comments=True)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words.pop(0)  # HF_HUB_OFFLINE=1, OMP_NUM_THREADS=1: the environment, not the command
    return " ".join(words)


def _benchmark(command: str) -> str | None:
    match = re.match(r"python (benchmarks/\w+\.py)\b", command)
    return match.group(1) if match else None


def _place_text(place: str) -> str:
    path, _, func = place.partition("::")
    source = (ROOT / path).read_text(encoding="utf-8")
    if not func:
        return source
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == func:
            return ast.get_source_segment(source, node) or ""
    raise AssertionError(f"{place}: no such test any more")


def test_the_docs_have_shell_commands():
    assert len(doc_commands()) >= 20


def test_every_doc_command_is_accounted_for():
    unaccounted = []
    for source, command in doc_commands():
        bench = _benchmark(command)
        if command in RUN_BY or command in RUN_HERE or OWN_SCRIPT in command:
            continue
        if bench is not None and bench in QUICK:
            continue
        unaccounted.append(f"{source}: {command}")
    assert not unaccounted, (
        "commands in the docs that nothing runs (add them to RUN_BY or RUN_HERE in "
        f"{Path(__file__).name}, or mark them): {unaccounted}")


@pytest.mark.parametrize("command", sorted(RUN_BY))
def test_the_tests_that_run_a_doc_command_still_do(command):
    for place, words in RUN_BY[command]:
        text = _place_text(place)
        missing = [w for w in words if w not in text]
        assert not missing, f"{place} no longer uses {missing} (for `{command}`)"


def test_every_entry_here_is_still_in_the_docs():
    documented = {command for _, command in doc_commands()}
    assert set(RUN_BY) <= documented, sorted(set(RUN_BY) - documented)
    assert set(RUN_HERE) <= documented, sorted(set(RUN_HERE) - documented)


@pytest.mark.parametrize("command", sorted(RUN_HERE))
def test_a_quick_doc_command_runs_as_written(command, tmp_path):
    exe = Path(sys.executable).with_name("trl-rapidfire")
    argv = shlex.split(command)
    if argv[0] == "trl-rapidfire":
        argv[0] = str(exe)
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert RUN_HERE[command] in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(QUICK - {"benchmarks/time_to_best.py",
                                                    "benchmarks/turn_costs.py",
                                                    "benchmarks/scaling.py",
                                                    "benchmarks/tracking_scale.py",
                                                    "benchmarks/panel_refresh.py",
                                                    "benchmarks/policy_scale.py",
                                                    "benchmarks/first_metric.py",
                                                    "benchmarks/kinds_steps.py"}))
def test_a_benchmarks_quick_run_works(script, tmp_path):
    # time_to_best's, turn_costs', scaling's, tracking_scale's, panel_refresh's,
    # policy_scale's, first_metric's and kinds_steps' --quick runs have their own tests
    # (tests/benchmarks/), which also check what they print.
    proc = subprocess.run([sys.executable, str(ROOT / script), "--quick"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    # A ratio against the baseline run in the same process, and the exactness check.
    assert re.search(r"/ (B|1 worker|baseline) *= \d+\.\d+|switch%", out), out[-2000:]
    assert re.search(r"bitwise equal: yes|bitwise equal for (\d+)/\1 runs", out), out[-2000:]

"""The benchmarks' step clock (``benchmarks/step_clock.py``) on an interleaved experiment: each
run's clock counts its own steps only, never the turns of the runs that trained while it was
suspended at a chunk boundary (``real_shape.py`` once printed 590 s "in steps" for a side whose
whole wall was 94.5 s)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_clock.py"
STEPS, CHUNKS, RATES = 8, 4, [1e-3, 2e-3, 3e-3]


def _load():
    spec = importlib.util.spec_from_file_location("step_clock_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_each_runs_clock_counts_its_own_steps_only(tmp_path):
    clock = _load()
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), learning_rate=List(RATES),
                         **cpu_training_kwargs(), per_device_train_batch_size=4,
                         num_chunks=CHUNKS, max_steps=STEPS),
        train_dataset=make_sft_dataset(32),
        peft_config=tiny_lora_config(r=4),
    )
    clocks = clock.clock_rf_runs(rf)
    began = time.perf_counter()
    rf.train()
    wall = time.perf_counter() - began
    # Interleaved: every run's turns alternate with the others' (the chunks in run order).
    order = [c.run for c in rf.schedule]
    assert order[:len(RATES)] == [f"run-{i}" for i in range(len(RATES))]
    assert [c.steps for c in clocks] == [STEPS] * len(RATES)
    assert all(sorted(c.ends) == list(range(1, STEPS + 1)) for c in clocks)
    # A run's steps are inside its own turns: its clock is under the compute the engine
    # counted for it (its turns, boundary work included), and the sum under the wall; a clock
    # started before the chunk callback's on_step_begin added each suspension (the other runs'
    # chunks) to the step after it, and came to about the whole wall per run.
    stats = rf.engine.stats
    assert 0 < sum(c.seconds for c in clocks) <= stats.compute <= wall

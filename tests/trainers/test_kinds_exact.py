"""KTO, Reward, RLOO and Distillation: two configs interleaved in one experiment end bitwise
equal to each trained alone by plain TRL (adapter, score head, log history)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_kinds import KINDS, logs, same_adapter

from trl_rapidfire import List
from trl_rapidfire.shared_state.runs import RunStatus


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_two_learning_rates_interleaved_equal_two_plain_runs(kind, tmp_path):
    spec = KINDS[kind]
    experiment = spec.experiment(tmp_path / "rf", num_chunks=3,
                                 learning_rate=List([1e-3, 3e-3]))
    assert list(experiment.model_loads.values()) == [1]  # one base model for both runs
    experiment.train()
    assert len(experiment.schedule) >= 2 * 2
    for run in experiment.runs:
        assert run.status == RunStatus.COMPLETED
        alone = spec.plain(tmp_path / run.name, **run.knobs)
        alone.train()
        alone.save_model()
        assert same_adapter(Path(run.output_dir) / "final", tmp_path / run.name), run.name
        assert logs(experiment.run_trainer(run.name)) == logs(alone), run.name

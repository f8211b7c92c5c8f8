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
    # The shared model walks the base and one run's adapter (a reward model's score-head
    # copy included), as the plain model does, whatever the number of runs.
    shared = experiment.run_trainer("run-0").model
    assert len(list(shared.named_parameters())) == len(list(alone.model.named_parameters()))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_one_config_behaves_as_the_trl_trainer_it_replaces(kind, tmp_path):
    spec = KINDS[kind]
    one = spec.experiment(tmp_path / "rf", num_chunks=2)
    assert isinstance(one, spec.plain_trainer)
    one.train()
    one.save_model()  # where TRL saves it: the config's output_dir
    alone = spec.plain(tmp_path / "plain")
    alone.train()
    alone.save_model()
    assert same_adapter(tmp_path / "rf", tmp_path / "plain")
    assert logs(one) == logs(alone)

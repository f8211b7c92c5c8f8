"""The chunk plan, and its agreement with how transformers' Trainer counts steps."""

from __future__ import annotations

import pytest
from trl import SFTConfig, SFTTrainer

from trl_rapidfire.engine.chunks import ChunkPlanError, plan_chunks, training_steps
from trl_rapidfire.testing import cpu_training_kwargs, make_sft_dataset, tiny_model_path


def test_each_epoch_is_cut_into_near_equal_contiguous_spans():
    plan = plan_chunks(steps_per_epoch=10, total_steps=20, num_chunks=4)
    assert [(c.epoch, c.index, c.start_step, c.end_step) for c in plan.chunks] == [
        (0, 0, 0, 3), (0, 1, 3, 6), (0, 2, 6, 8), (0, 3, 8, 10),
        (1, 0, 10, 13), (1, 1, 13, 16), (1, 2, 16, 18), (1, 3, 18, 20),
    ]
    assert [c.number for c in plan.chunks] == list(range(8))
    assert plan.boundaries[-1] == plan.total_steps == 20


@pytest.mark.parametrize("steps", [1, 2, 7, 10, 31, 32, 33, 100])
@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 7])
def test_spans_cover_every_step_once_and_differ_by_at_most_one(steps, chunks):
    with pytest.warns(UserWarning) if chunks > steps else _no_warning():
        plan = plan_chunks(steps, steps, chunks)
    sizes = [c.steps for c in plan.chunks]
    assert sum(sizes) == steps and min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1
    assert len(plan) == min(chunks, steps)
    for a, b in zip(plan.chunks, plan.chunks[1:]):
        assert a.end_step == b.start_step


def test_runs_with_equal_batches_share_chunk_k_even_with_other_lengths():
    two_epochs = plan_chunks(8, 16, 4)
    one_epoch = plan_chunks(8, 8, 4)
    assert two_epochs.chunks[:4] == one_epoch.chunks


def test_an_epoch_cut_short_by_max_steps_is_chunked_on_its_own_length():
    plan = plan_chunks(steps_per_epoch=8, total_steps=11, num_chunks=4)
    assert [(c.epoch, c.start_step, c.end_step) for c in plan.chunks] == [
        (0, 0, 2), (0, 2, 4), (0, 4, 6), (0, 6, 8), (1, 8, 9), (1, 9, 10), (1, 10, 11)]
    # max_steps far below one epoch (a big dataset): still num_chunks turns.
    short = plan_chunks(steps_per_epoch=10_000, total_steps=10, num_chunks=4)
    assert [(c.start_step, c.end_step) for c in short.chunks] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    # Runs with the same batch settings and max_steps still share chunk k.
    assert plan_chunks(10_000, 10, 4).chunks == short.chunks


def test_more_chunks_than_steps_lowers_num_chunks_with_a_warning():
    with pytest.warns(UserWarning, match="run-3: num_chunks=5 but an epoch has only 3"):
        plan = plan_chunks(3, 3, 5, run="run-3")
    assert plan.num_chunks == 3 and len(plan) == 3


def test_step_multiple_puts_boundaries_on_whole_cycles():
    plan = plan_chunks(steps_per_epoch=12, total_steps=12, num_chunks=3, step_multiple=4)
    assert plan.boundaries == (4, 8, 12)
    plan = plan_chunks(steps_per_epoch=14, total_steps=14, num_chunks=3, step_multiple=4)
    assert all(b % 4 == 0 for b in plan.boundaries[:-1]) and plan.boundaries[-1] == 14
    with pytest.warns(UserWarning, match="blocks of 4 steps"):
        assert plan_chunks(8, 8, 3, step_multiple=4).num_chunks == 2


def test_chunk_at():
    plan = plan_chunks(10, 20, 4)
    assert plan.chunk_at(0).number == 0
    assert plan.chunk_at(12).number == 4
    assert plan.chunk_at(20) is None


@pytest.mark.parametrize(
    "bad", [dict(num_chunks=0), dict(num_chunks=1.5), dict(num_chunks=True),
            dict(steps_per_epoch=0), dict(total_steps=0), dict(step_multiple=0)])
def test_bad_numbers_are_clear_errors(bad):
    kwargs = dict(steps_per_epoch=10, total_steps=10, num_chunks=2) | bad
    with pytest.raises(ChunkPlanError):
        plan_chunks(**kwargs)


def test_training_steps_errors():
    with pytest.raises(ChunkPlanError, match="empty"):
        training_steps(0, 1, 1.0)
    with pytest.raises(ChunkPlanError, match="no optimizer step"):
        training_steps(4, 1, 0.0)


@pytest.mark.parametrize(
    ("rows", "batch", "accumulation", "epochs", "max_steps"),
    [(64, 8, 1, 1.0, -1), (70, 8, 2, 2.0, -1), (64, 4, 3, 1.5, -1), (64, 8, 1, 3.0, 11),
     (20, 8, 4, 1.0, -1)],
)
def test_training_steps_match_the_trainer(tmp_path, rows, batch, accumulation, epochs, max_steps):
    args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=batch,
                     gradient_accumulation_steps=accumulation, num_train_epochs=epochs,
                     max_steps=max_steps, **cpu_training_kwargs())
    trainer = SFTTrainer(model=tiny_model_path(), args=args,
                         train_dataset=make_sft_dataset(rows))
    loader = trainer.get_train_dataloader()
    _, per_epoch, *_, total = trainer.set_initial_training_values(args, loader)
    assert training_steps(len(loader), accumulation, epochs, max_steps) == (per_epoch, total)


class _no_warning:
    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error", UserWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)

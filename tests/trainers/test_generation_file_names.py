"""A generation eval's files list in step order (zero-padded steps), and names written before
the padding still read back (trl_rapidfire/trainers/generation_eval.py)."""

from __future__ import annotations

from trl_rapidfire.trainers.generation_eval import generation_file_name, generation_file_step


def test_generation_files_list_in_step_order_and_old_names_still_read(tmp_path):
    steps = [8, 96, 128, 1000, 12000]
    for step in steps:
        (tmp_path / generation_file_name("eval", step)).write_text("{}\n")
    listed = sorted(p.name for p in tmp_path.iterdir())  # as `ls` and a file browser list them
    assert [generation_file_step(name) for name in listed] == [("eval", s) for s in steps]
    assert listed[1] == "eval-step-00000096.jsonl" and listed[2] == "eval-step-00000128.jsonl"
    # Names of before the padding, and an eval set of its own, read back alike.
    assert generation_file_step("eval-step-96.jsonl") == ("eval", 96)
    assert generation_file_step("eval_sums-step-00000002.jsonl") == ("eval_sums", 2)
    assert generation_file_step(generation_file_name("eval", 10**9)) == ("eval", 10**9)
    for other in ("eval-step-.jsonl", "notes.txt", "eval-step-9.json", "../eval-step-1.jsonl"):
        assert generation_file_step(other) is None

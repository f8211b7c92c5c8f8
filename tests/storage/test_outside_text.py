"""Text from outside the script is bounded before it is parsed, and files in the experiment's
folder are never reached through a link (trust, second pass).

Python's JSON parser recurses once per nesting level: 3 KB of ``[`` raise ``RecursionError``,
which is not a ``ValueError`` and escaped every ``except ValueError`` around a parse.
"""

from __future__ import annotations

import json
import os

import pytest

from trl_rapidfire.client.cli import main as cli_main
from trl_rapidfire.control.ops import OpError, parse_op, resolve_overrides
from trl_rapidfire.shared_state.state_schema import BadState, check_document, check_line
from trl_rapidfire.storage.outside_text import (
    MAX_DEPTH,
    OP_TEXT_BYTES,
    NotJSON,
    OutsideTextError,
    loads,
    nesting_depth,
)
from trl_rapidfire.storage.own_files import LinkRefused, append_text, read_bytes, write_atomic

DEEP = "[" * 1500 + "]" * 1500


def test_nesting_depth_counts_brackets_outside_strings_without_recursion():
    assert nesting_depth("3") == 0
    assert nesting_depth('{"a": [1, {"b": []}]}') == 4
    assert nesting_depth('"[[[[" ') == 0
    assert nesting_depth('["\\"[[["]') == 1  # an escaped quote does not end the string
    assert nesting_depth("[" * 100_000) == 100_000  # far past any recursion limit


def test_loads_refuses_what_is_too_long_too_deep_or_not_json():
    assert loads('{"a": [1, 2]}', what="x") == {"a": [1, 2]}
    with pytest.raises(OutsideTextError, match="the op nests 1500 levels deep"):
        loads(DEEP, what="the op")
    with pytest.raises(OutsideTextError, match="too long"):
        loads("1" * (OP_TEXT_BYTES + 1), what="the op")
    with pytest.raises(OutsideTextError, match="more than 4,300 digits"):
        loads("1" * 5000, what="v")
    with pytest.raises(NotJSON, match="not valid JSON"):
        loads("{", what="v")
    with pytest.raises(OutsideTextError, match="not UTF-8"):
        loads(b"\xff", what="v")
    assert loads("[" * MAX_DEPTH + "]" * MAX_DEPTH, what="v") is not None


@pytest.mark.parametrize("text, match", [
    ("clone {\"learning_rate\": " + DEEP + "}", "nests 1501 levels deep"),
    ("clone " + "{\"a\": " * 20 + "1" + "}" * 20, "nests 20 levels deep"),
    ("clone {\"learning_rate\": " + "1" * 5000 + "}", "more than 4,300 digits"),
    ("stop" + " " * OP_TEXT_BYTES, "too long"),
])
def test_op_text_beyond_the_bounds_is_an_op_error(text, match):
    with pytest.raises(OpError, match=match):
        parse_op(text)


def test_an_override_of_an_integer_field_takes_a_whole_number():
    from peft import LoraConfig
    from trl import SFTConfig

    knobs = {"peft_config": LoraConfig(r=8), "per_device_train_batch_size": 4}
    with pytest.raises(OpError, match="'peft_config.r' takes a whole number, got 1.5"):
        resolve_overrides({"peft_config.r": 1.5}, knobs, {}, {}, {"peft_config": None},
                          untrusted=True)
    with pytest.raises(OpError, match="takes a whole number"):
        resolve_overrides({"per_device_train_batch_size": 2.5}, knobs, {},
                          {"per_device_train_batch_size": 4}, {}, config_class=SFTConfig)
    out = resolve_overrides({"peft_config.r": 16.0}, knobs, {}, {}, {"peft_config": None})
    assert out["peft_config"].r == 16


def test_cli_values_beyond_the_bounds_are_one_line_errors(tmp_path, capsys):
    out = str(tmp_path / "nothing-here")
    for value, match in ((("1" * 100_000), "too long"), ("[" * 50 + "]" * 50, "nests 50")):
        assert cli_main(["clone", "run-0", "--set", f"lr={value}", "--dir", out]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and match in err, err


def test_files_are_never_read_or_written_through_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "ops.csv"
    link.symlink_to(victim)
    with pytest.raises(LinkRefused, match="is a symbolic link"):
        read_bytes(link)
    with pytest.raises(LinkRefused):
        append_text(link, "row\n")
    # A temporary name someone planted as a link is removed, never written through.
    planted = tmp_path / f".state.json.tmp-{os.getpid()}"
    planted.symlink_to(victim)
    write_atomic(tmp_path / "state.json", "{}")
    assert (tmp_path / "state.json").read_text() == "{}"
    assert victim.read_text() == "precious"
    big = tmp_path / "big.json"
    big.write_text("[" + "1," * 40_000 + "1]")
    with pytest.raises(OutsideTextError, match="too large"):
        read_bytes(big)


def _doc():
    run = {"name": "run-0", "knobs": {"learning_rate": 0.001}, "status": "running",
           "chunks_done": 1, "global_step": 4, "error": None, "parent": None,
           "warm_start": False}
    return {"format": "trl-rapidfire/scheduler-state", "version": 1, "fingerprint": "ab",
            "runs": {"run-0": run}, "chunks_total": {"run-0": 4}, "order": ["run-0"],
            "claims": {"run-0": {"worker": "h:1:t", "chunk": 1, "lease_until": 5.0}},
            "owner": {}, "last_run": {"h:1:t": "run-0"}, "clones": {}, "ready": "",
            "wall_seconds": 1.0, "gang_size": {}, "gang": None, "searching": False}


def test_a_state_document_is_held_to_what_the_package_writes():
    check_document(_doc())
    bad = [
        lambda d: d.update(extra=1),
        lambda d: d["runs"]["run-0"].update(name="../../../x"),
        lambda d: d["runs"]["run-0"].update(name="run-1"),
        lambda d: d["runs"]["run-0"].update(chunks_done=-1),
        lambda d: d["runs"]["run-0"].update(status="exploded"),
        lambda d: d["runs"]["run-0"].update(parent="../x"),
        lambda d: d["runs"]["run-0"].update(evil=True),
        lambda d: d["claims"]["run-0"].update(lease_until=float("nan")),
        lambda d: d["claims"]["run-0"].update(extra=1),
        lambda d: d["last_run"].update({"h:1:t": "/etc"}),
        lambda d: d["clones"].update({"run-0": {"parent": "run-0", "op": "x" * 9000}}),
        lambda d: d.update(gang={"run": "run-0"}),
        lambda d: d.update(wall_seconds="soon"),
    ]
    for change in bad:
        doc = _doc()
        change(doc)
        with pytest.raises(BadState):
            check_document(doc)


@pytest.mark.parametrize("line", [
    {"set": {"__dict__": {"fingerprint": "x"}}},
    {"put": {"__class__": 1}},
    {"put": {"fingerprint": {"a": 1}}},
    {"set": {"runs": {"run-1": {"name": "../../../x"}}}},
    {"set": {"owner": {"../x": "w"}}},
    {"append": {"claims": ["run-1"]}},
    {"append": {"order": ["../x"]}},
    {"del": {"runs": [1]}},
    {"sneak": {}},
    [1, 2],
])
def test_a_journal_line_that_names_anything_else_is_refused_whole(line):
    with pytest.raises(BadState):
        check_line(line)


def test_journal_lines_are_checked_before_they_change_the_state(tmp_path):
    from trl_rapidfire.shared_state.state_file import FileStore
    from trl_rapidfire.shared_state.store import StoreError

    store = FileStore(tmp_path, fingerprint="fp")
    with store.transaction() as st:
        st.add_run("run-0", 2)
    journal = tmp_path / "scheduler.journal"
    for line in ('{"set": {"__dict__": {"fingerprint": "evil"}}}',
                 '{"set": {"runs": {"run-0": ' + DEEP + '}}}'):
        before = journal.read_bytes()
        with open(journal, "a") as fh:
            fh.write(line + "\n")
        reader = FileStore(tmp_path, fingerprint="fp", create=False)
        with pytest.raises(StoreError, match="edited or damaged|damaged line"):
            reader.read()
        journal.write_bytes(before)
    assert FileStore(tmp_path, fingerprint="fp", create=False).read().fingerprint == "fp"
    # The snapshot too: nested past the bound, it is refused unparsed, naming the file.
    store.compact()
    doc = json.loads((tmp_path / "scheduler.json").read_text())
    doc["runs"]["run-0"]["knobs"] = {"x": json.loads("[" * 40 + "]" * 40)}
    (tmp_path / "scheduler.json").write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="scheduler.json is not a valid scheduler state.*nests"):
        FileStore(tmp_path, fingerprint="fp", create=False).peek()

"""The shared state's files: a transaction journals only what it changed, every process's copy
follows the others' lines, compaction folds the journal in, and crashes leave a readable state."""

from __future__ import annotations

import dataclasses
import json
import os
import random

import pytest

from trl_rapidfire.shared_state import state_changes, state_file
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.shared_state.store import (
    ExperimentState,
    StoreError,
    claim_next,
    fail_claimed,
    finish_chunk,
    release,
    renew,
)

LEASE = 30.0


def _store(folder, runs=4, chunks=3):
    store = FileStore(folder, "fp")
    with store.transaction() as state:
        for i in range(runs):
            state.add_run(f"run-{i}", chunks, {"learning_rate": 10.0 ** -(i + 1)})
    return store


def _doc(state: ExperimentState) -> dict:
    return json.loads(json.dumps(state.to_json()))


def test_every_field_of_the_state_is_journalled():
    names = {f.name for f in dataclasses.fields(ExperimentState)}
    assert names == {*state_changes.MAPS, *state_changes.SCALARS, "order", "gang"}


def test_a_claim_appends_one_short_line_and_leaves_the_snapshot_alone(tmp_path):
    folder = tmp_path / ".rapidfire"
    store = _store(folder, runs=200)
    snapshot = (folder / "scheduler.json").read_bytes()
    size = (folder / "scheduler.journal").stat().st_size
    with store.transaction(durable=False) as state:
        assert claim_next(state, "w0", now=0, lease_seconds=LEASE) == ("run-0", 0)
    assert (folder / "scheduler.json").read_bytes() == snapshot
    added = (folder / "scheduler.journal").read_bytes()[size:]
    assert added.count(b"\n") == 1 and len(added) < 400, added  # not 200 runs' records
    line = json.loads(added)
    assert set(line["set"]) == {"runs", "claims", "last_run", "seen"}
    assert list(line["set"]["runs"]) == ["run-0"]
    # Another process (a fresh store) and a look from outside see the claim.
    for state in (FileStore(folder, "fp", create=False).read(), store.peek()):
        assert state.claims["run-0"].worker == "w0"
        assert state.runs["run-0"].status == RunStatus.RUNNING


def test_two_processes_copies_follow_each_other_through_random_transactions(tmp_path):
    folder = tmp_path / ".rapidfire"
    stores = [_store(folder, runs=5, chunks=4), FileStore(folder, "fp")]
    rng = random.Random(0)
    for step in range(300):
        k = rng.randrange(2)
        worker = f"w{k}"
        with stores[k].transaction(durable=rng.random() < 0.3) as state:
            mine = [n for n, c in state.claims.items() if c.worker == worker]
            roll = rng.random()
            if mine and roll < 0.5:
                finish_chunk(state, mine[0], worker, state.claims[mine[0]].chunk)
            elif mine and roll < 0.6:
                renew(state, mine[0], worker, now=step, lease_seconds=LEASE)
            elif mine and roll < 0.65:
                release(state, mine[0], worker)
            elif mine and roll < 0.68:
                fail_claimed(state, mine[0], worker, "boom")
            elif roll < 0.7:
                state.add_run(f"run-{len(state.runs)}", 2)
            elif roll < 0.72:
                state.wall_seconds += 1.5
            else:
                claim_next(state, worker, now=step, lease_seconds=LEASE)
        fresh = FileStore(folder, "fp", create=False).read()
        # Each copy, brought up to date under the lock, is what the files say.
        assert _doc(stores[1 - k].read()) == _doc(fresh) == _doc(stores[k].read())
        assert _doc(stores[0].peek()) == _doc(fresh)


def test_the_journal_is_folded_into_the_snapshot_once_it_outgrows_it(tmp_path, monkeypatch):
    monkeypatch.setattr(state_file, "_MIN_COMPACT_BYTES", 2000)
    folder = tmp_path / ".rapidfire"
    store = _store(folder, runs=3, chunks=1000)
    other = FileStore(folder, "fp")
    generation = json.loads((folder / "scheduler.json").read_text())["generation"]
    for step in range(100):
        with store.transaction() as state:
            name, chunk = claim_next(state, "w0", now=step, lease_seconds=LEASE)
            finish_chunk(state, name, "w0", chunk)
    after = json.loads((folder / "scheduler.json").read_text())
    assert after["generation"] > generation + 2
    assert (folder / "scheduler.journal").stat().st_size < 2500
    assert sum(r["chunks_done"] for r in after["runs"].values()) <= 100
    # The other copy was made before all of it: it reads the new snapshot and journal.
    assert _doc(other.read()) == _doc(store.read())
    assert sum(r.chunks_done for r in other.read().runs.values()) == 100
    store.compact()
    assert sum(r["chunks_done"] for r in json.loads(
        (folder / "scheduler.json").read_text())["runs"].values()) == 100


def test_a_line_a_crash_cut_short_is_ignored_and_cut_off(tmp_path):
    folder = tmp_path / ".rapidfire"
    store = _store(folder)
    with store.transaction() as state:
        claim_next(state, "w0", now=0, lease_seconds=LEASE)
    with open(folder / "scheduler.journal", "ab") as fh:
        fh.write(b'{"set": {"claims": {"run-1": {"wor')  # the writer died mid-line
    assert set(store.peek().claims) == {"run-0"}
    other = FileStore(folder, "fp")
    with other.transaction() as state:
        assert set(state.claims) == {"run-0"}
        claim_next(state, "w1", now=0, lease_seconds=LEASE)
    assert (folder / "scheduler.journal").read_bytes().endswith(b"\n")
    assert set(store.read().claims) == set(FileStore(folder, "fp").read().claims) == {
        "run-0", "run-1"}


def test_a_crash_between_the_snapshot_and_the_new_journal_loses_nothing(tmp_path):
    folder = tmp_path / ".rapidfire"
    store = _store(folder)
    with store.transaction() as state:
        claim_next(state, "w0", now=0, lease_seconds=LEASE)
    # The compaction's snapshot is renamed in; the crash comes before the journal's rename.
    doc = store.read().to_json()
    doc["generation"] = json.loads((folder / "scheduler.json").read_text())["generation"] + 1
    (folder / "scheduler.json").write_text(json.dumps(doc))
    for state in (FileStore(folder, "fp").read(), FileStore(folder, "fp").peek()):
        assert set(state.claims) == {"run-0"}
    with FileStore(folder, "fp").transaction() as state:  # and it carries on from there
        claim_next(state, "w1", now=0, lease_seconds=LEASE)
    assert set(FileStore(folder, "fp").peek().claims) == {"run-0", "run-1"}


def test_a_body_that_raises_journals_nothing_and_its_change_is_forgotten(tmp_path):
    folder = tmp_path / ".rapidfire"
    store = _store(folder)
    journal = (folder / "scheduler.journal").read_bytes()
    with pytest.raises(RuntimeError), store.transaction() as state:
        claim_next(state, "w0", now=0, lease_seconds=LEASE)
        state.runs["run-1"].chunks_done = 2
        raise RuntimeError("worker crashed mid-transaction")
    assert (folder / "scheduler.journal").read_bytes() == journal
    state = store.read()
    assert not state.claims and state.runs["run-1"].chunks_done == 0


def test_a_durable_transaction_syncs_the_journal_and_a_claim_does_not(tmp_path, monkeypatch):
    store = _store(tmp_path / ".rapidfire")
    synced = []
    real = os.fsync
    monkeypatch.setattr(state_file.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    with store.transaction(durable=False) as state:
        claim_next(state, "w0", now=0, lease_seconds=LEASE)
    assert synced == []
    with store.transaction() as state:
        finish_chunk(state, "run-0", "w0", 0)
    assert len(synced) == 1
    with store.transaction() as state:  # nothing changed: nothing to write or sync
        pass
    assert len(synced) == 1


def test_an_edited_journal_line_is_held_to_the_state_files_rules(tmp_path):
    folder = tmp_path / ".rapidfire"
    store = _store(folder)
    line = {"set": {"owner": {"../../etc": "w0"}}}
    with open(folder / "scheduler.journal", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
    with pytest.raises(StoreError, match="edited or damaged"):
        FileStore(folder, "fp").read()
    with pytest.raises(StoreError, match="edited or damaged"), store.transaction():
        pass
    with pytest.raises(StoreError):
        store.peek()


@pytest.mark.parametrize("local", [False, True])
def test_the_journal_is_opened_anew_per_transaction_unless_the_disk_is_local(
        tmp_path, monkeypatch, local):
    """On NFS only an open() revalidates what the client caches of a file (close-to-open
    consistency): a descriptor kept open from an earlier transaction can miss another
    machine's append, so every transaction opens the journal again under the lock. On a local
    filesystem the kept descriptor sees every process's appends, and is kept."""
    monkeypatch.setattr(state_file, "known_local", lambda folder: local)
    store = FileStore(tmp_path, fingerprint="fp")
    other = FileStore(tmp_path, fingerprint="fp", create=False)
    opened = []
    real_open = os.open

    def counting_open(path, flags, *args, **kwargs):  # dir_fd: write_path.py
        if str(path).endswith("scheduler.journal"):
            opened.append(path)
        return real_open(path, flags, *args, **kwargs)

    with store.transaction() as st:
        st.add_run("run-0", 2)
    assert sorted(other.read().runs) == ["run-0"]
    monkeypatch.setattr(os, "open", counting_open)
    for i in range(1, 4):
        with store.transaction() as st:
            st.add_run(f"run-{i}", 2)
        with other.transaction() as st:  # the other process appends in turn
            st.runs[f"run-{i}"].chunks_done = 1
    assert (len(opened) >= 6) != local
    for reader in (store, other, FileStore(tmp_path, fingerprint="fp", create=False)):
        state = reader.read()
        assert sorted(state.runs) == ["run-0", "run-1", "run-2", "run-3"]
        assert [state.runs[f"run-{i}"].chunks_done for i in range(4)] == [0, 1, 1, 1]


def test_a_folder_is_known_local_by_the_mount_that_holds_it(tmp_path, monkeypatch):
    from trl_rapidfire.storage import filesystems

    info = tmp_path / "mountinfo"
    info.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "40 27 0:50 / /mnt/shared rw,relatime shared:1 - nfs4 srv:/export rw\n"
        "41 40 0:51 / /mnt/shared/scratch rw - tmpfs tmpfs rw\n"
        "42 27 0:52 / /mnt/with\\040space rw - xfs /dev/vdb rw\n"
        "43 27 0:53 / /mnt/fuse rw - fuse.sshfs host:/x rw\n")
    monkeypatch.setattr(filesystems, "_MOUNTINFO", str(info))
    local = filesystems.known_local
    assert local("/home/someone/run") and local("/mnt/shared/scratch/x")
    assert local("/mnt/with space/out") and local("/mnt/sharedness")  # not under /mnt/shared
    assert not local("/mnt/shared/out") and not local("/mnt/fuse/out")
    monkeypatch.setattr(filesystems, "_MOUNTINFO", str(tmp_path / "missing"))
    assert not local("/home/someone/run")  # cannot tell: treated as shared

"""The shared state's lock excludes threads, forked children and other processes, and follows
a lock file that was removed."""

from __future__ import annotations

import multiprocessing
import threading
import time

from trl_rapidfire.shared_state.flock import flock_for


def _bump(path, lock_path, times):
    lock = flock_for(lock_path)
    for _ in range(times):
        lock.acquire()
        try:
            value = int(path.read_text() or 0)
            time.sleep(0.001)  # a lost update if anyone else is in here meanwhile
            path.write_text(str(value + 1))
        finally:
            lock.release()


def test_threads_and_forked_processes_are_excluded(tmp_path):
    counter, lock_path = tmp_path / "n", tmp_path / "x.lock"
    counter.write_text("0")
    lock = flock_for(lock_path)
    lock.acquire()  # the parent's thread holds a descriptor when the children fork
    lock.release()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_bump, args=(counter, lock_path, 40)) for _ in range(2)]
    threads = [threading.Thread(target=_bump, args=(counter, lock_path, 40)) for _ in range(2)]
    for worker in (*procs, *threads):
        worker.start()
    _bump(counter, lock_path, 40)
    for worker in (*procs, *threads):
        worker.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs)
    assert int(counter.read_text()) == 5 * 40


def _hold(lock_path, held, go):
    lock = flock_for(lock_path)
    lock.acquire()
    held.set()
    go.wait(30)
    lock.release()


def test_a_held_lock_blocks_a_child_and_is_reentrant(tmp_path):
    lock_path = tmp_path / "x.lock"
    lock = flock_for(lock_path)
    lock.acquire()
    lock.acquire()  # re-entrant in one thread
    lock.release()
    ctx = multiprocessing.get_context("fork")
    held, go = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold, args=(lock_path, held, go))
    child.start()
    assert not held.wait(0.5)  # the parent still holds it once
    lock.release()
    assert held.wait(30)
    go.set()
    child.join(30)
    assert child.exitcode == 0


def test_a_removed_lock_file_is_locked_anew(tmp_path):
    lock_path = tmp_path / "x.lock"
    lock = flock_for(lock_path)
    lock.acquire()
    lock.release()
    lock_path.unlink()  # e.g. the folder was cleaned; this thread still has the old file open
    ctx = multiprocessing.get_context("spawn")
    held, go = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold, args=(lock_path, held, go))
    other.start()
    assert held.wait(60)
    # This thread's old descriptor would lock the removed file at once; it must wait for the
    # other process's lock on the file now at the path.
    threading.Timer(0.5, go.set).start()
    started = time.monotonic()
    lock.acquire()
    waited = time.monotonic() - started
    lock.release()
    other.join(30)
    assert other.exitcode == 0
    assert waited >= 0.4, waited

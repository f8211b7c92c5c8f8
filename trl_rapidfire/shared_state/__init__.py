"""The shared state of every worker: which runs exist, who trains which chunk, what is done.

Owns the run state machine (``runs``), the scheduler's choice (``scheduler``, ``run_queue``),
the state document and its pure decisions (``store``, ``state_schema``, ``state_changes``), and
its files: a snapshot and a journal under a lock (``state_file``, ``flock``).

May import: ``runtime``, ``storage``.
"""

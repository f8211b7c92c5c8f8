"""The shared state of every worker: which runs exist, who trains which chunk, what is done.

Owns the run state machine (``runs``), the scheduler's choice (``scheduler``, ``run_queue``),
the state document and its pure decisions (``store``, ``state_schema``, ``state_changes``), its
files: a snapshot and a journal under a lock (``state_file``, ``flock``), and workers as claims
name them: who a worker is, whether it lives, the claims' lease (``worker_info``).

May import: ``storage`` only (never torch or the training stack: the command line reads it).
"""

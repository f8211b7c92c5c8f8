"""Runtime: this process as a place where many runs take turns.

Owns the wall around process-global state (accelerate's singletons, the launcher's
environment: ``accelerate_state``), this process leaving the launch as a worker (``workers``),
the cooperative switch and the random streams (``switch``), the shared base models and their
adapters (``models``), other libraries' private names in one version-checked file
(``foreign_internals``), and where a run's tensors are: resident, parked in the state cache
(``cache``, ``residency``, ``state_tree``).

May import: ``shared_state`` (who a worker is), ``storage``.
"""

"""Runtime: this process as a place where many runs take turns.

Owns the wall around process-global state (accelerate's singletons, the launcher's
environment: ``accelerate_state``), this process as a worker (``workers``), the cooperative
switch and the random streams (``switch``), the shared base models and their adapters
(``models``), and where a run's tensors are: resident, parked in the state cache (``cache``,
``residency``, ``state_tree``).

May import: ``storage``.
"""

"""The client: what a person runs from another process.

Owns the ``trl-rapidfire`` command (``cli``), the dashboard and the browser's control panel
(``dashboard``, ``panel_app``), ``trl-rapidfire doctor`` (``doctor``), reading a tracking
store's runs without importing MLflow (``tracked_runs``, ``experiments``) and sending ops
(``send``).

May import: every other layer (the top one).
"""

from .send import (
    Delivery,
    check_op,
    clone,
    delete,
    deliver_op,
    experiment_runs,
    find_experiment,
    resume,
    send_op,
    stop,
)

# The public client API (``send``'s names, less what the CLI alone uses).
__all__ = ["Delivery", "check_op", "clone", "delete", "deliver_op", "experiment_runs",
           "find_experiment", "resume", "send_op", "stop"]

"""Tracking: each run as an MLflow run, and run tags as the op channel.

Owns the face the engine sees (``tracker``: the experiment's runs, queued points and tags),
the one thread that talks to MLflow (``background``), ops set as run tags and their answers
(``op_channel``), the names given to MLflow (``tags``) and the MLflow store's schema, made once
and a half-made one repaired (``mlflow_store``).

May import: ``config``, ``shared_state``, ``runtime``, ``storage``.
"""

"""Tracking: each run as an MLflow run, and run tags as the op channel.

Owns the face the engine sees (``tracker``: the experiment's runs, queued points and tags),
the one thread that talks to MLflow (``background``), the store opened on that thread
(``link``: MLflow's import, the schema, the experiment and its parent run), runs found or
created there in batches (``registration``), each run's queued points, tags and MLflow
status written per run (``writes``), a tracking URI checked without MLflow
(``store_uri``), ops set as run tags and their answers (``op_channel``), the names given to
MLflow (``tags``) and the MLflow store's schema, made once and a half-made one repaired
(``mlflow_store``).

May import: ``config``, ``shared_state``, ``runtime``, ``storage``.
"""

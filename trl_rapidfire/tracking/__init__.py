"""Tracking: each run as an MLflow run, and run tags as the op channel.

Owns the writer and poller thread (``tracker``), the names given to MLflow (``tags``) and the
MLflow store's schema, made once and a half-made one repaired (``mlflow_store``).

May import: ``config``, ``shared_state``, ``runtime``, ``storage``.
"""

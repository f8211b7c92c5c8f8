"""Optuna: its samplers propose runs (``OptunaSearch``), its pruners stop them
(``OptunaPruner``); the study lives in the experiment's folder under a file lock.

May import: any layer below ``engine``.
"""

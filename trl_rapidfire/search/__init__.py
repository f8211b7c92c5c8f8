"""Search: a config with knobs -> the runs to train.

Owns grid and random search, adaptive searches that propose runs while training
(``searches``), and what identifies an experiment (``fingerprint``).

May import: ``config``, ``shared_state``, ``runtime``, ``storage``.
"""

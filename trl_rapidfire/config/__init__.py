"""Configuration: what a user writes, checked before anything trains.

Owns the knob language (``knobs``: ``List``, ``Range``), the RF configs
(``RFSFTConfig``/``RFDPOConfig``/``RFGRPOConfig``), FSDP configs, the checkpoint cadence, the
checks TRL makes late (``preflight``, ``dataset_checks``) and options TRL removed.

May import: ``runtime``, ``storage``.
"""

"""The RF trainers: drop-in subclasses of TRL's trainers that train many configs at once
(:mod:`.sft`, :mod:`.dpo`, :mod:`.grpo`, on the facade :mod:`.base`), the composition root
that makes and wires an experiment's parts (:mod:`.assembly`), the composition of a run
(:mod:`.run_builder`), and the command-line commands that load TRL (:mod:`.commands`).

May import every layer below it. Nothing is imported here: the command line loads
:mod:`.commands` without TRL's stack (seconds), and ``from trl_rapidfire import RFSFTTrainer``
loads its own module.
"""

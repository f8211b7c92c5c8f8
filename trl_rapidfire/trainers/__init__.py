"""The RF trainers: drop-in subclasses of TRL's trainers that train many configs at once, one
file a kind (:mod:`.sft`, :mod:`.dpo`, :mod:`.grpo`, :mod:`.kto`, :mod:`.reward`,
:mod:`.rloo`, :mod:`.distillation`) on the facade :mod:`.base`, with what kinds share written
once: their constructors' work (:mod:`.construction`), one prepared dataset for runs that would
prepare it alike (:mod:`.prepared_data`), generation inside the training loop
(:mod:`.generation_loop`), second models loaded once (:mod:`.resident_models`). The
composition root that makes and wires an experiment's parts (:mod:`.assembly`), the
composition of a run (:mod:`.run_builder`, :mod:`.run_agreement`, :mod:`.run_trainer`,
:mod:`.boundary_checkpoints`), and the command-line commands that load TRL
(:mod:`.commands`).

May import every layer below it. Nothing is imported here: the command line loads
:mod:`.commands` without TRL's stack (seconds), and ``from trl_rapidfire import RFSFTTrainer``
loads its own module.
"""

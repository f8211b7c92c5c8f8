"""Storage: the experiment's files on disk, and nothing about what they mean to training.

Owns ``output_dir``'s layout and run names, paths checked to stay inside it, files opened
without following links and read within a bound, folders that appear whole or not at all,
boundary checkpoints (atomic, latest, pruning), append-only CSV logs (``schedule.csv``,
``ops.csv``), bounded parsing of text from outside, and disk faults.

May import: nothing else of the package (the bottom layer).
"""

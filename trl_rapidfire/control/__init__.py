"""Control: what may be done to a run mid-flight, by a person or a policy.

Owns the op language (``ops``: parsing, overrides, the op log), what text from outside may
change (``trust``), the automatic policies (``policies``) and an untracked experiment's op
inbox and liveness (``folder_control``). Sending ops from another process is the client's.

May import: ``tracking``, ``search``, ``config``, ``shared_state``, ``runtime``, ``storage``.
"""

"""Reports: what a person reads about an experiment.

Owns results and the best run (``results``), the progress bar and runs table (``progress``),
the notebook's control panel (``notebook_panel``, ``notebook_form``), plain-text tables
(``display``), an experiment read back from its folder (``experiment_data``), and the report
with its figures (``report``, ``plots``, ``plot_legend``, ``plot_style``, ``op_marks``,
``curve_overlap``).

May import: ``control``, ``tracking``, ``search``, ``config``, ``shared_state``, ``runtime``,
``storage``.
"""

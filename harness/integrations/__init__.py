"""Integrations: the ways in. They depend on every room; no room depends on them.

``cli`` (the ``cutbench`` command, which adds the features' own commands,
``cutbench matrix`` and ``cutbench hunt``, from their homes; ``console`` is what
every command shows on the terminal), ``pytest_plugin`` (entry point
``pytest11``), ``gate`` (a scenario judged against a threshold, used by
the plugin and by any CI script) and ``runs`` (a stored run for code:
``cutbench.open_run``, reached through ``cutbench.api``).
"""

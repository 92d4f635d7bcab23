"""The runner: the interpreter that owns processes and time.

``trial`` runs one trial end to end in a ``Session`` (receiver, work
directory, backends); ``run`` turns a scenario into trials and stores the
run; ``adaptive`` hosts the drivers that decide trial by trial (the
Hypothesis search, stop-at-first-invalid); ``replay`` reruns a stored trial.
"""

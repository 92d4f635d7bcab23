"""The runner: the interpreter that owns processes and time.

``trial`` runs one trial end to end in a ``Session`` (receiver, work
directory), which holds what the trials share (``shared``: image discards,
per-thread clients and backends, references, the support matrix); ``run``
turns a scenario into trials and stores the run; ``executors`` holds the ways
of running them (serial, worker threads, Ray, an adaptive driver), chosen
once per run; ``adaptive`` hosts the drivers that decide trial by trial (the
Hypothesis search, stop-at-first-invalid); ``replay`` reruns a stored trial;
``catalog`` lists what a run can be made of here (``cutbench list``).
"""

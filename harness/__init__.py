"""The benchmark, one package per role (Jepsen's split), lowest first.

Each room may import the rooms above it in this list and the ground floor
(``cutbench.errors``, ``procs``, ``files``, ``validate``, ``registry``),
never one below it; ``tests/unit/test_layout.py`` enforces the order
(``docs/DESIGN.md``, "Layout and import rule"):

1. ``model``: the data every role exchanges: cut plans, the scenario, the
   trial's spec, record and verdict types, the timeline.
2. ``checker``: the oracle (findings over a trial's data) and statistics; pure.
3. ``generator``: plan sources (exhaustive, random, Hypothesis) and sweeps;
   pure: they return plans and never write.
4. ``store``: the run directory (the only writer of results), table layouts
   and re-analysis of a stored run.
5. ``environment``: what this machine has: probes, CRIU provisioning, doctor.
6. ``nemesis``: the checkpointer protocol, the backend registry, the cut
   pipeline and every backend.
7. ``observer``: what the outside world sees of a program that knows nothing
   of cutbench (its pipes, a file, a socket, a server's clients).
8. ``reports``: summary, HTML report, plots, comparisons of two runs.
9. ``runner``: trial and run execution, adaptive drivers, replay.
10. ``integrations``: the command line, the pytest plugin and the CI gate.
"""

if __name__ != "cutbench.harness":  # e.g. ``import harness`` with a checkout's root on sys.path
    raise ImportError(f"{__name__!r} is cutbench's harness folder under another name: import cutbench.harness "
                      "(a module imported under two names is two modules, and its classes are not themselves)")

"""The benchmark, one package per role (Jepsen's split), lowest first.

Each room may import the rooms above it in this list and the ground floor
(``cutbench.errors``, ``procs``, ``files``, ``validate``, ``registry``,
``interrupts``, ``storage``),
never one below it; ``tests/unit/test_layout.py`` enforces the order
(``docs/DESIGN.md``, "Layout and import rule"):

1. ``model``: the data every role exchanges: cut plans, the scenario, the
   trial's spec, record and verdict types, the timeline.
2. ``checker``: the oracle (findings over a trial's data) and statistics; pure.
3. ``generator``: plan sources (exhaustive, random, Hypothesis) and sweeps;
   pure: they return plans and never write.
4. ``store``: the run directory (the only writer of results), table layouts
   and re-analysis of a stored run.
5. ``provision``: the tools cutbench drives, found, installed and started:
   CRIU and its CUDA plugin, the container engines, Slurm.
6. ``environment``: the facts of this machine (GPU probes, the environment
   record, doctor) and what runs leave on it.
7. ``nemesis``: the checkpointer protocol, the backend registry, the cut
   pipeline, every backend, and what their processes spend (``cpu_account``).
8. ``observer``: what the outside world sees of a program that knows nothing
   of cutbench (its pipes, a file, a socket, a server's clients).
9. ``reports``: summary, HTML report, plots, comparisons of two runs.
10. ``runner``: trial and run execution, adaptive drivers, replay.
11. ``integrations``: the command line, the pytest plugin and the CI gate.

A feature that spans rooms keeps its files together in a folder of its own, each
module named after the room it ranks with: ``hunt`` (``cutbench hunt``, a tool's
lifecycle searched) and ``matrix`` (``cutbench matrix``, the CUDA support
matrix). Each folder's ``__init__`` is its map.
"""

if __name__ != "cutbench.harness":  # e.g. ``import harness`` with a checkout's root on sys.path
    raise ImportError(f"{__name__!r} is cutbench's harness folder under another name: import cutbench.harness "
                      "(a module imported under two names is two modules, and its classes are not themselves)")

"""The store: the run directory, its table layouts, re-analysis and packing of a stored run.

``rundir``'s ``RunDir`` is the only writer of results; ``tables`` says what one
row of each table holds; ``analysis``'s ``reanalyze`` re-judges a stored run with
the current checker; ``pack``'s ``pack`` moves a run's per-trial records into one
``trials.tar.xz`` (``archive``: the format), which ``RunDir`` reads as it
reads the files. A hunt's directory (``hunt.json``, ``FINDINGS.md``, ``repro/``) is written by its
feature's store, :mod:`cutbench.harness.hunt.store`; nothing else in cutbench writes under ``results/``.
"""

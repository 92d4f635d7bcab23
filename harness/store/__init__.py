"""The store: the run directory, its table layouts, and re-analysis of a stored run.

``rundir.RunDir`` is the only writer of results; ``tables`` says what one
row of each table holds; ``analysis.reanalyze`` re-judges a stored run with
the current checker. Nothing else in cutbench writes under ``results/``.
"""

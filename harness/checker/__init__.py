"""The checker: a trial's recorded data in, a verdict out; pure.

``oracle`` holds the finders (one function per kind of invalid recovery)
composed by ``oracle.judge`` into one verdict; ``stats`` holds the small
statistics the summaries use (the hunt's and the matrix's checkers live with
their features: :mod:`cutbench.harness.hunt`, :mod:`cutbench.harness.matrix`). Nothing here runs a process, reads a clock or
writes a file, so a stored run is re-judged and unit-tested without a GPU.
"""

"""Reports: what a person reads about a run; pure renderers over stored tables.

``summary`` (rates, the run's verdict, ``summary.md``), ``html`` (the
self-contained ``report.html``), ``plots`` (PNG bytes), ``compare`` (two
runs side by side), ``explain`` (a failing trial in plain words),
and ``criteria`` (the six criteria for a checkpoint tool, measured); the support matrix
for people is :mod:`cutbench.harness.matrix.reports`'s. They return text and bytes; ``html.write_all`` hands
them to the store's ``RunDir``, the only writer.
"""

"""Reports: what a person reads about a run; pure renderers over stored tables.

``summary`` (rates, the run's verdict, ``summary.md``), ``html`` (the
self-contained ``report.html``), ``plots`` (PNG bytes) and ``compare`` (two
runs side by side). They return text and bytes; ``html.write_all`` hands
them to the store's ``RunDir``, the only writer.
"""

"""The checker: a trial's recorded data in, a verdict out; pure.

``oracle`` holds the finders (one function per kind of invalid recovery)
composed by ``oracle.judge`` into one verdict; ``stats`` holds the small
statistics the summaries use; ``lifecycle`` the hunt's invariants (a
step's observation against the documented answer); ``matrix`` turns each
trial of a probe through a tool into a cell of the support matrix. Nothing here runs a process, reads a clock or
writes a file, so a stored run is re-judged and unit-tested without a GPU.
"""

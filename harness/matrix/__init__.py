"""The support matrix (``cutbench matrix``): every probe row through every tool, measured cell by cell.

A feature kept together: each module is named after the room it belongs to and obeys that room's place in the
import order (``harness/__init__``), so the matrix's edges are this folder's. Lowest first:

- ``checker``: a trial of a probe through a tool turned into a cell (identical, refused, failed, hung, wrong,
  unknown, not measured), pure;
- ``generator``: the matrix's plan: which probe rows through which tools under which faults;
- ``reports``: the matrix for people: ``matrix.md``, two matrices compared, the report's section;
- ``runner``: a matrix run end to end, stored as ``matrix.parquet`` through the run directory;
- ``integrations``: the ``cutbench matrix`` command.

The probes are workloads (:mod:`cutbench.workloads.probes`); reading a stored matrix back is the store's
(``read_matrix``).
"""

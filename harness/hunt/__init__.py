"""The hunt (``cutbench hunt``): one tool's lifecycle searched for deviations from its documentation.

A feature kept together: each module is named after the room it belongs to and obeys that room's place in the
import order (``harness/__init__``), so the hunt's edges are this folder's. Lowest first:

- ``model``: the documented lifecycle of each tool: states, steps, the documented answer to each with its
  source, and which deviations a public report already names;
- ``checker``: a step's observation against the documented answer (pure);
- ``generator``: the lifecycle state machine the Hypothesis search drives, and the random walk it is measured
  against (it reaches the probe only through a session it is handed);
- ``store``: a hunt's directory: ``hunt.json``, ``FINDINGS.md``, ``repro/`` (and the deviations of every
  hunt under a folder, for the matrix's section);
- ``nemesis``: live sessions on a tool through the kit (:mod:`cutbench.harness.nemesis.lifecycle_kit`,
  files with no cutbench in them), the reproducers written from the kit, and reproducers run on their own;
- ``runner``: a hunt end to end: search, random walk, shrinking, reproducers, ``hunt.json`` and
  ``FINDINGS.md``;
- ``integrations``: the ``cutbench hunt`` command.

The kit stays in the nemesis: the matrix, the container backends and every reproducer share it.
"""

"""The public Python API for runs: a scenario run, a stored run opened, the support matrix measured.

For code that runs cutbench and reads what it found (``docs/python-api.md``):
``run`` (a scenario, as ``cutbench run``), ``matrix`` (the support matrix, as
``cutbench matrix``), ``open_run`` (a stored run) and the ``Run`` they all
return, with what its methods return (``Comparison``, ``Reanalysis``,
``RunVerdict``); ``load_scenario`` and ``Scenario`` (a scenario file, checked);
``read_matrix`` (a stored matrix table); ``OUTCOMES`` and ``FINDING_KINDS``
(the words a trial's verdict is written in); ``CPU_ROLES``, ``CPU_COLUMNS``
and ``HARNESS_STAGES`` (the words of a run's timeline: its CPU columns, and the
stages that are the harness running the workload, no tool's); ``judge`` (the
oracle: a trial's ``Verdict`` from its record, the receiver's rows and the
workload's reference, for effects recorded anywhere) and ``Observer`` (a
program watched as a run watches it: what its scenario's effects rule sees;
its ``start`` returns a :class:`cutbench.backend.Child`, a tool's author's
name); the errors a run raises.

The two other audiences have their own door: a workload's author imports from
:mod:`cutbench.workload`, a checkpoint tool's author from :mod:`cutbench.backend`.
Every error is in :mod:`cutbench.errors`. This module loads pandas;
``cutbench.run``, ``cutbench.open_run`` and ``cutbench.Run`` reach it on first
use, so ``import cutbench`` does not.

This module is the package's front door for code, as ``cutbench.__main__`` is
for the shell: it may import every room, and nothing inside the package
imports it. Its public names are exactly what it imports (ruff's unused-import
check is off for the doors; ``tests/unit/test_layout.py`` counts them).
"""

from cutbench.errors import CutbenchError, InvalidArgument, Unavailable
from cutbench.harness.checker.oracle import FINDING_KINDS, OUTCOMES, judge
from cutbench.harness.integrations.runs import Comparison, Reanalysis, Run, RunVerdict, matrix, open_run, run
from cutbench.harness.model.scenario import Scenario, load_scenario
from cutbench.harness.model.timeline import CPU_COLUMNS, CPU_ROLES, HARNESS_STAGES
from cutbench.harness.model.trial import Verdict
from cutbench.harness.observer.streams import Observer
from cutbench.harness.store.rundir import read_matrix

"""The generator: where cuts go. Scenario and arm in, plans out; writes nothing.

``scheduler`` holds the static plan sources (exhaustive, random),
``search`` the Hypothesis strategies and the per-arm search loop (it calls
back into a ``run_plan`` function the runner supplies), ``sweep`` the
cartesian expansion of a scenario over axes; ``matrix`` the support
matrix's plan (which probe rows through which tools under which faults); ``hunt`` the lifecycle state
machine of ``cutbench hunt`` and the random walk it is measured against
(it reaches the probe only through a session the runner hands it).
"""

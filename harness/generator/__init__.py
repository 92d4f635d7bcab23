"""The generator: where cuts go. Scenario and arm in, plans out; writes nothing.

``scheduler`` holds the static plan sources (exhaustive, random),
``search`` the Hypothesis strategies and the per-arm search loop (it calls
back into a ``run_plan`` function the runner supplies), ``sweep`` the
cartesian expansion of a scenario over axes. The support matrix's plan and the hunt's
state machine live with their features (:mod:`cutbench.harness.matrix`, :mod:`cutbench.harness.hunt`).
"""

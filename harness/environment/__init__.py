"""The environment: the facts of this machine, and what runs leave on it.

``gpu_probe`` and ``gpu_mem`` ask the GPU and driver; ``record`` is the environment stored with every run (it
asks :mod:`cutbench.harness.provision` which CRIU and engines are here); ``doctor`` turns all of it into a list
of checks with fixes. ``leftovers`` writes each run's claim on the machine and sweeps what a killed harness left.
Every probe answers on a machine without a GPU instead of failing. What installs or starts a tool is
:mod:`cutbench.harness.provision`'s; what a trial's processes spend is measured by
:mod:`cutbench.harness.nemesis.cpu_account`.
"""

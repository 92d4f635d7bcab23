"""The environment: what this machine offers, how to provision what it lacks, and what a run leaves on it.

Provisioning and probes: ``criu`` (a package) finds, checks and installs CRIU (its ``__init__`` maps the modules);
``engines`` finds the container engines and starts and stops the project's own ``dockerd``; ``gpu_probe``
and ``gpu_mem`` ask the GPU and driver; ``doctor`` turns all of it into a list of checks with fixes.
Records: ``record`` is the environment stored with every run; ``cpu_account`` reads what a trial's
processes spend, per stage (their CPU seconds, faults and bytes written, from ``/proc`` and ``wait4``).
The machine between runs: ``leftovers`` writes each run's claim and sweeps what a killed harness left.
Every probe answers on a machine without a GPU instead of failing.
"""

"""The environment: what this machine offers, and how to provision what it lacks.

``criu/`` finds, checks and installs CRIU (its ``__init__`` maps the modules); ``gpu_probe`` and
``gpu_mem`` ask the GPU and driver; ``doctor`` turns all of it into a list of
checks with fixes; ``record`` is the environment stored with every run;
``cpu_account`` reads what a trial's processes spend, per stage (their CPU
seconds, faults and bytes written, from ``/proc`` and ``wait4``).
Every probe answers on a machine without a GPU instead of failing.
"""

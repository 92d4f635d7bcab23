"""Deterministic workloads with ground truth, and the small runtime they import (``docs/workload-api.md``).

``api`` holds the protocol and the registry, ``runtime`` and ``launch`` the
workload process, ``control`` the cut points' shared control file, ``xp`` the
array backends, ``common`` what the built-in workloads share.
"""

if __name__ != "cutbench.workloads":  # e.g. ``import workloads`` with a checkout's root on sys.path
    raise ImportError(f"{__name__!r} is cutbench's workloads folder under another name: import cutbench.workloads "
                      "(a module imported under two names is two modules, and its classes are not themselves)")

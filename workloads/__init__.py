"""Deterministic workloads with ground truth, and the small runtime they import (``docs/workload-api.md``).

``api`` holds the protocol and the registry, ``runtime`` and ``launch`` the
workload process, ``control`` the cut points' shared control file, ``xp`` the
array backends, ``common`` what the built-in workloads share, ``adapters``
the workload's side of the semantic adapters.

The built-in workloads, one module each: ``counter`` (the smallest that can
be wrong in every interesting way), ``training`` and ``torch_training`` (its loader in ``data_loader``),
``inference_worker``, ``md_simulation``, ``request_service`` and
``adapter_faults`` (its adapters on, one misbehaving), ``echo_peer``,
``ranks`` (its TCP ring in ``ring``) and ``nccl_ranks`` (several processes), ``allocator_churn``,
``stream_callbacks``, ``persistent_kernel``; ``variants`` holds the
known-bad variants and their correct twins (the sensitivity suite),
``probes`` the support matrix's probes, and ``program`` a program that
knows nothing of cutbench (``docs/programs.md``).
"""

if __name__ != "cutbench.workloads":  # e.g. ``import workloads`` with a checkout's root on sys.path
    raise ImportError(f"{__name__!r} is cutbench's workloads folder under another name: import cutbench.workloads "
                      "(a module imported under two names is two modules, and its classes are not themselves)")

"""The built-in checkpoint backends, one module each, and the pieces several of them share.

A backend module holds the class (or classes) implementing
:class:`~cutbench.harness.nemesis.base.Checkpointer`, each with its
``capabilities`` declared on the class: ``criu`` (CRIU alone), ``cuda``
(the driver's checkpoint calls in place, and the CUDA stages every CUDA
backend runs), ``cuda_criu`` (``cuda+criu``, the one with a split window),
``criu_cuda_plugin`` (CRIU driving its own CUDA plugin), ``docker`` and
``podman``, ``slurm`` (a program as a batch job, preempted by Slurm), ``app``
(the application's own checkpoints, the baseline) and ``restart`` (a requeue
from the beginning); ``cuda_checkpoint_util`` holds two
backends, ``cuda-checkpoint`` and ``cuda-checkpoint+criu``. Beside them sit
modules no backend name points at: ``containers`` (what ``docker`` and
``podman`` share), ``cuda_driver`` (the CUDA driver's checkpoint calls and
their error table) and ``cuda_discovery`` (whether that driver API is usable
here, and which processes a CUDA cut takes).

Nothing here registers or imports a backend: built-ins are named in
:data:`cutbench.registry.CHECKPOINTERS` as ``"module:Class"`` paths (the one
list of them), third parties in the entry-point group
``cutbench.checkpointers`` of their own ``pyproject.toml``, and a backend's
module is imported only when it is asked for, so a machine without the GPU
or container libraries never loads them. Keep this file free of imports for
that reason.
"""

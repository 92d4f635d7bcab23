"""Checkpoint backends behind one protocol (:class:`~cutbench.harness.nemesis.base.Checkpointer`).

``get(name)`` returns a backend instance; availability is asked separately
(``unavailable_reason()``) so a sweep can report or skip what this machine
cannot run.
"""

from __future__ import annotations

import importlib

from cutbench.harness.nemesis.base import Checkpointer, CutContext
from cutbench.errors import InvalidArgument, Unavailable

# name -> "module:Class"; modules are imported lazily so that a CPU machine
# never imports GPU bindings it does not have.
REGISTRY: dict[str, str] = {
    "criu": "cutbench.harness.nemesis.backends.criu:CriuCheckpointer",
    "cuda": "cutbench.harness.nemesis.backends.cuda:CudaCheckpointer",
    "cuda-checkpoint": "cutbench.harness.nemesis.backends.cuda_checkpoint_util:CudaCheckpointUtilCheckpointer",
    "cuda+criu": "cutbench.harness.nemesis.backends.cuda_criu:CudaCriuCheckpointer",
    "criu-cuda-plugin": "cutbench.harness.nemesis.backends.criu_cuda_plugin:CriuCudaPluginCheckpointer",
    "app": "cutbench.harness.nemesis.backends.app:AppCheckpointer",
}


def get(name: str) -> Checkpointer:
    """A fresh instance of backend ``name``.

    Raises :class:`InvalidArgument` for a name no build knows and
    :class:`Unavailable` for a known backend this build does not provide.
    """
    from cutbench.harness.model.scenario import BACKENDS

    if name not in REGISTRY:
        if name in BACKENDS:
            raise Unavailable(f"backend {name!r} is not available in this build")
        raise InvalidArgument(f"backend {name!r}: allowed {', '.join(BACKENDS)}")
    module_name, _, attr = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module_name), attr)()


__all__ = ["Checkpointer", "CutContext", "REGISTRY", "get"]

"""Checkpoint backends behind one protocol (:class:`~harness.checkpointers.base.Checkpointer`).

``get(name)`` returns a backend instance; availability is asked separately
(``unavailable_reason()``) so a sweep can report or skip what this machine
cannot run.
"""

from __future__ import annotations

import importlib

from harness.checkpointers.base import Checkpointer, CutContext
from harness.errors import InvalidArgument, Unavailable

# name -> "module:Class"; modules are imported lazily so that a CPU machine
# never imports GPU bindings it does not have.
REGISTRY: dict[str, str] = {
    "criu": "harness.checkpointers.criu:CriuCheckpointer",
    "cuda": "harness.checkpointers.cuda:CudaCheckpointer",
    "cuda-checkpoint": "harness.checkpointers.cuda_checkpoint_util:CudaCheckpointUtilCheckpointer",
    "cuda+criu": "harness.checkpointers.cuda_criu:CudaCriuCheckpointer",
    "criu-cuda-plugin": "harness.checkpointers.criu_cuda_plugin:CriuCudaPluginCheckpointer",
    "app": "harness.checkpointers.app:AppCheckpointer",
}


def get(name: str) -> Checkpointer:
    """A fresh instance of backend ``name``.

    Raises :class:`InvalidArgument` for a name no build knows and
    :class:`Unavailable` for a known backend this build does not provide.
    """
    from harness.scenario import BACKENDS

    if name not in REGISTRY:
        if name in BACKENDS:
            raise Unavailable(f"backend {name!r} is not available in this build")
        raise InvalidArgument(f"backend {name!r}: allowed {', '.join(BACKENDS)}")
    module_name, _, attr = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module_name), attr)()


__all__ = ["Checkpointer", "CutContext", "REGISTRY", "get"]

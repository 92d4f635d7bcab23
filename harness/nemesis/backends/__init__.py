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

Nothing here imports a backend: :data:`BUILTIN`, below, is the one table of the
built-ins, each named as a ``"module:Class"`` path that
:data:`cutbench.registry.CHECKPOINTERS` reads on first use (third parties
register in the entry-point group ``cutbench.checkpointers`` of their own
``pyproject.toml``), and a backend's module is imported only when it is asked
for, so a machine without the GPU or container libraries never loads them.
Keep this file free of imports for that reason.
"""

# The built-in backends, in the order `cutbench list backends` shows them. Adding one: a module here and one line.
BUILTIN: dict[str, str] = {
    "criu": "cutbench.harness.nemesis.backends.criu:CriuCheckpointer",
    "cuda": "cutbench.harness.nemesis.backends.cuda:CudaCheckpointer",
    "cuda-checkpoint": "cutbench.harness.nemesis.backends.cuda_checkpoint_util:CudaCheckpointUtilCheckpointer",
    "cuda+criu": "cutbench.harness.nemesis.backends.cuda_criu:CudaCriuCheckpointer",
    "cuda-checkpoint+criu": "cutbench.harness.nemesis.backends.cuda_checkpoint_util:CudaCheckpointUtilCriuCheckpointer",
    "restart": "cutbench.harness.nemesis.backends.restart:RestartCheckpointer",
    "criu-cuda-plugin": "cutbench.harness.nemesis.backends.criu_cuda_plugin:CriuCudaPluginCheckpointer",
    "app": "cutbench.harness.nemesis.backends.app:AppCheckpointer",
    "docker": "cutbench.harness.nemesis.backends.docker:DockerCheckpointer",
    "podman": "cutbench.harness.nemesis.backends.podman:PodmanCheckpointer",
    "slurm": "cutbench.harness.nemesis.backends.slurm:SlurmCheckpointer",
}

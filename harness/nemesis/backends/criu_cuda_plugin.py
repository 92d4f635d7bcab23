"""``criu-cuda-plugin``: CRIU driving its own CUDA plugin (``cuda_plugin.so``).

CRIU's CUDA plugin locks and checkpoints the GPU side itself (it calls the
``cuda-checkpoint`` utility) during ``criu dump`` and restores it during
``criu restore``; the harness only adds ``--libdir PLUGIN_DIR``. There is no
split window: the plugin places the CUDA cut itself. Available when
``$CUTBENCH_CRIU_PLUGIN_DIR`` names a directory holding ``cuda_plugin.so``
and ``cuda-checkpoint`` is on PATH (Debian's CRIU package ships no CUDA
plugin; build it from CRIU's ``plugins/cuda``).
"""

from __future__ import annotations

from cutbench.harness.nemesis.backends.criu import CriuCheckpointer
from cutbench.harness.environment.criu_tool import plugin_dir, plugin_unavailable_reason
from cutbench.harness.nemesis.base import Capabilities

class CriuCudaPluginCheckpointer(CriuCheckpointer):
    """CRIU dump/restore with ``--libdir`` pointing at the CUDA plugin."""

    name = "criu-cuda-plugin"
    # CRIU's plugin does the GPU side itself: the harness times only CRIU's stages.
    capabilities = Capabilities(stages=("criu_dump", "criu_restore"), covers=frozenset({"cpu", "ipc", "cuda"}))

    @property
    def extra_args(self) -> tuple[str, ...]:  # type: ignore[override]
        """``--libdir`` with the plugin directory (empty when none is configured)."""
        path = plugin_dir()
        return ("--libdir", str(path)) if path else ()

    def unavailable_reason(self) -> str | None:
        """Unavailable without a plugin directory, the utility, or CRIU itself."""
        return plugin_unavailable_reason() or super().unavailable_reason()

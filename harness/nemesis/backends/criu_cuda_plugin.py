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

import os
import shutil
from pathlib import Path

from cutbench.harness.nemesis.backends.criu import CriuCheckpointer

ENV = "CUTBENCH_CRIU_PLUGIN_DIR"
PLUGIN = "cuda_plugin.so"


def plugin_dir() -> Path | None:
    """The configured plugin directory, if it holds the CUDA plugin."""
    value = os.environ.get(ENV)
    if not value:
        return None
    path = Path(value)
    return path if (path / PLUGIN).is_file() else None


def plugin_unavailable_reason() -> str | None:
    """Why the CUDA plugin cannot be used (with the fix), or None."""
    value = os.environ.get(ENV)
    if not value:
        return f"no CRIU CUDA plugin configured: set {ENV} to a directory holding {PLUGIN} (built from CRIU's plugins/cuda)"
    if plugin_dir() is None:
        return f"{ENV}={value} holds no {PLUGIN}"
    if shutil.which("cuda-checkpoint") is None:
        return "the CRIU CUDA plugin needs the cuda-checkpoint utility on PATH"
    return None


class CriuCudaPluginCheckpointer(CriuCheckpointer):
    """CRIU dump/restore with ``--libdir`` pointing at the CUDA plugin."""

    name = "criu-cuda-plugin"
    covers = frozenset({"cpu", "ipc", "cuda"})

    @property
    def extra_args(self) -> tuple[str, ...]:  # type: ignore[override]
        """``--libdir`` with the plugin directory (empty when none is configured)."""
        path = plugin_dir()
        return ("--libdir", str(path)) if path else ()

    def unavailable_reason(self) -> str | None:
        """Unavailable without a plugin directory, the utility, or CRIU itself."""
        return plugin_unavailable_reason() or super().unavailable_reason()

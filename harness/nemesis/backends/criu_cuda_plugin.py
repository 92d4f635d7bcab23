"""``criu-cuda-plugin``: CRIU driving its own CUDA plugin (``cuda_plugin.so``).

CRIU's CUDA plugin locks and checkpoints the GPU side itself (it calls the
``cuda-checkpoint`` utility) during ``criu dump`` and restores it during
``criu restore``; the harness only adds ``--libdir PLUGIN_DIR``. This is
CRIUgpu's design: CRIU's own hooks place the CUDA cut, so there is no split
window. Debian's CRIU package ships no CUDA plugin: ``cutbench criu install
--with-cuda-plugin`` builds it from the same CRIU release's source into
``PREFIX/lib/criu``, where the backend finds it; ``$CUTBENCH_CRIU_PLUGIN_DIR``,
when set, names another directory holding ``cuda_plugin.so`` and wins.
Available when the plugin is found and ``cuda-checkpoint`` is on PATH.
"""

from __future__ import annotations

from cutbench.harness.nemesis.backends.criu import CriuCheckpointer
from cutbench.harness.provision.criu.plugin import plugin_dir, plugin_unavailable_reason
from cutbench.harness.nemesis.base import Capabilities

class CriuCudaPluginCheckpointer(CriuCheckpointer):
    """CRIU dump/restore with ``--libdir`` pointing at the CUDA plugin."""

    name = "criu-cuda-plugin"
    # CRIU's plugin does the GPU side itself: the harness times only CRIU's stages.
    capabilities = Capabilities(stages=("criu_dump", "criu_restore"), covers=frozenset({"cpu", "ipc", "cuda"}),
                                tools=frozenset({"criu"}))
    # Measured on an H100 (driver 580, CRIU 4.2.1): the training script held at its calls 247 and 104 was refused
    # both times ("cuda_plugin: Unable to read output of cuda-checkpoint: Interrupted system call"), after its 28th
    # and 10th effects valid both times. The plugin takes the CUDA lock inside CRIU's dump, and a held program's
    # tree is stopped before CRIU may seize it, CUDA threads included; cuda+criu and cuda-checkpoint+criu lock it
    # first, with those threads running.
    held_calls = ("its plugin takes the CUDA lock inside CRIU's dump, after the program held at its call has been "
                  "stopped whole for CRIU to seize it, CUDA threads included (on an H100 both such cuts were refused: "
                  "'Unable to read output of cuda-checkpoint'); cut it at its system calls under cuda+criu or "
                  "cuda-checkpoint+criu, which lock first, or under criu-cuda-plugin at effects (plan.phases = "
                  "[\"effect\"])")

    @property
    def extra_args(self) -> tuple[str, ...]:  # type: ignore[override]
        """Return ``--libdir`` with the plugin directory (empty when none is found)."""
        path = plugin_dir()
        return ("--libdir", str(path)) if path else ()

    def unavailable_reason(self) -> str | None:
        """Unavailable without the plugin (the reason names `cutbench criu install --with-cuda-plugin`), the utility, or CRIU."""
        return plugin_unavailable_reason() or super().unavailable_reason()

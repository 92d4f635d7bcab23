"""Finding CRIU's CUDA plugin (the ``criu-cuda-plugin`` backend's ``--libdir``), and saying why it is not there.

CRIU's plugins/cuda is CRIUgpu's design: CRIU itself drives NVIDIA's
cuda-checkpoint utility from plugin hooks (lock before the freeze, checkpoint
after it, restore and unlock after the restore). Debian builds CRIU without
it, so ``plugin_build`` builds it from the upstream source of the installed
release into ``PREFIX/lib/criu``.

Owns the plugin's names (file, record, directory, environment variable) and
the lookup: ``$CUTBENCH_CRIU_PLUGIN_DIR`` first, else the prefix. Must not
build, download or write anything (that is ``plugin_build``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from cutbench.harness.provision.criu.locate import prefix_or_default

PLUGIN_ENV = "CUTBENCH_CRIU_PLUGIN_DIR"
PLUGIN = "cuda_plugin.so"
PLUGIN_SUBDIR = Path("lib") / "criu"
# Beside the plugin, never named *.so: CRIU loads every *.so in its --libdir.
PLUGIN_RECORD = "cuda_plugin.json"
PLUGIN_FIX = "run `cutbench criu install --with-cuda-plugin` (builds cuda_plugin.so from CRIU's own source)"


def installed_plugin_dir(prefix: Path | None = None) -> Path:
    """Where ``cutbench criu install --with-cuda-plugin`` puts the plugin: ``PREFIX/lib/criu``."""
    return prefix_or_default(prefix) / PLUGIN_SUBDIR


def plugin_dir(prefix: Path | None = None) -> Path | None:
    """The directory holding the CUDA plugin, for CRIU's ``--libdir``; None when there is none.

    ``$CUTBENCH_CRIU_PLUGIN_DIR`` wins when set (None if it holds no plugin);
    else the one ``plugin_build.install_cuda_plugin`` put under the prefix.
    """
    value = os.environ.get(PLUGIN_ENV)
    path = Path(value) if value else installed_plugin_dir(prefix)
    return path if (path / PLUGIN).is_file() else None


def plugin_record(directory: Path) -> dict:
    """What ``plugin_build.install_cuda_plugin`` recorded about the plugin in ``directory`` ({} if nothing)."""
    try:
        return json.loads((Path(directory) / PLUGIN_RECORD).read_text())
    except (OSError, ValueError):
        return {}


def plugin_missing(prefix: Path | None = None) -> tuple[str, str] | None:
    """Why no CUDA plugin is found, and the fix, as ``(problem, fix)``; None once :func:`plugin_dir` finds one."""
    value = os.environ.get(PLUGIN_ENV)
    if plugin_dir(prefix) is not None:
        return None
    if value:
        return f"{PLUGIN_ENV}={value} holds no {PLUGIN}", f"point it at a directory holding {PLUGIN}, or unset it and {PLUGIN_FIX}"
    return (f"no CRIU CUDA plugin: {installed_plugin_dir(prefix) / PLUGIN} is not built and {PLUGIN_ENV} is not set",
            f"{PLUGIN_FIX}, or set {PLUGIN_ENV} to a directory holding {PLUGIN}")


def plugin_unavailable_reason(prefix: Path | None = None) -> str | None:
    """Why the CUDA plugin cannot be used, with the fix; None when it can."""
    missing = plugin_missing(prefix)
    if missing:
        return f"{missing[0]}. Fix: {missing[1]}"
    found = plugin_dir(prefix)
    assert found is not None  # plugin_missing found it
    if shutil.which("cuda-checkpoint") is None:
        return f"the CRIU CUDA plugin ({found / PLUGIN}) needs NVIDIA's cuda-checkpoint utility on PATH"
    return None

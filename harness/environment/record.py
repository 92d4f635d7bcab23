"""The environment a run executed in: recorded in ``run.toml`` so results can be compared."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from cutbench.errors import Unavailable

PACKAGES = ("numpy", "pandas", "pyarrow", "hypothesis", "cupy-cuda13x", "cupy-cuda12x", "cuda-python", "cuda-bindings", "nvidia-ml-py", "psycopg")


def cutbench_version() -> str:
    """The installed cutbench version (``0+unknown`` when run from an uninstalled tree)."""
    try:
        return metadata.version("cutbench")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def code_digest() -> str:
    """A SHA-256 over the path and bytes of every Python source of the installed cutbench (harness, workloads,
    receivers and the ground floor): two runs with equal digests ran the same code, whatever the version says."""
    import hashlib

    import cutbench
    from cutbench import harness, receivers, workloads

    files = [(f.name, f) for f in sorted(Path(cutbench.__file__).resolve().parent.glob("*.py"))]
    for part, package in (("harness", harness), ("workloads", workloads), ("receivers", receivers)):
        base = Path(package.__path__[0]).resolve()  # inside cutbench/ in an installed copy, beside it in a checkout
        files += [(f"{part}/{f.relative_to(base)}", f) for f in sorted(base.rglob("*.py")) if "__pycache__" not in f.parts]
    digest = hashlib.sha256()
    for rel, f in files:
        digest.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def collect() -> dict[str, Any]:
    """Host, kernel, Python, CRIU, GPU and package versions (absent ones omitted)."""
    env: dict[str, Any] = {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    try:
        with open("/etc/os-release") as fh:
            for line in fh:
                if line.startswith("PRETTY_NAME="):
                    env["os"] = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    try:
        from cutbench.harness.provision.criu import locate

        install = locate.require_criu()  # cached: the run already found it
        env["criu"] = {"version": install.version, "source": install.source, "argv": " ".join(install.argv)}
    except Unavailable:
        pass  # no usable CRIU: nothing to record (doctor says why)
    except Exception as exc:  # environment capture must never fail a run
        env["criu_error"] = str(exc)
    try:
        from cutbench.harness.environment import gpu_probe

        env["gpu"] = _scalars(gpu_probe.probe())
    except Exception as exc:
        env["gpu_error"] = str(exc)
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    env["packages"] = versions
    return env


def gpu_count(env: dict[str, Any]) -> int:
    """The GPUs of an environment record (:func:`collect`): nvidia-smi's list, else what CuPy saw; 0 for none."""
    gpu = env.get("gpu") or {}
    return len(gpu.get("gpus") or ()) or int((gpu.get("cupy") or {}).get("device_count") or 0)


def fingerprint(env: dict[str, Any]) -> dict[str, Any]:
    """What makes two machines the same for cutbench's verdicts: GPU model, driver, CUDA, kernel and CRIU.

    From a run's environment record (:func:`collect`). The host name is left
    out on purpose: a GPU machine lent for one session gets a new name, and
    a matrix or a recorded reference of the same chip, driver and tools is
    still the same measurement.
    """
    gpu = env.get("gpu") or {}
    names = sorted({g.get("name", "") for g in gpu.get("gpus") or ()} - {""})
    out = {"machine": env.get("machine"), "kernel": env.get("kernel"), "gpu": ", ".join(names) or None,
           "driver": gpu.get("driver_version"), "cuda": gpu.get("cuda_driver_version"),
           "criu": (env.get("criu") or {}).get("version")}
    return {k: v for k, v in out.items() if v is not None}


def _scalars(value: Any) -> Any:
    """Keep only what TOML can hold (drop None, stringify odd types)."""
    if isinstance(value, dict):
        return {str(k): _scalars(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_scalars(v) for v in value if v is not None]
    if isinstance(value, (str, int, float, bool)):
        return value
    return str(value)

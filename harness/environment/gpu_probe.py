"""What this machine offers for GPU checkpointing; never fails on a machine without a GPU.

``probe()`` returns a plain dict (JSON-ready, stored with every run)::

    nvidia_smi        path or None
    gpus              [{"index", "name", "uuid", "memory_mib"}]   (from nvidia-smi)
    driver_version    "580.159.04" or None
    cuda_driver_version  "13.0" or None          (what the driver supports)
    cuda_bindings     {"version", "checkpoint_api", "error"}
    cupy              {"version", "device_count", "error"}
    nvml              {"version", "error"}       (nvidia-ml-py)
    cuda_checkpoint   path of the `cuda-checkpoint` utility or None
    usable            a GPU, CuPy seeing it and the driver checkpoint API: the GPU scenarios can run

``python -m cutbench.harness.environment.gpu_probe`` prints the dict as JSON; with
``--pick-scenario`` it prints ``scenarios/gpu-quick.toml`` and exits 0 when
``usable`` (and that file exists), else prints nothing and exits 1 (the Makefile picks the demo with it).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys

import cutbench

GPU_SCENARIO = "scenarios/gpu-quick.toml"

# The five driver calls the `cuda` backend drives (cuda.h, CUDA >= 12.8 drivers).
CHECKPOINT_CALLS = (
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
)


def _dist_version(*names: str) -> str | None:
    """The installed version of the first distribution found among ``names``."""
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _short_error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()


def _nvidia_smi() -> dict:
    """GPU list and versions from nvidia-smi; empty facts when it is absent or fails."""
    out: dict = {"nvidia_smi": shutil.which("nvidia-smi"), "gpus": [], "driver_version": None,
                 "cuda_driver_version": None, "nvidia_smi_error": None}
    if out["nvidia_smi"] is None:
        return out
    try:
        p = subprocess.run(
            [out["nvidia_smi"], "--query-gpu=index,name,uuid,memory.total,driver_version",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )
        if p.returncode != 0:
            out["nvidia_smi_error"] = (p.stdout + p.stderr).strip().splitlines()[-1:] or [f"exit {p.returncode}"]
            out["nvidia_smi_error"] = out["nvidia_smi_error"][0]
            return out
        for line in p.stdout.strip().splitlines():
            parts = [x.strip() for x in line.split(",")]
            if len(parts) >= 5:
                mem = int(parts[3]) if parts[3].isdigit() else None
                out["gpus"].append({"index": int(parts[0]), "name": parts[1], "uuid": parts[2], "memory_mib": mem})
                out["driver_version"] = parts[4]
        # The CUDA version the driver supports is only in the banner of plain `nvidia-smi`.
        p = subprocess.run([out["nvidia_smi"]], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
        m = re.search(r"CUDA Version:\s*([\d.]+)", p.stdout)
        out["cuda_driver_version"] = m.group(1) if m else None
    except (OSError, subprocess.TimeoutExpired) as e:
        out["nvidia_smi_error"] = _short_error(e)
    return out


def _cuda_bindings() -> dict:
    """cuda-bindings version and whether the driver checkpoint API is exposed (import only, no cuInit)."""
    info: dict = {"version": _dist_version("cuda-bindings", "cuda-python"), "checkpoint_api": False,
                  "missing_calls": list(CHECKPOINT_CALLS), "error": None}
    try:
        drv = importlib.import_module("cuda.bindings.driver")
    except ImportError as e:
        info["error"] = _short_error(e) if info["version"] else None  # not installed is not an error
        return info
    except Exception as e:  # a loader error when libcuda is absent
        info["error"] = _short_error(e)
        return info
    info["missing_calls"] = [c for c in CHECKPOINT_CALLS if not hasattr(drv, c)]
    info["checkpoint_api"] = not info["missing_calls"]
    if info["checkpoint_api"]:
        # Binding present is not enough: the driver must export the call too.
        try:
            err, version = drv.cuDriverGetVersion()
            info["driver_api_version"] = int(version) if int(err) == 0 else None
            if int(err) != 0 or int(version) < 12080:
                info["checkpoint_api"] = False
                info["error"] = f"driver API version {version} (< 12.8 lacks checkpointing)" if int(err) == 0 \
                    else f"cuDriverGetVersion: {err}"
        except Exception as e:
            info["checkpoint_api"] = False
            info["error"] = _short_error(e)
    return info


def _cupy() -> dict:
    """CuPy version and how many devices it sees (0 when none or when CuPy cannot load CUDA)."""
    info: dict = {"version": None, "device_count": 0, "error": None}
    try:
        cupy = importlib.import_module("cupy")
        info["version"] = getattr(cupy, "__version__", None)
        info["device_count"] = int(cupy.cuda.runtime.getDeviceCount())
    except ImportError as e:
        info["error"] = _short_error(e) if _dist_version("cupy", "cupy-cuda13x", "cupy-cuda12x") else None
    except Exception as e:  # CUDARuntimeError without a driver, etc.
        info["error"] = _short_error(e)
    return info


def _nvml() -> dict:
    """nvidia-ml-py version and whether NVML initialises."""
    info: dict = {"version": _dist_version("nvidia-ml-py"), "initialised": False, "error": None}
    if info["version"] is None:
        return info
    try:
        pynvml = importlib.import_module("pynvml")
        pynvml.nvmlInit()
        info["initialised"] = True
        pynvml.nvmlShutdown()
    except Exception as e:
        info["error"] = _short_error(e)
    return info


def probe() -> dict:
    """GPU facts of this machine; absent things are None / empty, never an exception."""
    facts = _nvidia_smi()
    facts["cuda_bindings"] = _cuda_bindings()
    facts["cupy"] = _cupy()
    facts["nvml"] = _nvml()
    facts["cuda_checkpoint"] = shutil.which("cuda-checkpoint")
    facts["usable"] = bool(
        facts["cupy"]["device_count"] > 0 and facts["cuda_bindings"]["checkpoint_api"]
        and (facts["gpus"] or facts["nvidia_smi"] is None)
    )
    return facts


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        facts = probe()
    except Exception:  # the Makefile must fall back to the CPU demo whatever happens
        facts = {"usable": False}
    if "--pick-scenario" in args:
        # Only pick the GPU demo when its scenario file exists in this checkout.
        repo = cutbench.source_checkout()
        if facts.get("usable") and repo is not None and (repo / GPU_SCENARIO).is_file():
            print(GPU_SCENARIO)
            return 0
        return 1
    print(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

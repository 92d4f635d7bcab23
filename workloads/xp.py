"""Array-module abstraction: one workload body runs on CuPy or NumPy.

``get_xp("auto")`` returns CuPy when a CUDA device is usable, else NumPy.
Workloads only use the subset of the API the two share, plus the helpers
here for the few places where they differ (synchronisation, device pointers,
host copies).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

ARRAY_BACKENDS = ("auto", "numpy", "cupy")


def get_xp(name: str = "auto") -> ModuleType:
    """Return the array module for ``name`` ("numpy", "cupy" or "auto").

    Raises ``ValueError`` when "cupy" is asked for and no device is usable.
    """
    if name not in ARRAY_BACKENDS:
        raise ValueError(f"array backend {name!r}: allowed {', '.join(ARRAY_BACKENDS)}")
    if name in ("auto", "cupy"):
        try:
            import cupy  # type: ignore[import-not-found]

            if cupy.cuda.runtime.getDeviceCount() > 0:
                return cupy
        except Exception as exc:  # no CuPy, no driver, no device
            if name == "cupy":
                raise ValueError(f"array backend 'cupy' is not usable here: {exc}") from exc
    import numpy

    return numpy


def is_device(xp: ModuleType) -> bool:
    """True when ``xp`` allocates on a GPU (CuPy)."""
    return xp.__name__ == "cupy"


def synchronize(xp: ModuleType) -> None:
    """Wait for all queued device work; a no-op on NumPy."""
    if is_device(xp):
        xp.cuda.get_current_stream().synchronize()


def pointer(arr: Any) -> int:
    """The address of ``arr``'s buffer: device pointer on CuPy, host pointer on NumPy."""
    data = getattr(arr, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return int(data.ptr)
    return int(arr.ctypes.data)


def to_host(arr: Any) -> Any:
    """A NumPy copy of ``arr`` (no copy for NumPy arrays)."""
    get = getattr(arr, "get", None)
    return get() if callable(get) else arr


def format_uuid(raw: bytes) -> str:
    """A 16-byte device UUID in nvidia-smi's form, ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def device_uuid(xp: ModuleType) -> str | None:
    """The UUID of the current device as the driver reports it now (None on NumPy)."""
    if not is_device(xp):
        return None
    dev = xp.cuda.Device().id
    raw = xp.cuda.runtime.getDeviceProperties(dev)["uuid"]
    return format_uuid(raw if isinstance(raw, bytes) else bytes(raw))

"""Array-module abstraction: one workload body runs on NumPy, CuPy or PyTorch.

``get_xp(name)`` returns the namespace a workload computes with (``rt.xp``):

* ``"numpy"``: the ``numpy`` module (host memory);
* ``"cupy"``: the ``cupy`` module (the current CUDA device);
* ``"torch"``: ``array_api_compat.torch``, the array API standard's namespace
  over PyTorch, with PyTorch's default device set to ``"cuda"`` so every
  tensor the workload makes lives on the GPU. PyTorch's own module is not
  array-API conforming (function names and signatures differ); the compat
  namespace is, so a body written against the standard runs on it, with
  unsigned 64-bit arithmetic through the word helpers below.
* ``"auto"``: CuPy when a CUDA device is usable, else NumPy (a workload's
  ``arrays`` may narrow this; see ``cutbench.workloads.api.resolve_array``).

Torch here always means CUDA tensors: a checkpoint benchmark of PyTorch on the
host would measure nothing NumPy does not, and a silent fall-back to the CPU
would report a GPU arm as valid without touching the GPU. Without PyTorch or
without a CUDA device, ``get_xp("torch")`` raises :class:`ArrayBackendUnavailable`
and the harness skips the arm with that reason.

The helpers below cover the few places where the libraries differ
(synchronisation, device pointers, host copies, the allocator's cache,
unsigned 64-bit words). Each recognises its argument through
``array_api_compat``'s ``is_*_array`` / ``is_*_namespace`` (which never import
a library that is not already loaded) and raises :class:`ArrayTypeError` for
anything else, rather than guessing.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import array_api_compat as compat

from cutbench.errors import ArrayBackendUnavailable, ArrayTypeError, InvalidArgument

ARRAY_BACKENDS = ("auto", "numpy", "cupy", "torch")
# The backends whose arrays live on a GPU.
DEVICE_BACKENDS = ("cupy", "torch")


@functools.lru_cache(maxsize=None)
def unusable_reason(name: str) -> str | None:
    """Why array backend ``name`` cannot run here, or None when it can.

    Loads the library to find out (not PyTorch's CUDA context: that is made
    by the first tensor), and changes nothing else in this process. Cached:
    what this machine can run does not change while the process lives, and
    resolving ``auto``, checking a workload and loading its namespace all ask.
    """
    if name not in ARRAY_BACKENDS:
        raise InvalidArgument(f"array backend {name!r}: allowed {', '.join(ARRAY_BACKENDS)}")
    if name == "cupy":
        try:
            import cupy  # type: ignore[import-not-found]

            if cupy.cuda.runtime.getDeviceCount() > 0:
                return None
            return "array backend 'cupy' is not usable here: no CUDA device"
        except Exception as exc:  # no CuPy, no driver, no device
            return f"array backend 'cupy' is not usable here: {exc}"
    if name == "torch":
        try:
            import torch  # type: ignore[import-not-found]
        except ImportError:
            return "array backend 'torch' is not usable here: PyTorch is not installed"
        try:
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                return None
        except Exception as exc:  # a broken driver install
            return f"array backend 'torch' is not usable here: {exc}"
        build = f"PyTorch {torch.__version__}" + ("" if torch.version.cuda else " (a build without CUDA)")
        return f"array backend 'torch' is not usable here: {build} sees no CUDA device"
    return None


@functools.lru_cache(maxsize=None)
def device_count() -> int:
    """How many CUDA devices this process sees (0 without CuPy, PyTorch or a driver).

    Asked through whichever library is usable (CuPy first), as
    :func:`unusable_reason` does; cached for the process's life.
    """
    if unusable_reason("cupy") is None:
        import cupy  # type: ignore[import-not-found]

        return int(cupy.cuda.runtime.getDeviceCount())
    if unusable_reason("torch") is None:
        import torch  # type: ignore[import-not-found]

        return int(torch.cuda.device_count())
    return 0


def get_xp(name: str = "auto") -> ModuleType:
    """Return the array namespace for ``name`` ("numpy", "cupy", "torch" or "auto"; see the module doc).

    Raises :class:`InvalidArgument` for another name and
    :class:`ArrayBackendUnavailable` (a ``ValueError``) when "cupy" or "torch"
    is asked for and is not usable here.
    """
    why = unusable_reason(name)
    if why is not None:
        raise ArrayBackendUnavailable(why)
    if name == "torch":
        import torch

        import array_api_compat.torch as xtorch

        # Factories (arange, asarray of a list, full, ...) then allocate on the
        # GPU without a ``device=`` at every call, as CuPy's do.
        torch.set_default_device("cuda")
        return xtorch
    if name in ("auto", "cupy") and unusable_reason("cupy") is None:
        import cupy

        return cupy
    import numpy

    return numpy


def backend_name(xp: ModuleType) -> str:
    """The backend ``xp`` belongs to: "numpy", "cupy" or "torch" (the library or its compat namespace).

    Raises :class:`ArrayTypeError` for any other namespace.
    """
    for name, test in (("numpy", compat.is_numpy_namespace), ("cupy", compat.is_cupy_namespace),
                       ("torch", compat.is_torch_namespace)):
        if test(xp):
            return name
    raise ArrayTypeError(f"array namespace {getattr(xp, '__name__', xp)!r} is none of {', '.join(ARRAY_BACKENDS[1:])}")


def is_device(xp: ModuleType) -> bool:
    """True when ``xp`` allocates on a GPU (CuPy, or PyTorch as :func:`get_xp` sets it up)."""
    return backend_name(xp) in DEVICE_BACKENDS


def synchronize(xp: ModuleType) -> None:
    """Wait for all queued device work: CuPy's current stream, every CUDA stream of
    PyTorch's current device; a no-op on NumPy. Raises :class:`ArrayTypeError` for another namespace."""
    name = backend_name(xp)
    if name == "cupy":
        xp.cuda.get_current_stream().synchronize()
    elif name == "torch":
        import torch

        if torch.cuda.is_initialized():  # no CUDA call made yet: nothing is queued
            torch.cuda.synchronize()


def release_cached_memory(xp: ModuleType) -> None:
    """Give the allocator's cached, unused device blocks back to the driver (CuPy's
    memory pool, PyTorch's caching allocator); a no-op on NumPy. The device state a
    checkpoint then moves is the live buffers and the context, not stale temporaries."""
    name = backend_name(xp)
    if name == "cupy":
        xp.get_default_memory_pool().free_all_blocks()
    elif name == "torch":
        import torch

        torch.cuda.empty_cache()


# -- unsigned 64-bit words --------------------------------------------------------
#
# The built-in workloads compute in unsigned 64-bit integers, which wrap mod
# 2**64 alike everywhere, so a NumPy reference reproduces a GPU run bit for bit.
# PyTorch stores uint64 but has no CUDA kernels for its arithmetic (2.11: add,
# mul, shifts and sum raise NotImplementedError), so on torch a word is an
# int64 holding the same 64 bits: + - * ^ & | wrap identically in two's
# complement, and only >> differs (it is arithmetic on int64), which
# :func:`shift_right` corrects. Code that keeps to these four helpers and those
# operators gets the same bits on every backend.

_WORD_BIT = 1 << 63
_WORD_MOD = 1 << 64


def word_dtype(xp: ModuleType) -> Any:
    """The dtype of a 64-bit word on ``xp``: ``uint64``, or ``int64`` on torch (see above)."""
    return xp.int64 if backend_name(xp) == "torch" else xp.uint64


def word(xp: ModuleType, value: int) -> Any:
    """Return ``value mod 2**64`` as a host scalar word for arithmetic with ``xp``'s word arrays:
    a NumPy ``uint64`` on NumPy and CuPy, a 0-d int64 CPU tensor on torch.

    Either way the value reaches a device kernel as an argument, with no
    host-to-device copy (a copy would wait for the queued work and turn a launch
    into a synchronisation). A plain Python int is not enough: PyTorch refuses one
    beyond the int64 range. Raises :class:`ArrayTypeError` for another namespace.
    """
    value %= _WORD_MOD
    if backend_name(xp) == "torch":
        return xp.asarray(value - _WORD_MOD if value & _WORD_BIT else value, dtype=xp.int64, device="cpu")
    return xp.uint64(value)


def shift_right(xp: ModuleType, x: Any, bits: int) -> Any:
    """Return ``x >> bits`` as a logical shift of 64-bit words (zeros come in from the top), for ``0 < bits < 64``."""
    if not 0 < bits < 64:
        raise InvalidArgument(f"shift_right: bits = {bits!r}; allowed 1..63")
    if backend_name(xp) == "torch":
        return (x >> bits) & word(xp, (1 << (64 - bits)) - 1)
    return x >> xp.uint64(bits)


def host_words(arr: Any) -> list[int]:
    """The 64-bit words of ``arr`` (any backend, see :func:`to_host`) as unsigned Python ints."""
    import numpy

    host = numpy.asarray(to_host(arr)).reshape(-1)
    if host.dtype.itemsize != 8 or host.dtype.kind not in "iu":
        raise ArrayTypeError(f"host_words: dtype {host.dtype} is not a 64-bit integer")
    return [int(v) for v in host.view(numpy.uint64)]


def _unknown(arr: Any, what: str) -> ArrayTypeError:
    kind = f"{type(arr).__module__}.{type(arr).__qualname__}"
    return ArrayTypeError(f"{what}: {kind} is not a NumPy array, a CuPy array or a torch tensor")


def pointer(arr: Any) -> int:
    """The address of ``arr``'s first element: the device pointer of a CuPy array or
    a CUDA tensor (``data_ptr()``), the host pointer of a NumPy array or a CPU tensor.

    Raises :class:`ArrayTypeError` for any other object (a NumPy scalar too: it owns no buffer).
    """
    if compat.is_numpy_array(arr):
        if not hasattr(arr, "ctypes"):  # ``is_numpy_array`` also accepts NumPy scalars
            raise ArrayTypeError(f"pointer: a NumPy scalar ({type(arr).__name__}) owns no buffer; pass an array")
        return int(arr.ctypes.data)
    if compat.is_cupy_array(arr):
        return int(arr.data.ptr)
    if compat.is_torch_array(arr):
        return int(arr.data_ptr())
    raise _unknown(arr, "pointer")


def to_host(arr: Any) -> Any:
    """A NumPy array with ``arr``'s contents: ``arr`` itself for NumPy, a copy for a
    CuPy array (``get()``, which synchronises) or a torch tensor (``.cpu().numpy()``).

    Raises :class:`ArrayTypeError` for any other object.
    """
    if compat.is_numpy_array(arr):
        return arr
    if compat.is_cupy_array(arr):
        return arr.get()
    if compat.is_torch_array(arr):
        return arr.detach().cpu().numpy()
    raise _unknown(arr, "to_host")


def format_uuid(raw: bytes) -> str:
    """A 16-byte device UUID in nvidia-smi's form, ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def device_uuid(xp: ModuleType) -> str | None:
    """The UUID of the current device as the driver reports it now (None on NumPy)."""
    name = backend_name(xp)
    if name == "numpy":
        return None
    if name == "torch":
        import torch

        # ``uuid`` is a uuid.UUID of the same 16 bytes CUDA reports.
        return format_uuid(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid.bytes)
    dev = xp.cuda.Device().id
    raw = xp.cuda.runtime.getDeviceProperties(dev)["uuid"]
    return format_uuid(raw if isinstance(raw, bytes) else bytes(raw))

"""The CUDA driver's process checkpoint calls, by pid: the interface, its cuda-python binding, its error table.

Owns :class:`DriverApi` (the five ``cuCheckpointProcess{GetState,Lock,
Checkpoint,Restore,Unlock}`` calls and the visible GPUs' UUIDs, what every
CUDA backend drives), :class:`CudaDriver` (that interface through
``cuda.bindings.driver``), :data:`RESULTS` (every ``CUresult`` the calls
document, with what it means here), :data:`STATES` and :class:`CudaCallError`,
the one error a failed call raises. NVIDIA's ``cuda-checkpoint`` utility is
another implementation of :class:`DriverApi`
(:mod:`cutbench.harness.nemesis.backends.cuda_checkpoint_util`).

This module makes one call per method and says what the driver answered; it
must not time stages, bound or retry calls, bring processes back or decide
whether a failure is a refusal (all of that is
:mod:`cutbench.harness.nemesis.backends.cuda`'s), and it must not import
cuda-python at module level: a machine without the bindings imports this
module, and only building a :class:`CudaDriver` needs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from cutbench.errors import CudaCallError

# Process states as the driver names them (CUprocessState), lower-cased.
STATES = ("running", "locked", "checkpointed", "failed", "checkpointing", "restoring")

# Every CUresult the checkpoint calls document, with what it means here. Codes
# are cuda.h's; the names are checked against cuda-bindings where installed.
RESULTS: dict[str, tuple[int, str]] = {
    "CUDA_SUCCESS": (0, "success"),
    "CUDA_ERROR_INVALID_VALUE": (1, "bad argument, or the pid is not a CUDA process"),
    "CUDA_ERROR_OUT_OF_MEMORY": (2, "not enough memory on the GPU to restore onto"),
    "CUDA_ERROR_NOT_INITIALIZED": (3, "the calling process did not initialise the driver (cuInit)"),
    "CUDA_ERROR_DEINITIALIZED": (4, "the driver is shutting down in the calling process"),
    "CUDA_ERROR_NO_DEVICE": (100, "no CUDA device is visible"),
    "CUDA_ERROR_INVALID_DEVICE": (101, "the GPU to restore onto is not usable for this process"),
    "CUDA_ERROR_INVALID_CONTEXT": (201, "the process's context cannot be restored here"),
    "CUDA_ERROR_OPERATING_SYSTEM": (304, "an operating-system call inside the driver failed"),
    "CUDA_ERROR_ILLEGAL_STATE": (401, "the process is not in the state this call needs"),
    "CUDA_ERROR_NOT_FOUND": (500, "no such process, or it has no CUDA state"),
    "CUDA_ERROR_NOT_READY": (600, "timed out waiting for in-flight work to finish (lock timeout)"),
    "CUDA_ERROR_NOT_PERMITTED": (800, "the caller may not checkpoint this process"),
    "CUDA_ERROR_NOT_SUPPORTED": (801, "the driver cannot checkpoint what this process uses"),
    "CUDA_ERROR_SYSTEM_NOT_READY": (802, "the driver or fabric is not ready"),
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH": (803, "driver and kernel module versions differ"),
    "CUDA_ERROR_TIMEOUT": (909, "the operation timed out"),
    "CUDA_ERROR_UNKNOWN": (999, "unknown driver error"),
}
_BY_CODE = {code: name for name, (code, _) in RESULTS.items()}


def call_error(call: str, pid: int, code: int, name: str = "", text: str = "") -> CudaCallError:
    """The :class:`~cutbench.errors.CudaCallError` of ``call`` on ``pid`` answering ``code``: ``name`` (looked up
    from ``code`` when empty) and its meaning from :data:`RESULTS`, plus the driver's or the utility's ``text``."""
    name = name or _BY_CODE.get(code, f"CUresult {code}")
    meaning = RESULTS.get(name, (code, "error not documented for checkpoint calls"))[1]
    return CudaCallError(call, pid, code, name, meaning, text)


class DriverApi(Protocol):
    """The five checkpoint calls, by pid. Errors raise :class:`CudaCallError`."""

    supports_remap: bool

    def get_state(self, pid: int) -> str:
        """The process state (one of :data:`STATES`)."""
        ...

    def lock(self, pid: int, timeout_ms: int) -> None: ...

    def checkpoint(self, pid: int) -> None: ...

    def restore(self, pid: int, pairs: Sequence[tuple[str, str]] = ()) -> None:
        """Restore; ``pairs`` are (old GPU UUID, new GPU UUID) in nvidia-smi form."""
        ...

    def unlock(self, pid: int) -> None: ...

    def gpu_uuids(self) -> list[str]:
        """UUIDs of the GPUs this process can see, in device order."""
        ...


class CudaDriver:
    """The :class:`DriverApi` through ``cuda.bindings.driver`` (cuda-python >= 12.8 bindings).

    Building one imports the bindings and calls ``cuInit``; either failing raises (ImportError, or
    :class:`CudaCallError` for ``cuInit``). Whether that will work is
    :func:`~cutbench.harness.nemesis.backends.cuda_discovery.bindings_unavailable_reason`'s question.
    """

    supports_remap = True

    def __init__(self) -> None:
        from cuda.bindings import driver as drv  # type: ignore[import-not-found]

        self.drv = drv
        # Restore needs cuInit in the calling process (or persistence mode).
        self._check("cuInit", 0, drv.cuInit(0))
        self._uuids: dict[str, Any] | None = None

    def _check(self, call: str, pid: int, result: Any) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        code = int(err)
        if code != 0:
            text = ""
            try:
                _, msg = self.drv.cuGetErrorString(err)
                text = msg.decode() if isinstance(msg, bytes) else str(msg)
            except Exception:
                pass
            raise call_error(call, pid, code, getattr(err, "name", ""), text)
        return result[1] if isinstance(result, tuple) and len(result) > 1 else None

    def get_state(self, pid: int) -> str:
        """The state of ``pid`` as the driver reports it (one of :data:`STATES`)."""
        state = self._check("cuCheckpointProcessGetState", pid, self.drv.cuCheckpointProcessGetState(pid))
        return state.name.removeprefix("CU_PROCESS_STATE_").lower()

    def lock(self, pid: int, timeout_ms: int) -> None:
        """Block further CUDA calls of ``pid``; gives up after ``timeout_ms`` (process left RUNNING). Returns None."""
        args = self.drv.CUcheckpointLockArgs()
        args.timeoutMs = int(timeout_ms)
        self._check("cuCheckpointProcessLock", pid, self.drv.cuCheckpointProcessLock(pid, args))

    def checkpoint(self, pid: int) -> None:
        """Copy ``pid``'s device memory to host and release the GPU. Returns None."""
        self._check("cuCheckpointProcessCheckpoint", pid, self.drv.cuCheckpointProcessCheckpoint(pid, None))

    def restore(self, pid: int, pairs: Sequence[tuple[str, str]] = ()) -> None:
        """Bring ``pid``'s device memory back, onto other GPUs when ``pairs`` says so. Returns None."""
        args = None
        if pairs:
            known = self._uuid_objects()
            items = []
            for old, new in pairs:
                for u in (old, new):
                    if u not in known:
                        raise call_error("cuCheckpointProcessRestore", pid, 101, "CUDA_ERROR_INVALID_DEVICE",
                                            f"GPU {u} is not visible to the harness")
                pair = self.drv.CUcheckpointGpuPair()
                pair.oldUuid = known[old]
                pair.newUuid = known[new]
                items.append(pair)
            args = self.drv.CUcheckpointRestoreArgs()
            args.gpuPairs = items
            args.gpuPairsCount = len(items)
        self._check("cuCheckpointProcessRestore", pid, self.drv.cuCheckpointProcessRestore(pid, args))

    def unlock(self, pid: int) -> None:
        """Let ``pid`` make CUDA calls again. Returns None."""
        self._check("cuCheckpointProcessUnlock", pid, self.drv.cuCheckpointProcessUnlock(pid, None))

    def gpu_uuids(self) -> list[str]:
        """Visible GPUs' UUIDs in device order, in nvidia-smi form (``GPU-…``)."""
        return list(self._uuid_objects())

    def _uuid_objects(self) -> dict[str, Any]:
        # CUuuid objects cannot be built from bytes in the bindings; take the
        # driver's own (cuDeviceGetUuid) and match them by their formatted value.
        if self._uuids is None:
            from cutbench.workloads.xp import format_uuid

            count = self._check("cuDeviceGetCount", 0, self.drv.cuDeviceGetCount())
            out = {}
            for i in range(int(count)):
                dev = self._check("cuDeviceGet", 0, self.drv.cuDeviceGet(i))
                uuid = self._check("cuDeviceGetUuid", 0, self.drv.cuDeviceGetUuid(dev))
                out[format_uuid(uuid.bytes)] = uuid
            self._uuids = out
        return self._uuids


__all__ = ["RESULTS", "STATES", "CudaCallError", "CudaDriver", "DriverApi"]

"""The public workload API: the protocol a workload implements and how it is found.

A workload is a class with a ``name``, the state ``domains`` it uses, its
``phases``, parameter ``defaults``, and four methods: ``setup``, ``run_op``,
``report`` and the class method ``reference``. The runtime drives it; the
harness never imports anything but the class attributes and ``reference``.

Registration: built-in workloads are listed in ``BUILTIN``; third-party ones
are found through the entry-point group ``cutbench.workloads`` or named by an
import path ``"package.module:Class"`` in a scenario file.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

from cutbench.errors import CutbenchError
from cutbench.registry import Registry, import_target
from cutbench.workloads.control import PHASES
from cutbench.workloads.xp import DEVICE_BACKENDS, unusable_reason

ENTRY_POINT_GROUP = "cutbench.workloads"

# State domains a workload may declare and a checkpointer may cover.
# ``ipc``: SysV and anonymous shared memory (a CRIU image holds it);
# ``shared_file``: a file-backed MAP_SHARED mapping, whose contents no
# checkpoint image holds (a restore maps the file as it is now).
DOMAINS: tuple[str, ...] = ("cpu", "cuda", "peer", "receiver", "ipc", "shared_file", "uvm", "disk")

BUILTIN: dict[str, str] = {
    "counter": "cutbench.workloads.counter:Counter",
    "persistent_kernel": "cutbench.workloads.persistent_kernel:PersistentKernel",
    "nccl_ranks": "cutbench.workloads.nccl_ranks:NcclRanks",
    "request_service": "cutbench.workloads.request_service:RequestService",
    "training": "cutbench.workloads.training:Training",
    "allocator_churn": "cutbench.workloads.allocator_churn:AllocatorChurn",
    "stream_callbacks": "cutbench.workloads.stream_callbacks:StreamCallbacks",
    "ranks": "cutbench.workloads.ranks:Ranks",
    # Sensitivity suite (workloads/variants.py): known-bad variants and their correct twins.
    "outbox": "cutbench.workloads.variants:Outbox",
    "outbox_mark_before_send": "cutbench.workloads.variants:OutboxMarkBeforeSend",
    "resend": "cutbench.workloads.variants:Resend",
    "resend_stale_digest": "cutbench.workloads.variants:ResendStaleDigest",
    "restore_hook": "cutbench.workloads.variants:RestoreHook",
    "restore_hook_realloc": "cutbench.workloads.variants:RestoreHookRealloc",
    "echo_peer": "cutbench.workloads.echo_peer:EchoPeer",
    "echo_peer_noseq": "cutbench.workloads.echo_peer:EchoPeerNoSeq",
}

# Array backends a workload runs on unless it says otherwise (``arrays``). PyTorch
# is opt-in: a body written for CuPy's module (``xp.cuda``, raw kernels) does not
# run on the array API namespace a torch workload gets.
ARRAYS: tuple[str, ...] = ("numpy", "cupy")
# Every name a workload's ``arrays`` may hold.
ARRAY_LIBRARIES: tuple[str, ...] = ("numpy", "cupy", "torch")


@runtime_checkable
class Reference(Protocol):
    """Ground truth of an uninterrupted run, computed without running the workload."""

    def payload(self, op: int) -> str:
        """The payload digest effect ``op`` must carry."""
        ...

    def checksum(self, op: int) -> str:
        """The state checksum after ``op`` operations (``op == 0``: initial state)."""
        ...


class Workload(Protocol):
    """What a workload class provides. See README "Workload API" for a full example."""

    name: ClassVar[str]
    domains: ClassVar[frozenset[str]]
    phases: ClassVar[tuple[str, ...]]
    defaults: ClassVar[dict[str, Any]]

    def __init__(self, rt: Any, params: dict[str, Any]) -> None: ...

    def setup(self) -> None:
        """Allocate state; called once before op 1."""

    def run_op(self, op: int) -> None:
        """Execute operation ``op``, calling ``rt.point(op, phase)`` after each phase."""

    def report(self) -> dict[str, Any]:
        """Final report: at least ``host_op``, ``checksum``, ``pointers_initial``, ``pointers_final``."""
        ...

    @classmethod
    def reference(cls, params: dict[str, Any]) -> Reference: ...

    # Optional members (see docs/workload-api.md):
    #   arrays: ClassVar[tuple[str, ...]]   array backends it runs on (of "numpy", "cupy", "torch");
    #                                       without "numpy" it is GPU-only
    #   validate_params(cls, params)        classmethod; raise WorkloadError naming the bad value
    #   domains_for(cls, params)            classmethod; domains some parameter values add
    #   save_state(self, path: str) -> None / load_state(self, path: str) -> int
    #                                       the `app` baseline's hooks (op to resume after)
    #   finish(self) -> None                called after the last op, before report()


class WorkloadError(ValueError):
    """A workload name, import path or parameter set is not usable."""


WORKLOADS = Registry("workload", ENTRY_POINT_GROUP, BUILTIN)


def available() -> dict[str, str]:
    """Every known workload name mapped to its import path (built-ins and entry points)."""
    return WORKLOADS.available()


def load(name: str) -> type:
    """The workload class for a registered ``name`` or an import path ``"mod:Class"``.

    Raises :class:`WorkloadError` naming the allowed workloads when not found.
    """
    # A built-in name needs no scan of the installed entry points (milliseconds, on every trial).
    target = WORKLOADS.builtin.get(name) or available().get(name, name if ":" in name else None)
    if target is None:
        allowed = ", ".join(sorted(available()))
        raise WorkloadError(f"unknown workload {name!r}; allowed: {allowed}, or an import path 'module:Class'")
    try:
        cls = import_target(target, f"workload {name!r}")
    except CutbenchError as exc:
        raise WorkloadError(str(exc)) from exc
    for required in ("name", "domains", "phases", "defaults", "reference", "run_op"):
        if not hasattr(cls, required):
            raise WorkloadError(f"workload {target!r} lacks {required!r} (see the Workload protocol)")
    unknown_phases = [p for p in cls.phases if not isinstance(p, str)]
    if unknown_phases or not cls.phases:
        raise WorkloadError(f"workload {target!r}: phases must be a non-empty tuple of names")
    arrays = getattr(cls, "arrays", ARRAYS)
    if isinstance(arrays, str) or not arrays or any(a not in ARRAY_LIBRARIES for a in arrays):
        raise WorkloadError(f"workload {target!r}: arrays = {arrays!r}; must be a non-empty tuple of "
                            f"{', '.join(map(repr, ARRAY_LIBRARIES))}")
    return cls


def resolve_params(cls: type, params: dict[str, Any]) -> dict[str, Any]:
    """``cls.defaults`` updated with ``params``, type-checked; unknown keys are errors."""
    out = dict(cls.defaults)
    for key, value in params.items():
        if key not in cls.defaults:
            allowed = ", ".join(sorted(cls.defaults))
            raise WorkloadError(f"workload {cls.name!r} has no parameter {key!r}; allowed: {allowed}")
        default = cls.defaults[key]
        ok = isinstance(value, type(default)) or (isinstance(default, float) and isinstance(value, int))
        if isinstance(default, int) and isinstance(value, bool):
            ok = isinstance(default, bool)
        if not ok:
            raise WorkloadError(
                f"workload {cls.name!r} parameter {key!r} = {value!r}: expected {type(default).__name__}"
            )
        out[key] = value
    validate = getattr(cls, "validate_params", None)
    if callable(validate):
        try:
            validate(out)
        except WorkloadError:
            raise
        except (TypeError, ValueError) as exc:
            raise WorkloadError(f"workload {cls.name!r}: {exc}") from None
    return out


def declared_domains(cls: type, params: dict[str, Any]) -> frozenset[str]:
    """The state domains ``cls`` uses with ``params``: ``cls.domains`` plus what ``domains_for`` adds."""
    extra = getattr(cls, "domains_for", None)
    return frozenset(cls.domains) | (frozenset(extra(params)) if callable(extra) else frozenset())


def declared_arrays(cls: type) -> tuple[str, ...]:
    """The array backends ``cls`` runs on: its ``arrays``, or :data:`ARRAYS` when it declares none."""
    return tuple(getattr(cls, "arrays", ARRAYS))


def resolve_array(cls: type, array: str) -> str:
    """The backend ``cls`` runs on when the scenario asks for ``array``.

    Any name but "auto" is returned as it is. "auto" never loads PyTorch for a
    workload that runs on anything else (importing it costs seconds and
    hundreds of MiB in every checkpoint image): CuPy when ``cls`` runs on it
    and it is usable here, else NumPy when ``cls`` runs on it, else the first
    of its device backends that is usable here, else its first device backend
    (:func:`unavailable_reason` then says why it cannot run).
    """
    if array != "auto":
        return array
    arrays = declared_arrays(cls)
    if "cupy" in arrays and unusable_reason("cupy") is None:
        return "cupy"
    if "numpy" in arrays:
        return "numpy"
    devices = [a for a in arrays if a in DEVICE_BACKENDS]
    return next((a for a in devices if a != "cupy" and unusable_reason(a) is None), devices[0])


# What to install when a device backend is missing.
_INSTALL = {
    "cupy": "install the 'gpu' extra on a machine with an NVIDIA GPU",
    "torch": "install the 'torch' extra, a CUDA build of PyTorch, on a machine with an NVIDIA GPU",
}


def unavailable_reason(cls: type, array: str) -> str | None:
    """Why ``cls`` cannot run here on array backend ``array`` (with the fix), or None when it can.

    ``array`` is a scenario's ``workload.array`` ("auto" is resolved by
    :func:`resolve_array`). The reason names a backend ``cls`` does not run
    on, or the missing library or GPU: "cupy" needs CuPy and a CUDA device,
    "torch" PyTorch with a CUDA device.
    """
    arrays = declared_arrays(cls)
    wanted = resolve_array(cls, array)
    if wanted not in arrays:
        return f"workload {cls.name!r} runs on {', '.join(arrays)}, not {wanted!r}"
    if wanted not in DEVICE_BACKENDS:
        return None
    # "auto" with no usable device backend: every declared one's reason.
    tried = [a for a in arrays if a in DEVICE_BACKENDS] if array == "auto" else [wanted]
    reasons = [(a, unusable_reason(a)) for a in tried]
    if any(why is None for _, why in reasons):
        return None
    return f"workload {cls.name!r} needs a GPU: " + "; ".join(f"{why} ({_INSTALL[a]})" for a, why in reasons)


__all__ = ["ARRAYS", "PHASES", "DOMAINS", "Reference", "Workload", "WorkloadError", "available", "declared_arrays",
           "declared_domains", "load", "resolve_array", "resolve_params", "unavailable_reason"]

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

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from cutbench.errors import CutbenchError, ReferenceMismatch, WorkloadError
from cutbench.registry import Registry, import_target
from cutbench.workloads.control import PHASES
from cutbench.workloads.xp import DEVICE_BACKENDS, device_count, unusable_reason

ENTRY_POINT_GROUP = "cutbench.workloads"

# State domains a workload may declare and a checkpointer may cover.
# ``ipc``: SysV and anonymous shared memory (a CRIU image holds it);
# ``shared_file``: a file-backed MAP_SHARED mapping, whose contents no
# checkpoint image holds (a restore maps the file as it is now);
# ``request_log``: a serving runtime's log of the replies acknowledged, on
# disk (no image holds it; its semantic adapter joins it to a cut);
# ``device_work``: device work that never ends (a persistent kernel), which
# no checkpoint holds mid-flight (its adapter drains it at the cut);
# ``rank_set``: where several ranks stand in their collectives (its adapter,
# a distributed pause, brings them to one boundary).
DOMAINS: tuple[str, ...] = ("cpu", "cuda", "peer", "receiver", "ipc", "shared_file", "uvm", "disk", "request_log",
                            "device_work", "rank_set")

BUILTIN: dict[str, str] = {
    "counter": "cutbench.workloads.counter:Counter",
    # A program that knows nothing of cutbench, judged from what it shows the outside world (docs/programs.md).
    "program": "cutbench.workloads.program:Program",
    "persistent_kernel": "cutbench.workloads.persistent_kernel:PersistentKernel",
    "nccl_ranks": "cutbench.workloads.nccl_ranks:NcclRanks",
    "request_service": "cutbench.workloads.request_service:RequestService",
    "training": "cutbench.workloads.training:Training",
    "allocator_churn": "cutbench.workloads.allocator_churn:AllocatorChurn",
    "stream_callbacks": "cutbench.workloads.stream_callbacks:StreamCallbacks",
    "ranks": "cutbench.workloads.ranks:Ranks",
    # Real applications in miniature (floating point: recorded ground truth).
    "md_simulation": "cutbench.workloads.md_simulation:MDSimulation",
    "torch_training": "cutbench.workloads.torch_training:TorchTraining",
    "inference_worker": "cutbench.workloads.inference_worker:InferenceWorker",
    # Sensitivity suite (workloads/variants.py): known-bad variants and their correct twins.
    "outbox": "cutbench.workloads.variants:Outbox",
    "outbox_mark_before_send": "cutbench.workloads.variants:OutboxMarkBeforeSend",
    "resend": "cutbench.workloads.variants:Resend",
    "resend_stale_digest": "cutbench.workloads.variants:ResendStaleDigest",
    "restore_hook": "cutbench.workloads.variants:RestoreHook",
    "restore_hook_realloc": "cutbench.workloads.variants:RestoreHookRealloc",
    "echo_peer": "cutbench.workloads.echo_peer:EchoPeer",
    "echo_peer_noseq": "cutbench.workloads.echo_peer:EchoPeerNoSeq",
    # The coordinator's bounded failure: a semantic adapter that is slow, answers garbage or raises.
    "adapter_faults": "cutbench.workloads.adapter_faults:AdapterFaults",
    # Probes of the CUDA support matrix (workloads/probes/): one CUDA feature each.
    "probe_memory": "cutbench.workloads.probes.memory:MemoryProbe",
    "probe_globals": "cutbench.workloads.probes.memory:GlobalsProbe",
    "probe_texture": "cutbench.workloads.probes.memory:TextureProbe",
    "probe_pinned": "cutbench.workloads.probes.host:PinnedProbe",
    "probe_streams": "cutbench.workloads.probes.inflight:StreamsProbe",
    "probe_host_func": "cutbench.workloads.probes.inflight:HostFuncProbe",
    "probe_lock_timeout": "cutbench.workloads.probes.inflight:LockTimeoutProbe",
    "probe_lazy_loading": "cutbench.workloads.probes.modules:LazyLoadingProbe",
    "probe_eager_loading": "cutbench.workloads.probes.modules:EagerLoadingProbe",
    "probe_nvrtc": "cutbench.workloads.probes.modules:NvrtcProbe",
    "probe_curand": "cutbench.workloads.probes.modules:CurandProbe",
    "probe_cublas": "cutbench.workloads.probes.modules:CublasProbe",
    "probe_graph": "cutbench.workloads.probes.graphs:GraphProbe",
    "probe_malloc_async": "cutbench.workloads.probes.allocation:MallocAsyncProbe",
    "probe_vmm_alias": "cutbench.workloads.probes.allocation:VmmAliasProbe",
    "probe_managed": "cutbench.workloads.probes.allocation:ManagedProbe",
    "probe_fork": "cutbench.workloads.probes.processes:ForkProbe",
    "probe_ipc": "cutbench.workloads.probes.processes:IpcProbe",
    "probe_nvml": "cutbench.workloads.probes.processes:NvmlProbe",
    "probe_torch_allocator": "cutbench.workloads.probes.torch_probes:TorchAllocatorProbe",
    "probe_torch_compile": "cutbench.workloads.probes.torch_probes:TorchCompileProbe",
    "probe_torch_cuda_graph": "cutbench.workloads.probes.torch_probes:TorchGraphProbe",
    "probe_restore_oom": "cutbench.workloads.probes.errors:RestoreOomProbe",
    "probe_peer_access": "cutbench.workloads.probes.multi_gpu:PeerAccessProbe",
    "probe_migration": "cutbench.workloads.probes.multi_gpu:MigrationProbe",
    "probe_nccl": "cutbench.workloads.probes.multi_gpu:NcclProbe",
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
    """What a workload class provides. See docs/workload-api.md for the whole contract and a complete example."""

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

    # Optional class attributes: OPTIONAL below, with their defaults (read them with ``optional``).
    # Optional methods (see docs/workload-api.md):
    #   features_for(cls, params, array)    classmethod; the CUDA features where they depend on the parameters
    #                                       or the array backend
    #   validate_params(cls, params)        classmethod; raise WorkloadError naming the bad value
    #   domains_for(cls, params)            classmethod; domains some parameter values add
    #   save_state(self, path: str) -> None / load_state(self, path: str) -> int
    #                                       the `app` baseline's hooks (op to resume after)
    #   finish(self) -> None                called after the last op, before report()
    #   anchor(cls, params, base)           classmethod; params with the paths a scenario wrote relative to its
    #                                       folder ``base`` made absolute (a program's files)


# The Workload protocol's optional class attributes, each with the default a class that lacks it has:
OPTIONAL: dict[str, Any] = {
    "arrays": ARRAYS,  # array backends it runs on (of "numpy", "cupy", "torch"); without "numpy" it is GPU-only
    # "model" (``reference`` computes it) or "recorded" (uninterrupted runs on this machine record it; see
    # RecordedReference)
    "ground_truth": "model",
    # CUDA features it uses (probe features; the certificate asks the measured support matrix about each)
    "features": frozenset(),
    "environment": {},  # variables set in the workload process before CUDA starts
    "min_gpus": 1,  # GPUs it needs, for a device backend
    "exclusive_gpu": False,  # it needs the GPUs to itself (it fills their memory)
    "matrix_rows": (),  # the support-matrix rows it measures (a probe): MatrixRow
    "companions": (),  # modules run as ``python -m MODULE CONFIG`` beside it, outside the checkpointed tree
    "program": False,  # a program that knows nothing of cutbench, started as it is (cutbench.workloads.program)
}


def optional(cls: type, name: str) -> Any:
    """Return ``cls``'s optional class attribute ``name`` (one of :data:`OPTIONAL`), or its declared default."""
    return getattr(cls, name, OPTIONAL[name])


# -- ground truth recorded on this machine ---------------------------------------

GROUND_TRUTHS: tuple[str, ...] = ("model", "recorded")


def records_reference(cls: type[Workload]) -> bool:
    """Whether ``cls``'s ground truth is recorded from uninterrupted runs (``ground_truth = "recorded"``)
    rather than computed by its ``reference`` classmethod."""
    return optional(cls, "ground_truth") == "recorded"


def reference_key(workload: str, params: dict[str, Any], array: str) -> str:
    """The name of the recorded reference of ``workload`` with ``params`` on array backend ``array``:
    ``<workload>-<array>-<hash of the parameters>`` (a file name: letters, digits, ``-``, ``_``, ``.``)."""
    import hashlib
    import json
    import re

    text = json.dumps({"workload": workload, "params": params, "array": array}, sort_keys=True, default=str)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", workload.rsplit(":", 1)[-1])[:60]
    return f"{stem}-{array}-{hashlib.blake2b(text.encode(), digest_size=6).hexdigest()}"


# The payload a program's reference gives for an effect its uninterrupted runs never showed.
NOT_SHOWN = "(never shown by the uninterrupted runs)"


@dataclass
class RecordedReference:
    """Ground truth recorded from uninterrupted runs of a workload on this machine (:class:`Reference`).

    Floating-point programs and CUDA libraries (cuRAND, cuBLAS, ...) are not
    bit-replayable on NumPy, so their reference is what an uninterrupted run
    of the same workload, parameters and array backend produced here: the
    payload of every op's effect and the state checksum after every op the
    run reported (``report["checksums"]``, plus the final one). The runner
    records it twice and keeps it only when both runs agree op for op.
    ``machine`` says where it was recorded; :meth:`check` refuses it for
    another workload, parameter set or machine.
    """

    workload: str
    params: dict[str, Any]
    array: str
    payloads: dict[int, str]
    checksums: dict[int, str]
    machine: dict[str, Any] = field(default_factory=dict)
    runs: int = 1
    # A program's (workloads/program.py): each op's identity, "stream#index"; an op it does not hold is an effect
    # the uninterrupted runs never showed (its payload is NOT_SHOWN, so the oracle says mixed_epoch).
    keys: dict[int, str] = field(default_factory=dict)
    # A program's artefacts compared by a callable (program.Artefact): where the reference run's copies are kept.
    artefacts_dir: str = ""
    # A traced program's counted system calls, in order (the boundaries a cut of phase "syscall" numbers), each
    # {n, call, target, bytes, head} (cutbench.harness.model.boundaries.Boundary); and where the second
    # uninterrupted run's differed from them ("" where they did not, or where it was not traced).
    boundaries: list[dict[str, Any]] = field(default_factory=list)
    boundaries_differ: str = ""

    def payload(self, op: int) -> str:
        """The payload effect ``op`` carried in the uninterrupted run."""
        if self.keys and int(op) not in self.payloads:
            return NOT_SHOWN
        try:
            return self.payloads[int(op)]
        except KeyError:
            raise KeyError(f"the recorded reference of {self.workload} holds no effect for op {op} "
                           f"(recorded ops 1..{max(self.payloads, default=0)})") from None

    def describe(self, op: int) -> str:
        """What op ``op`` is, for a finding: a program's effect as "stream#index" ("" for a workload's op)."""
        if not self.keys:
            return ""
        return self.keys.get(int(op), "an effect the uninterrupted runs never showed")

    def checksum(self, op: int) -> str:
        """The state checksum after ``op`` ops in the uninterrupted run."""
        try:
            return self.checksums[int(op)]
        except KeyError:
            raise KeyError(f"the recorded reference of {self.workload} holds no state checksum after op {op} "
                           f"(recorded after ops {sorted(self.checksums)})") from None

    @classmethod
    def from_run(cls, workload: str, params: dict[str, Any], array: str, effects: Any, report: dict[str, Any] | None,
                 machine: dict[str, Any] | None = None) -> "RecordedReference":
        """The reference one uninterrupted run gives: its effects (the receiver's rows: ``op_id``,
        ``digest``, ``decision``) and its final report. Raises :class:`WorkloadError` naming what the run
        lacks (no report, an op without an applied effect)."""
        if not report or report.get("checksum") is None:
            raise WorkloadError(f"workload {workload!r}: the uninterrupted run wrote no report with a checksum")
        payloads: dict[int, str] = {}
        keys: dict[int, str] = {}
        if effects is not None and len(effects):
            for op, digest, decision in zip(effects["op_id"], effects["digest"], effects["decision"], strict=True):
                if decision in ("applied", "committed"):
                    payloads.setdefault(int(op), str(digest))
            if "stream" in effects and "index" in effects:  # a program's effects name their identity
                for op, stream, index in zip(effects["op_id"], effects["stream"], effects["index"], strict=True):
                    keys.setdefault(int(op), f"{stream}#{index}")
        last = int(report.get("host_op") or 0)
        absent = [op for op in range(1, last + 1) if op not in payloads]
        if absent:
            raise WorkloadError(f"workload {workload!r}: the uninterrupted run committed ops 1..{last} but the receiver "
                                f"holds no applied effect for op(s) {absent[:5]}")
        checksums = {int(k): str(v) for k, v in (report.get("checksums") or {}).items()}
        checksums[last] = str(report["checksum"])
        return cls(workload, dict(params), array, payloads, checksums, dict(machine or {}), keys=keys,
                   boundaries=list(report.get("boundaries") or []))

    def first_difference(self, other: "RecordedReference") -> str | None:
        """Where two recordings of one workload disagree first (an op's identity, payload or checksum), or None."""
        for what, mine, theirs in (("effect", self.keys, other.keys), ("effect payload", self.payloads, other.payloads),
                                   ("state checksum", self.checksums, other.checksums)):
            for op in sorted(set(mine) | set(theirs)):
                if mine.get(op) != theirs.get(op):
                    where = f"op {op} ({self.keys[op]})" if op in self.keys and what != "effect" else f"op {op}"
                    return (f"{where}: {what} {str(mine.get(op, 'absent'))[:32]} in one run, "
                            f"{str(theirs.get(op, 'absent'))[:32]} in the other")
        return None

    def check(self, workload: str, params: dict[str, Any], array: str, machine: dict[str, Any] | None = None) -> None:
        """Raise :class:`ReferenceMismatch` naming the difference when this recording is not the ground
        truth of ``workload`` with ``params`` on ``array`` (and, when given, on ``machine``)."""
        if (self.workload, self.array) != (workload, array):
            raise ReferenceMismatch(f"recorded reference of {self.workload!r} on {self.array!r} asked for {workload!r} "
                                    f"on {array!r}")
        if self.params != params:
            changed = sorted(k for k in set(self.params) | set(params) if self.params.get(k) != params.get(k))
            raise ReferenceMismatch(f"recorded reference of {workload!r} was made with other parameters "
                                    f"({', '.join(f'{k}={self.params.get(k)!r}, not {params.get(k)!r}' for k in changed)})")
        for key, value in (machine or {}).items():
            if key in self.machine and self.machine[key] != value:
                raise ReferenceMismatch(f"recorded reference of {workload!r} was made on another machine "
                                        f"({key} {self.machine[key]!r}, here {value!r}): record it again here")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (op numbers as strings)."""
        return {"workload": self.workload, "params": self.params, "array": self.array, "runs": self.runs,
                "machine": self.machine, "payloads": {str(k): v for k, v in sorted(self.payloads.items())},
                "checksums": {str(k): v for k, v in sorted(self.checksums.items())},
                **({"keys": {str(k): v for k, v in sorted(self.keys.items())}} if self.keys else {}),
                **({"artefacts_dir": self.artefacts_dir} if self.artefacts_dir else {}),
                **({"boundaries": self.boundaries} if self.boundaries else {}),
                **({"boundaries_differ": self.boundaries_differ} if self.boundaries_differ else {})}

    @classmethod
    def from_dict(cls, data: Any) -> "RecordedReference":
        """Inverse of :meth:`to_dict`; :class:`WorkloadError` naming the bad field."""
        if not isinstance(data, dict):
            raise WorkloadError(f"recorded reference: expected an object, got {type(data).__name__}")
        try:
            return cls(str(data["workload"]), dict(data["params"]), str(data["array"]),
                       {int(k): str(v) for k, v in dict(data["payloads"]).items()},
                       {int(k): str(v) for k, v in dict(data["checksums"]).items()},
                       dict(data.get("machine") or {}), int(data.get("runs", 1)),
                       {int(k): str(v) for k, v in dict(data.get("keys") or {}).items()},
                       str(data.get("artefacts_dir") or ""), [dict(b) for b in data.get("boundaries") or []],
                       str(data.get("boundaries_differ") or ""))
        except (KeyError, TypeError, ValueError) as exc:
            raise WorkloadError(f"recorded reference: bad or missing field ({type(exc).__name__}: {exc})") from None


# -- the support matrix's rows (probes declare them) ------------------------------


@dataclass(frozen=True)
class MatrixRow:
    """One row of the CUDA support matrix, declared by the probe that measures it.

    ``name`` is the row (a feature at one setting, ``device_memory_1GiB``);
    ``feature`` the CUDA feature a workload declares in ``features`` and the
    certificate asks about (several rows may measure one feature); ``params``
    and ``array`` are the probe's; the single cut of every trial is at
    ``cut_op``/``cut_phase``. ``restore_target`` ``other_gpu`` asks for a GPU
    migration on restore.
    """

    name: str
    feature: str
    description: str
    params: dict[str, Any] = field(default_factory=dict)
    array: str = "cupy"
    cut_op: int = 2
    cut_phase: str = "launch"
    restore_target: str = "same"


WORKLOADS = Registry("workload", ENTRY_POINT_GROUP, BUILTIN)


def available() -> dict[str, str]:
    """Every known workload name mapped to its import path (built-ins and entry points)."""
    return WORKLOADS.available()


def loadable() -> "dict[str, type[Workload] | WorkloadError]":
    """Every known workload by name: its class, or the :class:`WorkloadError` that says why it does not load (a
    listing, ``cutbench list workloads``, and the support matrix's probes read every workload through this)."""
    out: dict[str, type[Workload] | WorkloadError] = {}
    for name in available():
        try:
            out[name] = load(name)
        except WorkloadError as exc:
            out[name] = exc
    return out


def load(name: str, path: "tuple[str, ...] | list[str]" = (), *, environ: bool = False) -> type[Workload]:
    """The workload class for a registered ``name`` or an import path ``"mod:Class"``, its module looked for on
    ``path`` too (a trial's ``workload_path``: see :func:`add_import_path`, which ``environ`` is passed to).

    Raises :class:`WorkloadError` naming the allowed workloads when not found.
    """
    if path:
        add_import_path(path, environ=environ)
    # A built-in name needs no scan of the installed entry points (milliseconds, on every trial).
    target = WORKLOADS.builtin.get(name) or available().get(name, name if ":" in name else None)
    if target is None:
        allowed = ", ".join(sorted(available()))
        raise WorkloadError(f"unknown workload {name!r}; allowed: {allowed}, or an import path 'module:Class'")
    try:
        cls = import_target(target, f"workload {name!r}")
    except CutbenchError as exc:
        raise WorkloadError(str(exc)) from exc
    # A workload whose ground truth is recorded from uninterrupted runs needs no model of it (``reference``).
    required = ("name", "domains", "phases", "defaults", *(() if records_reference(cls) else ("reference",)), "run_op")
    for member in required:
        if not hasattr(cls, member):
            raise WorkloadError(f"workload {target!r} lacks {member!r}: a workload class declares "
                                f"{', '.join(required)} (the Workload protocol: docs/workload-api.md)")
    unknown_phases = [p for p in cls.phases if not isinstance(p, str)]
    if unknown_phases or not cls.phases:
        raise WorkloadError(f"workload {target!r}: phases must be a non-empty tuple of names")
    arrays = optional(cls, "arrays")
    if isinstance(arrays, str) or not arrays or any(a not in ARRAY_LIBRARIES for a in arrays):
        raise WorkloadError(f"workload {target!r}: arrays = {arrays!r}; must be a non-empty tuple of "
                            f"{', '.join(map(repr, ARRAY_LIBRARIES))}")
    truth = optional(cls, "ground_truth")
    if truth not in GROUND_TRUTHS:
        raise WorkloadError(f"workload {target!r}: ground_truth = {truth!r}; allowed {', '.join(GROUND_TRUTHS)}")
    features: frozenset[str] = optional(cls, "features")
    if isinstance(features, str) or not all(isinstance(f, str) and f for f in features):
        raise WorkloadError(f"workload {target!r}: features = {features!r}; must be a set of feature names")
    return cls


def import_roots(cls: type) -> tuple[str, ...]:
    """The ``sys.path`` entry (absolute) that workload class ``cls`` was imported from, as a 1-tuple; ``()`` for a
    class any interpreter of this environment finds without help (cutbench's own, an installed package's).

    It travels with the trial (``TrialSpec.workload_path``): a workload found through a relative
    ``PYTHONPATH`` or the harness's working directory is not found from a trial's directory, nor by a
    ``cutbench replay`` pasted elsewhere.
    """
    import site
    import sys
    from pathlib import Path

    import cutbench

    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if not file or cls.__module__.split(".")[0] == "cutbench":
        # cutbench's own (its folders are mapped under the one name: counting name parts would miss the root).
        return ()
    root = Path(file).resolve().parent
    if Path(file).name == "__init__.py":
        root = root.parent
    for _ in cls.__module__.split(".")[1:]:
        root = root.parent
    # Every process the harness starts has cutbench's own root on its path (procs.package_env), and the
    # environment's site directories.
    installed = [Path(p).resolve() for p in (*site.getsitepackages(), site.getusersitepackages())]
    if root == Path(str(cutbench.IMPORT_ROOT)) or any(root.is_relative_to(k) for k in installed):
        return ()
    return (str(root),)


def add_import_path(entries: "tuple[str, ...] | list[str]", *, environ: bool = False) -> None:
    """Put ``entries`` (a trial's ``workload_path``) at the end of ``sys.path`` (a user's module is found; none of
    the standard library's is shadowed), and with ``environ`` at the front of this process's ``PYTHONPATH`` too
    (the workload process: what it starts finds the workload). Entries already there stay where they are."""
    import os
    import sys

    sys.path.extend(e for e in entries if e not in sys.path)
    if not environ:
        return
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if any(e not in inherited for e in entries):
        os.environ["PYTHONPATH"] = os.pathsep.join([*[e for e in entries if e not in inherited], *inherited])


def resolve_params(cls: type[Workload], params: dict[str, Any]) -> dict[str, Any]:
    """Return ``cls.defaults`` updated with ``params``, type-checked; unknown keys are errors."""
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


def declared_domains(cls: type[Workload], params: dict[str, Any]) -> frozenset[str]:
    """The state domains ``cls`` uses with ``params``: ``cls.domains`` plus what ``domains_for`` adds."""
    extra = getattr(cls, "domains_for", None)
    return frozenset(cls.domains) | (frozenset(extra(params)) if callable(extra) else frozenset())


def declared_features(cls: type[Workload], params: dict[str, Any] | None = None, array: str | None = None) -> frozenset[str]:
    """The features ``cls`` uses with ``params`` on array backend ``array``: ``features_for(params, array)``
    where the class has it (a probe whose buffer is device or host memory by array), else ``features``."""
    pick = getattr(cls, "features_for", None)
    if callable(pick) and params is not None and array is not None:
        return frozenset(pick(params, array))
    return frozenset(optional(cls, "features"))


def declared_arrays(cls: type[Workload]) -> tuple[str, ...]:
    """The array backends ``cls`` runs on: its ``arrays``, or :data:`ARRAYS` when it declares none."""
    return tuple(optional(cls, "arrays"))


def resolve_array(cls: type[Workload], array: str) -> str:
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


def unavailable_reason(cls: type[Workload], array: str) -> str | None:
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
        need = int(optional(cls, "min_gpus"))
        have = device_count()
        if need > have:
            return f"workload {cls.name!r} needs {need} GPUs; {have} visible here"
        return None
    return f"workload {cls.name!r} needs a GPU: " + "; ".join(f"{why} ({_INSTALL[a]})" for a, why in reasons)


__all__ = ["ARRAYS", "PHASES", "DOMAINS", "MatrixRow", "RecordedReference", "Reference", "ReferenceMismatch", "Workload",
           "WorkloadError", "available", "declared_arrays", "declared_domains", "declared_features", "load",
           "records_reference", "reference_key", "resolve_array", "resolve_params", "unavailable_reason"]

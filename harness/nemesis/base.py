"""The Checkpointer protocol: the nemesis stages one backend owns.

A backend implements ``checkpoint`` (every stage up to a restorable image,
leaving the target running only when asked) and ``restore`` (every stage back
to a running process), or ``resume_in_place`` for suspend/resume without a
restore. Failures are reported by raising :class:`~cutbench.errors.StageRefused`
(the stage declined and the target runs on) or
:class:`~cutbench.errors.StageFailed` (no verdict possible).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from cutbench.errors import InvalidArgument
from cutbench.harness.model import schema
from cutbench.harness.model.plan import FAULTS, Cut
from cutbench.procs import Child
from cutbench.harness.model.timeline import Timeline


@dataclass
class CutContext:
    """What a backend gets for one cut: where to put images, where to time stages."""

    images_dir: Path
    timeline: Timeline
    cut_index: int
    cut: Cut
    stage_timeout_s: float = schema.default("run.stage_timeout_s")
    # The deadline of the adapters' prepare (and of each later adapter request), run.prepare_timeout_s.
    prepare_timeout_s: float = schema.default("run.prepare_timeout_s")
    # Whether the workload's semantic adapters join this cut (the backend's ``capabilities.semantic_adapters``),
    # and whether they were prepared and neither committed, aborted nor restored yet (the pipeline aborts them).
    semantic_adapters: bool = True
    adapters_open: bool = False
    # Set by the pipeline once the backend's restore returned: the image came back (a tool's lock on it, such as
    # CRIU's network lock, went with the restore; cleanup releases it only for an image never restored).
    restored: bool = False
    # Set by the backend: bytes of the image, GPU bytes, and anything to report.
    facts: dict[str, Any] = field(default_factory=dict)
    # Called by backends whose pipeline lets host code run before the CPU cut
    # (the split window): it releases the workload's park.
    release: Any = None
    # The trial's ControlFile: backends that talk to the workload (app saves)
    # and the semantic adapters use it; None outside a trial.
    control: Any = None
    # The cut's certifier (see :class:`Certifier`); None when the cut is not certified.
    certifier: Any = None
    # The workload's phases in execution order (to compare its control slots with the cut).
    phases: tuple[str, ...] = ()
    # A program held at a system call (a cut of phase "syscall"): hands its tree over to the tool, stopped, with
    # the tracer gone. The pipeline calls it before a tool that drives no CUDA begins; a GPU tool's CRIU half
    # calls it (CriuCheckpointer.dump) after the CUDA lock, which needs the program's CUDA threads running.
    # Idempotent; None for every other cut.
    freeze: Any = None
    # The other way, for a GPU tool: thaw(pid) continues the frozen program pid but for the thread held at its
    # call, which is held again (its CUDA restore, unlock or resume needs the CUDA threads running). A GPU tool
    # calls it after its CRIU half and before its CUDA half; None for every other cut.
    thaw: Any = None
    # CRIU's own options for this cut's arm (pipeline.criu_options), at dump and at restore: for a backend whose
    # capabilities.tools has "criu".
    criu_options: tuple[str, ...] = ()
    # A program that knows nothing of cutbench (the ``program`` workload): how to start it again and its output
    # pipes for a restore (:class:`ProgramControl`); None for a workload of cutbench's, which ``control`` drives.
    program: "ProgramControl | None" = None

    def mark(self, stage: str, *, op: int | None = None, phase: str | None = None) -> None:
        """Report that capture stage ``stage`` (``cuda_lock``, ``criu_freeze``, ``app_save``) has taken its domain now.

        The certifier records the workload's position (or the given ``op``
        and ``phase``, for a capture that knows better); under
        ``certify = "enforce"`` it raises :class:`~cutbench.errors.StageRefused`
        when the capture would make the cut ineligible, and the backend then
        undoes what it did, as for any refused stage.
        """
        if self.certifier is not None:
            self.certifier.captured(stage, op=op, phase=phase)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, declared on the backend class (``capabilities = Capabilities(...)``).

    The harness asks the backend instead of keeping its own table: scenario
    validation and the arms read ``faults``, ``split_window`` and
    ``drives_cuda``; a run's trials table has one ``<stage>_s`` column per
    stage its backends declare (as ``run.toml`` records them); the checker compares ``covers`` with the
    workload's domains.
    """

    # Faults it can carry out: "kill" needs an image a fresh process can be restored from.
    faults: frozenset[str] = frozenset(FAULTS)
    # Host code may run between the GPU lock and the CPU freeze (arms multiply pipeline.split_window_ms).
    split_window: bool = False
    # Calls the CUDA driver's checkpoint per process (arms multiply rank skews and restore targets).
    drives_cuda: bool = False
    # Timeline stages it times (each becomes a `<stage>_s` column of trials.parquet).
    stages: tuple[str, ...] = ()
    # State domains its image holds (a workload domain outside this set is an unsafe acceptance).
    covers: frozenset[str] = frozenset()
    # What it needs of the workload's code ("" for nothing: a transparent, system-level tool).
    workload_changes: str = ""
    # The coordinator joins the workload's semantic adapters to each cut (prepare, commit, abort, restored):
    # a tool that images the process. False for one whose cut is the application's own save or a restart.
    semantic_adapters: bool = True
    # The tools it runs whose own options a scenario may pass ("criu": pipeline.criu_options reach each of its CRIU
    # calls through CutContext.criu_options).
    tools: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.faults) - set(FAULTS))
        if unknown:
            raise InvalidArgument(f"capabilities.faults contains {unknown}: allowed {', '.join(FAULTS)}")


class ProgramControl(Protocol):
    """What a backend may ask of a program trial (``CutContext.program``; the runner implements it).

    ``resume_args``: the program's own restart flag (``workload.params.resume``; empty when it has none).
    ``catches_up``: whether a program started again from its beginning redoes its work by itself (a batch
    program), so that a requeue waits until it has shown ``at_cut`` effects again (a server does not);
    ``at_cut``: the distinct effects the outside world had seen when the cut began (a cut placed at a time or a
    size has no effect count of its own).
    ``start(extra_args)`` starts it again in its directory as the trial's next incarnation, observed as the
    first was (without ``extra_args``: from the beginning) and returns its handle; ``shown()`` counts the
    effects the running incarnation has shown. ``inherited_fds()`` gives fresh pipes for a CRIU restore,
    ``[("pipe:[INODE]", fd)]`` for ``--inherit-fd``; ``restored()`` closes them once the restore returned.
    """

    resume_args: tuple[str, ...]
    catches_up: bool
    at_cut: int

    def start(self, extra_args: Sequence[str] = ()) -> Child: ...

    def shown(self) -> int: ...

    def inherited_fds(self) -> list[tuple[str, int]]: ...

    def restored(self) -> None: ...


class Certifier(Protocol):
    """What the pipeline asks about one cut; the runner's coordinator implements it.

    ``precheck`` before anything is touched (a refusal costs nothing),
    ``captured`` from the backends' capture stages (:meth:`CutContext.mark`),
    ``checkpointed`` once a restorable image exists (the fence may advance),
    ``before_restore`` after the fault and before the restore (a refusal
    leaves the crashed workload down: the restore was declined),
    ``joined`` with what the workload's semantic adapters said at prepare,
    ``in_flight`` for the effect ids a restored process's adapters should
    classify, and ``after_restore`` with that classification (or why there is
    none) before the restored process runs.
    ``precheck``, ``before_restore`` and ``after_restore`` return a refusal reason or None.
    """

    def joined(self, joined: Any) -> None: ...

    def precheck(self) -> str | None: ...

    def in_flight(self) -> list[int]: ...

    def after_restore(self, restored: Any) -> str | None: ...

    def captured(self, stage: str, *, op: int | None = None, phase: str | None = None) -> None: ...

    def checkpointed(self) -> None: ...

    def before_restore(self) -> str | None: ...


@runtime_checkable
class Checkpointer(Protocol):
    """One checkpoint backend (see DESIGN.md "Checkpoint pipeline" and docs/backends.md).

    Optional: ``launch(argv, *, cwd, labels, env, image) -> Child`` for a
    backend that must start the workload itself (a container engine); the
    trial calls it instead of :func:`cutbench.procs.spawn`, with ``labels``
    naming the run and the trial for the container (a ``launch`` without that
    parameter gets none) and, for a program as it is, ``env``: its own
    environment, and ``image``: its own image (then ``has_image(image)`` says
    whether the engine holds it). See :data:`OPTIONAL`.
    """

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here (with the fix), or None when it can."""
        ...

    def checkpoint(self, target: Child, ctx: CutContext) -> None:
        """Run the stages up to a restorable image. ``ctx.cut.fault`` decides whether the target keeps running."""
        ...

    def restore(self, ctx: CutContext) -> int:
        """Bring the image back to a running process; return its pid."""
        ...

    def resume_in_place(self, target: Child, ctx: CutContext) -> None:
        """Undo ``checkpoint`` on a target that kept running (fault ``none``)."""
        ...

    def cleanup(self, ctx: CutContext) -> None:
        """Remove what this cut left behind (images); must not raise."""
        ...


# The Checkpointer protocol's optional members, with what a backend that lacks one has:
OPTIONAL: dict[str, Any] = {
    # It copes with a workload tree that starts as the init of a PID namespace of its own (a parallel run's
    # trials then cannot collide on a restored pid): plain ``criu``.
    "pid_namespace": False,
    "launch": None,  # launch(argv, *, cwd, labels, env, image) -> Child: it starts the workload itself (see Checkpointer)
    "has_image": None,  # has_image(image) -> bool: whether the engine holds a program's own image
    # check_program(params): raise InvalidArgument, before any trial, for a program the tool cannot run as given
    # (a partition its cluster lacks).
    "check_program": None,
    # Its launch writes the program's stdout and stderr to files the observer reads (a batch job's output files):
    # a program watched through its pipes can run under it.
    "output_files": False,
    # Why it cannot cut a program held at a system call (plan.phases "syscall"), or "" when it can: the check
    # refuses such a scenario before any trial with these words.
    "held_calls": "",
    # The file in the program's directory from which what comes back after the cut reads the restore decision
    # (``restore`` or ``restart``: the slurm backend's requeued job, ``$CUTBENCH_DECISION``): under
    # pipeline.certify = "enforce" an ineligible restore is then started over rather than refused. "" for none.
    "decision_file": "",
}


def optional(backend: Any, name: str) -> Any:
    """Return ``backend``'s (a class or an instance) optional member ``name`` (one of :data:`OPTIONAL`), or its default."""
    return getattr(backend, name, OPTIONAL[name])


def dir_bytes(path: Path) -> int:
    """Total size in bytes of the regular files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def remove_tree(path: Path) -> None:
    """Remove ``path`` recursively, ignoring absence."""
    shutil.rmtree(path, ignore_errors=True)

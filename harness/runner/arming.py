"""A trial's cuts, armed in its control file, and what the runner knows of a trial as it goes.

:class:`Arming` arms a trial's precise cuts (the workload parks at an armed ``(op, phase)``); :class:`NextCut`
arms each cut's successor at the moment the pipeline allows; :class:`TrialState` is what one trial has
established so far; :func:`launcher` is how a trial starts its workload.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cutbench.harness.model.plan import CutPlan
from cutbench.harness.nemesis.base import optional
from cutbench.procs import Child, spawn
from cutbench.workloads.control import ControlFile


def launcher(backend: Any, labels: dict[str, str], params: dict[str, Any] | None = None) -> Callable[..., Child]:
    """How the trial starts its workload: :func:`~cutbench.procs.spawn`, or the backend's own ``launch(argv, *,
    cwd, labels, params)`` (a container engine, a batch system), given the run's and the trial's ``labels`` for
    the container and the program's ``params`` (a ``launch`` without such a parameter gets none)."""
    launch = optional(backend, "launch")
    if launch is None:
        return spawn
    wanted = inspect.signature(launch).parameters
    given = {"labels": labels, "params": params}
    return functools.partial(launch, **{k: v for k, v in given.items() if k in wanted})


@dataclass
class TrialState:
    """What one trial has established so far (the runner's status vocabulary; see model.trial)."""

    status: str = "completed"
    error: str = ""
    failed_stage: str = ""
    restores: int = 0
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    # (position at the last cut, progress count right after it)
    resumed_at: tuple[tuple[int, int], int] | None = None
    down: bool = False  # the workload is gone on purpose (a declined restore): nothing runs to the end
    evidence: list[dict[str, Any]] = field(default_factory=list)
    joined: set[str] | None = None  # domains the adapters joined at every restored cut (None: no restore yet)


@dataclass
class Arming:
    """Arms a trial's precise cuts in its control file: the workload parks at an armed ``(op, phase)``."""

    control: ControlFile
    plan: CutPlan
    phases: tuple[str, ...]  # the workload's phases, in order: a cut's phase is armed by its index

    def arm(self, index: int) -> int | None:
        """Arm cut ``index`` if it is precise; return its arm sequence (None: asynchronous, or no cut left)."""
        if index >= len(self.plan.cuts) or self.plan.cuts[index].mode != "precise":
            return None
        cut = self.plan.cuts[index]
        return self.control.arm(cut.op, self.phases.index(cut.phase))


@dataclass
class NextCut:
    """Arming cut ``index + 1`` around cut ``index``: the pipeline calls ``before_resume`` or ``release``."""

    arming: Arming
    index: int
    seq: int | None  # this cut's arm sequence (None: nothing parked)
    fault: str
    next_seq: int | None = None

    def ensure_armed(self) -> None:
        """Arm the next cut once; returns None."""
        if self.next_seq is None:
            self.next_seq = self.arming.arm(self.index + 1)

    def before_resume(self) -> None:
        """After the fault, before the restored process runs: hold it, a new incarnation, then the next cut; returns None."""
        control = self.arming.control
        if self.seq is not None:
            # After ``leave_running`` the original was released, so the copy would
            # leave its park as soon as CRIU restores it: on the GPU, a CUDA call
            # before the CUDA restore kills it (benchmarks/repro/). It waits for release().
            control.hold(self.seq)
        control.set("incarnation", control.get("incarnation") + 1)
        self.next_seq = self.arming.arm(self.index + 1)

    def release(self) -> None:
        """Let the parked workload go on; returns None."""
        if self.fault == "none":
            # No restore follows: arm the next cut before the parked workload
            # moves on, or it may run past it first.
            self.ensure_armed()
        if self.seq is not None:
            self.arming.control.release(self.seq)

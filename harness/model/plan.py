"""Cut plans: the data a scheduler produces and a trial executes.

A :class:`CutPlan` is a tuple of :class:`Cut`; each cut says where the
checkpoint happens (``op``, ``phase`` or an asynchronous offset), how the
pipeline is shaped (split window between the CUDA and CPU cut) and what fault
follows. Plans are plain data with a JSON form so every trial can be stored
and replayed exactly.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from cutbench.errors import InvalidArgument
from cutbench.workloads.control import PHASES

FAULTS: tuple[str, ...] = ("kill", "leave_running", "none")
CUT_MODES: tuple[str, ...] = ("precise", "async")
# Where a restore puts the process: the GPU it ran on (the default, and the only target a CPU tool has), or another.
SAME_GPU = "same"
RESTORE_TARGETS: tuple[str, ...] = (SAME_GPU, "other_gpu")


@dataclass(frozen=True)
class Cut:
    """One checkpoint cut.

    ``op``/``phase``: the cut point (boundary after ``phase`` of ``op``). In
    ``async`` mode the pipeline starts ``async_offset_ms`` after the workload
    reaches that point, wherever it then is. ``split_window_ms``: delay
    between the CUDA checkpoint and the CRIU dump (host code runs inside it).
    ``fault``: ``kill`` (dump, kill, restore), ``leave_running`` (dump, let it
    run ``crash_after_ms``, crash, restore), ``none`` (suspend/resume in place).
    ``restore_target``: ``same`` GPU or ``other_gpu`` (GPU UUID remap on restore).
    ``rank_skew_ms``: 0 is a coordinated cut of a multi-process workload (every
    rank locked before any is checkpointed; restored and unlocked in the same
    order); > 0 cuts the ranks one at a time, this long apart, letting the
    workload run in between (an uncoordinated cut).
    """

    op: int
    phase: str
    mode: str = "precise"
    async_offset_ms: float = 0.0
    split_window_ms: float = 0.0
    fault: str = "kill"
    crash_after_ms: float = 0.0
    restore_target: str = SAME_GPU
    rank_skew_ms: float = 0.0

    def __post_init__(self) -> None:
        validate_cut(self)

    @property
    def remaps(self) -> bool:
        """Whether the restore puts the process on another GPU than the one it ran on."""
        return self.restore_target != SAME_GPU

    def to_dict(self) -> dict[str, Any]:
        """The cut as a JSON-ready dict."""
        return asdict(self)


def validate_cut(cut: Cut, phases: tuple[str, ...] | None = None) -> None:
    """Raise :class:`InvalidArgument` naming the first bad field of ``cut``.

    ``phases``: the workload's phase names; None checks only that the phase
    is a name (workloads may add phases to the standard ones, e.g. ``send``).
    """
    if not isinstance(cut.op, int) or isinstance(cut.op, bool) or cut.op < 1:
        raise InvalidArgument(f"cut.op = {cut.op!r}: must be an integer >= 1")
    if not isinstance(cut.phase, str) or not cut.phase:
        raise InvalidArgument(f"cut.phase = {cut.phase!r}: must be a phase name such as {', '.join(PHASES)}")
    if phases is not None and cut.phase not in phases:
        raise InvalidArgument(f"cut.phase = {cut.phase!r}: allowed {', '.join(phases)}")
    if cut.mode not in CUT_MODES:
        raise InvalidArgument(f"cut.mode = {cut.mode!r}: allowed {', '.join(CUT_MODES)}")
    if cut.fault not in FAULTS:
        raise InvalidArgument(f"cut.fault = {cut.fault!r}: allowed {', '.join(FAULTS)}")
    if cut.restore_target not in RESTORE_TARGETS:
        raise InvalidArgument(f"cut.restore_target = {cut.restore_target!r}: allowed {', '.join(RESTORE_TARGETS)}")
    for name in ("async_offset_ms", "split_window_ms", "crash_after_ms", "rank_skew_ms"):
        value = getattr(cut, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise InvalidArgument(f"cut.{name} = {value!r}: must be a number >= 0")


@dataclass(frozen=True)
class CutPlan:
    """The cuts of one trial, in execution order."""

    cuts: tuple[Cut, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        """The plan as a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        """The plan as a JSON-ready dict."""
        return {"cuts": [c.to_dict() for c in self.cuts]}

    @classmethod
    def from_dict(cls, data: Any) -> "CutPlan":
        """Parse a plan dict; raise :class:`InvalidArgument` naming the bad field."""
        if not isinstance(data, dict) or not isinstance(data.get("cuts"), list):
            raise InvalidArgument("plan: expected an object with a list 'cuts'")
        known = {f.name for f in fields(Cut)}
        cuts = []
        for i, raw in enumerate(data["cuts"]):
            if not isinstance(raw, dict):
                raise InvalidArgument(f"plan.cuts[{i}]: expected an object")
            extra = set(raw) - known
            if extra:
                raise InvalidArgument(f"plan.cuts[{i}]: unknown field(s) {sorted(extra)}; allowed {sorted(known)}")
            try:
                cuts.append(Cut(**raw))
            except TypeError as exc:
                raise InvalidArgument(f"plan.cuts[{i}]: {exc}") from exc
            except InvalidArgument as exc:
                raise InvalidArgument(f"plan.cuts[{i}]: {exc}") from exc
        return cls(tuple(cuts))

    @classmethod
    def from_json(cls, text: str) -> "CutPlan":
        """Parse :meth:`to_json` output."""
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"plan: not JSON: {exc}") from exc

    def validate_for(self, phases: tuple[str, ...], ops: int | None = None) -> "CutPlan":
        """Check the plan against a workload's ``phases`` (and op count); return it.

        Raises :class:`InvalidArgument` for a phase the workload does not have,
        an op beyond ``ops``, cuts not at strictly increasing positions (a
        restored workload runs forward from its cut, so a later cut at an
        earlier point would never be reached), or a cut after an asynchronous
        one (an asynchronous cut lands wherever the workload is after its
        offset, possibly past the next cut's point, which then is never reached).
        """
        last = -1
        for i, cut in enumerate(self.cuts):
            if i and self.cuts[i - 1].mode == "async":
                raise InvalidArgument(f"plan.cuts[{i}] follows an asynchronous cut: only the last cut of a plan may be async")
            try:
                validate_cut(cut, phases)
            except InvalidArgument as exc:
                raise InvalidArgument(f"plan.cuts[{i}]: {exc}") from None
            # A program's syscall cut numbers its counted calls, not its effects: checked against its recording.
            if ops is not None and cut.op > ops and cut.phase != "syscall":
                raise InvalidArgument(f"plan.cuts[{i}]: cut.op = {cut.op} exceeds the workload's ops = {ops}")
            pos = position(cut, phases)
            if pos <= last:
                raise InvalidArgument(f"plan.cuts[{i}] at {cut.op}/{cut.phase} is not after the previous cut")
            last = pos
        return self

    def describe(self) -> str:
        """A one-line human description, e.g. ``3/publish leave_running+150ms``."""
        parts = []
        for c in self.cuts:
            s = f"{c.op}/{c.phase} {c.fault}"
            if c.fault == "leave_running":
                s += f"+{c.crash_after_ms:g}ms"
            if c.split_window_ms:
                s += f" split={c.split_window_ms:g}ms"
            if c.rank_skew_ms:
                s += f" skew={c.rank_skew_ms:g}ms"
            if c.remaps:
                s += f" ->{c.restore_target}"
            if c.mode == "async":
                s += f" async+{c.async_offset_ms:g}ms"
            parts.append(s)
        return "; ".join(parts) or "(no cut)"


def position(cut: Cut, phases: tuple[str, ...]) -> int:
    """The cut point's index in execution order: ``op * len(phases) + phase index``."""
    return cut.op * len(phases) + phases.index(cut.phase)

"""The trial as data: what to run (``TrialSpec``), what came back (``TrialResult``)
and what the checker concluded (``Verdict`` of ``Finding``s).

The runner fills these in, the checker produces verdicts, the store writes
them; none of them acts. ``TrialSpec`` is everything needed to run a trial
again exactly (it is stored in ``trials/<id>.json`` and read by replay).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from cutbench.errors import InvalidArgument
from cutbench.harness.model.plan import CutPlan
from cutbench.harness.model.scenario import Arm, Scenario
from cutbench.workloads import api as workload_api

FINDING_KINDS: tuple[str, ...] = (
    "duplicate",
    "missing",
    "mixed_epoch",
    "pointer_changed",
    "deadlock",
    "unsafe_acceptance",
)
OUTCOMES: tuple[str, ...] = ("valid", "invalid", "refused", "unknown")


@dataclass(frozen=True)
class Finding:
    """One thing that went wrong: its kind, the op concerned (if any), and why."""

    kind: str
    op: int | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """The outcome of a trial and the findings behind it (``reason``: why unknown or refused)."""

    outcome: str
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    reason: str = ""

    def counts(self) -> dict[str, int]:
        """Number of findings per kind (every kind present, zeros included)."""
        out = {k: 0 for k in FINDING_KINDS}
        for f in self.findings:
            out[f.kind] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (as stored in ``trials/<id>.json``)."""
        return {"outcome": self.outcome, "findings": [f.to_dict() for f in self.findings], "reason": self.reason}


@dataclass
class TrialSpec:
    """Everything needed to run one trial again, exactly (stored in ``trials/<id>.json``)."""

    trial_id: str
    index: int
    workload: str
    array: str
    params: dict[str, Any]
    backend: str
    receiver_mode: str
    arm: dict[str, Any]
    plan: dict[str, Any]
    watchdog_s: float = 20.0
    trial_timeout_s: float = 120.0
    stage_timeout_s: float = 60.0
    images_dir: str = "/dev/shm"
    keep_images: bool = False
    variant: str = ""  # the sweep point (``state_size=4096``) when a sweep runs several in one run

    def cut_plan(self) -> CutPlan:
        """The plan as a :class:`CutPlan`."""
        return CutPlan.from_dict(self.plan)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialSpec":
        """Inverse of :meth:`to_dict`; raise InvalidArgument on unknown or missing fields."""
        try:
            spec = cls(**data)
        except TypeError as exc:
            raise InvalidArgument(f"trial spec: {exc}") from None
        try:
            cls_ = workload_api.load(spec.workload)
        except workload_api.WorkloadError as exc:
            raise InvalidArgument(f"trial spec: workload: {exc}") from None
        spec.cut_plan().validate_for(tuple(cls_.phases), spec.params.get("ops"))
        return spec


@dataclass
class TrialResult:
    """A finished trial: its record (one row of ``trials.parquet``), timeline and effects."""

    spec: TrialSpec
    record: dict[str, Any]
    timeline: list[dict[str, Any]]
    effects: pd.DataFrame
    verdict: Verdict


def spec_for(scenario: Scenario, arm: Arm, plan: CutPlan, index: int) -> TrialSpec:
    """The :class:`TrialSpec` of trial number ``index``: ``plan`` under ``arm`` of ``scenario``."""
    return TrialSpec(
        trial_id=f"t{index:04d}",
        index=index,
        workload=scenario.workload,
        array=scenario.array,
        params=dict(scenario.params),
        backend=arm.backend,
        receiver_mode=arm.receiver_mode,
        arm=asdict(arm),
        plan=plan.to_dict(),
        watchdog_s=scenario.watchdog_s,
        trial_timeout_s=scenario.trial_timeout_s,
        stage_timeout_s=scenario.stage_timeout_s,
        images_dir=scenario.images_dir,
        keep_images=scenario.keep_images,
    )

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
from cutbench.harness.model.certificate import EXTERNAL
from cutbench.harness.model import schema
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
    "certificate_unsound",
    "process_lost",
    "restarted",
)
# Three vocabularies, one per step, each with its own meaning (DESIGN.md "Oracle"):
# - a cut's outcome, from the nemesis pipeline: what happened to that cut;
#   ``failed``: a stage of the tool failed and took the application with it;
#   ``error``: the harness could not carry a stage out;
CUT_OUTCOMES: tuple[str, ...] = ("restored", "resumed", "refused", "failed", "error")
# - the trial's status, from the runner: whether the trial ran to its end
#   (``completed``), hung (``deadlock``), was declined by a stage with the
#   workload running on (``refused``), lost the application in a stage the
#   tool owns (``lost``), or could not be carried out by the harness (``unknown``);
TRIAL_STATUSES: tuple[str, ...] = ("completed", "deadlock", "refused", "lost", "unknown")
# - the verdict's outcome, from the checker: whether the recovery was correct.
#   ``refused`` and ``unknown`` pass through from the status unless a finding
#   makes the trial ``invalid``.
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
    backend: str  # the arm's, beside it in the stored form for readers of trial files
    receiver_mode: str  # likewise
    arm: Arm  # stored as its dict; a dict given here (a trial file, a Ray request) becomes the Arm
    plan: dict[str, Any]
    # A stored spec without these fields reads them at the scenario's defaults (harness/model/schema.py).
    watchdog_s: float = schema.default("run.watchdog_s")
    trial_timeout_s: float = schema.default("run.trial_timeout_s")
    stage_timeout_s: float = schema.default("run.stage_timeout_s")
    prepare_timeout_s: float = schema.default("run.prepare_timeout_s")
    images_dir: str = schema.default("pipeline.images_dir")
    keep_images: bool = schema.default("pipeline.keep_images")
    variant: str = ""  # the sweep point (``state_size=4096``) when a sweep runs several in one run
    # Where the workload's module was found (workload_api.import_roots): the workload process, replay and
    # analyze import it from there, whatever their working directory or PYTHONPATH.
    workload_path: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.arm, dict):  # the stored form: back to the one type every reader uses
            self.arm = Arm.from_dict({"backend": self.backend, "receiver_mode": self.receiver_mode, **self.arm})
        if (self.arm.backend, self.arm.receiver_mode) != (self.backend, self.receiver_mode):
            raise InvalidArgument(f"trial spec {self.trial_id}: backend/receiver_mode {self.backend}/{self.receiver_mode} "
                                  f"differ from its arm's {self.arm.backend}/{self.arm.receiver_mode}")

    def cut_plan(self) -> CutPlan:
        """The plan as a :class:`CutPlan`."""
        return CutPlan.from_dict(self.plan)

    def workload_class(self) -> "type[workload_api.Workload]":
        """The workload class this spec runs, from where the run found it (``workload_path``): every reader of a
        spec gets its workload here. Raises :class:`~cutbench.errors.WorkloadError` when it cannot be loaded."""
        return workload_api.load(self.workload, self.workload_path)

    def reference_key(self) -> str:
        """The key of this spec's ground truth (:func:`~cutbench.workloads.api.reference_key`: its workload, its
        parameters and the array backend they resolve to), which a recorded reference is stored and found by."""
        cls = self.workload_class()
        return workload_api.reference_key(cls.name, self.params, workload_api.resolve_array(cls, self.array))

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
        return spec.validated()

    def validated(self) -> "TrialSpec":
        """This spec, once its plan is known executable by its workload (:meth:`CutPlan.validate_for`).

        Raises :class:`InvalidArgument` for an unknown workload or a plan it cannot run.
        """
        try:
            cls_ = self.workload_class()
        except workload_api.WorkloadError as exc:
            raise InvalidArgument(f"trial spec: workload: {exc}") from None
        self.cut_plan().validate_for(tuple(cls_.phases), self.params.get("ops"))
        return self


@dataclass
class TrialRecord:
    """What the runner observed in one trial: the checker's input besides the effects.

    Stored as a dict in ``trials/<id>.json`` (:meth:`to_dict`) and read back
    with :meth:`from_dict`, which checks the fields a verdict depends on.
    """

    trial_id: str = ""
    status: str = "unknown"  # one of TRIAL_STATUSES
    error: str = ""
    failed_stage: str = ""
    exit_code: int | None = None
    restores: int = 0
    cut_outcomes: list[dict[str, Any]] = field(default_factory=list)  # each a CutOutcome as a dict
    report: dict[str, Any] | None = None  # the workload's final report (None: it never reported)
    marker_op: int = 0  # the workload's durable commit marker
    progress_op: int | None = None
    progress_phase: str = ""
    workload_domains: list[str] = field(default_factory=list)
    covered_domains: list[str] = field(default_factory=list)
    # Domains the workload's semantic adapters joined at every cut that was restored (they bring them back).
    joined_domains: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)  # what backends measured (image_bytes, gpu_bytes, ...)
    log_tail: str = ""
    # One recovery-cut certificate per certified cut (model.certificate.Certificate.to_dict
    # plus ``certify``, ``restore_decided``, ``restored``); empty when pipeline.certify is off.
    certificates: list[dict[str, Any]] = field(default_factory=list)
    # Per cut: the workload's positions at each capture stage and the effects sent and
    # acknowledged at the image (runner.coordinator.TrialCoordinator.evidence_of).
    cut_evidence: list[dict[str, Any]] = field(default_factory=list)
    # How many times a workload process started from op 1 (ground truth: a restored image
    # or an application-level resume does not count). 1 in a trial that continued.
    fresh_starts: int = 1

    def __post_init__(self) -> None:
        if self.status not in TRIAL_STATUSES:
            raise InvalidArgument(f"trial record status = {self.status!r}: allowed {', '.join(TRIAL_STATUSES)}")

    @property
    def committed_op(self) -> int:
        """The workload's final committed op: ``report["host_op"]`` when it reported, else its durable marker."""
        if self.report and self.report.get("host_op") is not None:
            return int(self.report["host_op"])
        return int(self.marker_op or 0)

    @property
    def uncovered_domains(self) -> list[str]:
        """The domains the workload used that neither its backend's checkpoint holds nor its adapters joined
        (the external receiver aside), sorted."""
        return sorted(set(self.workload_domains) - set(self.covered_domains) - set(self.joined_domains) - {EXTERNAL})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ``record`` of ``trials/<id>.json``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: "dict[str, Any] | TrialRecord") -> "TrialRecord":
        """A record from its stored form; unknown keys are ignored, missing ones take their defaults.

        Raises :class:`InvalidArgument` when a field has the wrong type.
        """
        if isinstance(data, TrialRecord):
            return data
        if not isinstance(data, dict):
            raise InvalidArgument(f"trial record: expected a mapping, got {type(data).__name__}")
        # None stands for "absent" (TOML and old records drop keys), except the report, where None means "never reported".
        known = {f: data[f] for f in cls.__dataclass_fields__ if f in data and (data[f] is not None or f == "report")}
        for key in ("restores", "marker_op", "fresh_starts"):
            if key in known:
                try:
                    known[key] = int(known[key] or 0)
                except (TypeError, ValueError):
                    raise InvalidArgument(f"trial record {key} = {known[key]!r}: expected an integer") from None
        return cls(**known)


@dataclass
class TrialResult:
    """A finished trial: its record (one row of ``trials.parquet``), timeline and effects."""

    spec: TrialSpec
    record: TrialRecord
    timeline: list[dict[str, Any]]
    effects: pd.DataFrame
    verdict: Verdict


def spec_for(scenario: Scenario, arm: Arm, plan: CutPlan, index: int) -> TrialSpec:
    """The :class:`TrialSpec` of trial number ``index``: ``plan`` under ``arm`` of ``scenario``.

    Raises :class:`InvalidArgument` for a plan the workload cannot execute, as a stored spec would on replay.
    """
    return TrialSpec(
        trial_id=f"t{index:04d}",
        index=index,
        workload=scenario.workload,
        array=scenario.array,
        params=dict(scenario.params),
        backend=arm.backend,
        receiver_mode=arm.receiver_mode,
        arm=arm,
        plan=plan.to_dict(),
        watchdog_s=scenario.watchdog_s,
        trial_timeout_s=scenario.trial_timeout_s,
        stage_timeout_s=scenario.stage_timeout_s,
        prepare_timeout_s=scenario.prepare_timeout_s,
        images_dir=scenario.images_dir,
        keep_images=scenario.keep_images,
        workload_path=list(workload_api.import_roots(scenario.workload_class())),
    ).validated()

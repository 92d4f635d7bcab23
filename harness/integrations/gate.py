"""The CI gate: run a scenario (or one arm of it, or one trial) and judge the result against a threshold.

Used by the pytest plugin (:mod:`cutbench.harness.integrations.pytest_plugin`) and usable from any
Python test runner. A gate passes when the invalid recovery rate is at most
``max_invalid_rate`` and no trial ended ``unknown`` (a trial without a
verdict is never counted as passing). Its failure message names every failing
trial with its findings and the ``cutbench replay`` command that reruns it.
"""

from __future__ import annotations

import glob
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.harness.model import schema
from cutbench.harness.model.scenario import Arm, Scenario, load_scenario, toml_value
from cutbench.harness.reports.summary import RunVerdict, failing_trials, findings_text, pct, replay_command, run_verdict

MAX_LISTED = 10  # failing trials named in a message and in the JUnit properties


def find_scenarios(patterns: list[str], base: Path | None = None) -> list[Path]:
    """Scenario files matching ``patterns`` (paths or globs; relative ones tried against ``base`` first)."""
    found: list[Path] = []
    for pattern in patterns:
        candidates = [Path(pattern)] if Path(pattern).is_absolute() else ([base / pattern] if base else []) + [Path(pattern)]
        hits: list[Path] = []
        for cand in candidates:
            hits = sorted(Path(p) for p in glob.glob(str(cand))) if any(c in str(cand) for c in "*?[") else ([cand] if cand.is_file() else [])
            if hits:
                break
        if not hits:
            raise InvalidArgument(f"cutbench scenario {pattern!r}: no such file")
        found += [h for h in hits if h not in found]
    return found


def load(path: Path, backends: list[str] | None = None, overrides: list[str] | None = None) -> Scenario:
    """Load a scenario, with ``pipeline.backends`` replaced by ``backends`` when given."""
    extra = list(overrides or [])
    if backends:
        extra.append("pipeline.backends=" + toml_value(list(backends)))
    return load_scenario(path, extra)


def restrict(scenario: Scenario, arm: Arm) -> Scenario:
    """The scenario narrowed to one arm (same plans as in the full run: plan seeds depend on the arm only)."""
    return replace(scenario, backends=(arm.backend,), modes=(arm.receiver_mode,), faults=(arm.fault,),
                   crash_after_ms=(arm.crash_after_ms,), split_window_ms=(arm.split_window_ms,),
                   rank_skew_ms=(arm.rank_skew_ms,), restore_targets=(arm.restore_target,), variants=())


def gate_points(scenario: Scenario) -> list[tuple[str, Scenario, Arm]]:
    """Every ``(label, scenario, arm)`` a gate runs: one per arm, of each ``[[variants]]`` entry when there are any.

    Labels read ``criu/idempotent/kill``, or ``variant:criu/idempotent/kill``.
    """
    subs = scenario.variants or (scenario,)
    return [(f"{s.variant}:{a.label()}" if s.variant else a.label(), s, a) for s in subs for a in s.arms()]


def point_by_label(scenario: Scenario, label: str) -> tuple[Scenario, Arm]:
    """The ``(scenario, arm)`` of :func:`gate_points` labelled ``label``; raise InvalidArgument naming those that exist."""
    points = {lab: (s, a) for lab, s, a in gate_points(scenario)}
    if label not in points:
        raise InvalidArgument(f"arm {label!r}: scenario {scenario.name!r} has {', '.join(points)}")
    return points[label]


@dataclass
class GateResult:
    """A run judged against the gate: verdict, threshold, and what failed."""

    label: str
    run_dir: Path
    verdict: RunVerdict
    max_invalid_rate: float
    complete: bool
    failing: list[dict[str, Any]] = field(default_factory=list)  # trial_id, plan, outcome, findings, replay
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def message(self) -> str:
        """The gate's verdict for a human: why it failed, each failing trial and how to replay it."""
        v = self.verdict
        head = (f"cutbench gate {'passed' if self.passed else 'FAILED'} for {self.label}: invalid recovery rate "
                f"{pct(v.rate)} (95% CI {pct(v.low)}–{pct(v.high)}), allowed {pct(self.max_invalid_rate)}; "
                + ", ".join(f"{k} {n}" for k, n in v.counts.items()))
        lines = [head] + [f"  - {p}" for p in self.problems]
        for f in self.failing[:MAX_LISTED]:
            lines.append(f"  {f['trial_id']} {f['plan']}: {f['outcome']} — {f['findings']}")
            lines.append(f"    replay: {f['replay']}")
        if len(self.failing) > MAX_LISTED:
            lines.append(f"  … {len(self.failing) - MAX_LISTED} more failing trials (see the report)")
        lines.append(f"  report: {self.run_dir / 'report.html'}")
        return "\n".join(lines)

    def properties(self) -> list[tuple[str, str]]:
        """``(name, value)`` pairs for JUnit XML ``<property>`` elements."""
        v = self.verdict
        props = [
            ("cutbench_gate", "passed" if self.passed else "failed"),
            ("cutbench_run_dir", str(self.run_dir)),
            ("cutbench_complete", str(self.complete).lower()),
            ("cutbench_invalid_rate", "nan" if math.isnan(v.rate) else f"{v.rate:.6f}"),
            ("cutbench_rate_low", f"{v.low:.6f}"),
            ("cutbench_rate_high", f"{v.high:.6f}"),
            ("cutbench_max_invalid_rate", f"{self.max_invalid_rate:.6f}"),
        ]
        props += [(f"cutbench_{k}", str(n)) for k, n in v.counts.items()]
        for f in self.failing[:MAX_LISTED]:
            props.append(("cutbench_finding", f"{f['trial_id']} {f['outcome']}: {f['findings']}"))
            props.append(("cutbench_replay", f["replay"]))
        return props


def evaluate(outcome: Any, max_invalid_rate: float, label: str) -> GateResult:
    """Judge a runner ``RunOutcome`` against the gate."""
    if not 0.0 <= max_invalid_rate <= 1.0:
        raise InvalidArgument(f"max invalid rate = {max_invalid_rate!r}: expected a fraction between 0 and 1")
    trials = outcome.trials
    v = run_verdict(trials)
    run_dir = outcome.run.path
    failing = [
        {"trial_id": r["trial_id"], "plan": r["plan"], "outcome": r["outcome"], "findings": findings_text(r),
         "replay": replay_command(run_dir, r["trial_id"])}
        for r in failing_trials(trials).to_dict("records")
    ]
    problems = []
    if not v.with_verdict and not v.counts["refused"]:
        problems.append("no trial reached a verdict")
    if v.with_verdict and v.rate > max_invalid_rate:
        problems.append(f"invalid recovery rate {pct(v.rate)} exceeds {pct(max_invalid_rate)} ({v.counts['invalid']} invalid trials)")
    if v.counts["unknown"]:
        problems.append(f"{v.counts['unknown']} trials ended unknown (the harness or the tool failed; never counted as valid)")
    if not outcome.complete:
        problems.append("the run was interrupted (partial)")
    return GateResult(label, run_dir, v, max_invalid_rate, outcome.complete, failing, problems)


def run_arm(scenario: Scenario, arm: Arm, results_root: str | Path) -> Any:
    """Run one arm of ``scenario``; return the runner's ``RunOutcome``.

    Raises :class:`Unavailable` when the arm's backend cannot run here or
    does not support the arm's fault.
    """
    from cutbench.harness.generator.scheduler import build_specs
    from cutbench.harness.runner.run import check_backends, execute

    narrowed = restrict(scenario, arm)
    arms, skipped = check_backends(replace(narrowed, skip_unavailable=False))
    if not arms:
        raise Unavailable(skipped[0]["reason"] if skipped else f"arm {arm.label()} cannot run here")
    if scenario.plan_source == "hypothesis":
        from cutbench.harness.runner.run import run_scenario

        return run_scenario(narrowed, results_root)
    slug = "-".join(x for x in (scenario.variant, arm.label()) if x).replace("/", "_").replace("+", "_")
    specs = [replace(s, variant=scenario.variant) for s in build_specs(narrowed, arms)]
    return execute(narrowed, specs, results_root, name=f"{scenario.name}-{slug}")


@dataclass
class TrialOutcome:
    """One trial run through the gate fixture: its verdict, record and where it is stored."""

    run_dir: Path
    trial_id: str
    outcome: str
    findings: list[dict[str, Any]]
    record: dict[str, Any]

    @property
    def valid(self) -> bool:
        """True when the trial's outcome is ``valid``."""
        return self.outcome == "valid"

    @property
    def trial_file(self) -> Path:
        """The stored trial JSON (what ``cutbench replay`` takes)."""
        return self.run_dir / "trials" / f"{self.trial_id}.json"

    @property
    def replay_command(self) -> str:
        """The command that reruns this trial."""
        return replay_command(self.run_dir, self.trial_id)


def parse_plan(plan: Any, arm: Arm) -> Any:
    """A :class:`CutPlan` from a CutPlan, its dict form, or ``"OP/PHASE"`` (several joined by ``;``) shaped by ``arm``."""
    from cutbench.harness.model.plan import CutPlan
    from cutbench.harness.generator.scheduler import cut_from_position

    if isinstance(plan, CutPlan):
        return plan
    if isinstance(plan, dict):
        return CutPlan.from_dict(plan)
    if isinstance(plan, str):
        cuts = []
        for part in plan.split(";"):
            op, sep, phase = part.strip().partition("/")
            if not sep or not op.strip().isdigit():
                raise InvalidArgument(f"plan {plan!r}: expected OP/PHASE, e.g. '3/publish'")
            cuts.append(cut_from_position(arm, int(op), phase.strip()))
        return CutPlan(tuple(cuts))
    raise InvalidArgument(f"plan = {plan!r}: expected 'OP/PHASE', a plan dict or a CutPlan")


# The defaults are a scenario file's (harness/model/schema.py); a list field's is its first value.
def run_trial(results_root: str | Path, plan: Any = "3/publish", *, workload: str = schema.default("workload.name"),
              params: dict[str, Any] | None = None, array: str = schema.default("workload.array"),
              backend: str = schema.default("pipeline.backends")[0], receiver_mode: str = schema.default("receiver.modes")[0],
              fault: str = schema.default("pipeline.faults")[0], crash_after_ms: float = schema.default("pipeline.crash_after_ms")[0],
              split_window_ms: float = schema.default("pipeline.split_window_ms")[0],
              watchdog_s: float = schema.default("run.watchdog_s"), trial_timeout_s: float = schema.default("run.trial_timeout_s"),
              stage_timeout_s: float = schema.default("run.stage_timeout_s")) -> TrialOutcome:
    """Run one trial and store it as a run of one trial; return its :class:`TrialOutcome`.

    Arguments are validated as a scenario file's would be (InvalidArgument
    names the bad one); an unavailable backend raises :class:`Unavailable`.
    """
    from cutbench.harness.model.trial import TrialSpec
    from cutbench.harness.runner.run import check_backends, execute
    from cutbench.harness.model.trial import spec_for
    from cutbench.harness.model.scenario import parse_scenario

    scen = parse_scenario({
        "name": "trial",
        "workload": {"name": workload, "array": array, "params": dict(params or {})},
        "receiver": {"modes": [receiver_mode]},
        "pipeline": {"backends": [backend], "faults": [fault], "crash_after_ms": [crash_after_ms], "split_window_ms": [split_window_ms]},
        "run": {"watchdog_s": watchdog_s, "trial_timeout_s": trial_timeout_s, "stage_timeout_s": stage_timeout_s},
    })
    arms, skipped = check_backends(scen)
    if not arms:
        raise Unavailable(skipped[0]["reason"] if skipped else f"backend {backend!r} cannot run here")
    arm = arms[0]
    cut_plan = parse_plan(plan, arm)
    spec = spec_for(scen, arm, cut_plan, 1)
    TrialSpec.from_dict(spec.to_dict())  # validates the plan against the workload's phases and ops
    outcome = execute(scen, [spec], results_root, name=f"trial-{cut_plan.describe().split(' ')[0].replace('/', '-')}")
    records = outcome.run.trial_records()
    if not records:
        raise KeyboardInterrupt  # the only way execute returns without the trial: interrupted
    rec = records[0]
    return TrialOutcome(outcome.run.path, spec.trial_id, rec["verdict"]["outcome"], rec["verdict"]["findings"], rec["record"])

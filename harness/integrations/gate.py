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
from cutbench.harness.reports.explain import explain, resume_flag
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
    return load_scenario(path, [*(overrides or []), *([backends_override(backends)] if backends else [])])


def backends_override(backends: list[str]) -> str:
    """The ``--set`` override that replaces a scenario's ``pipeline.backends`` with ``backends``."""
    return "pipeline.backends=" + toml_value(list(backends))


def restrict(scenario: Scenario, arm: Arm) -> Scenario:
    """The scenario narrowed to one arm (same plans as in the full run: plan seeds depend on the arm only)."""
    return scenario.narrowed(arm)


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
    # trial_id, plan, outcome, findings (kinds and ops, for JUnit's properties), words (as summary.md says it), replay
    failing: list[dict[str, Any]] = field(default_factory=list)
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
            lines.append(f"  {f['trial_id']} {f['plan']}: {f['outcome']} — {f['words']}")
            lines.append(f"    replay: {f['replay']}")
        if len(self.failing) > MAX_LISTED:
            lines.append(f"  … {len(self.failing) - MAX_LISTED} more failing trials (see the report)")
        lines.append(f"  report: {self.run_dir / 'report.html'}")
        return "\n".join(lines)

    def properties(self) -> list[tuple[str, str]]:
        """Return ``(name, value)`` pairs for JUnit XML ``<property>`` elements."""
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
    meta = outcome.run.meta()
    v = run_verdict(trials, meta)
    run_dir = outcome.run.path
    effects = outcome.run.table("effects") if not trials.empty else None
    # In the command line's words (summary.md's): what the cut did and what went wrong, alike findings together.
    failing = [
        {"trial_id": r["trial_id"], "plan": r["plan"], "outcome": r["outcome"], "findings": findings_text(r),
         "words": explain(r, effects, resume=resume_flag(meta, str(r.get("variant") or ""))) or findings_text(r),
         "replay": replay_command(run_dir, r["trial_id"])}
        for r in failing_trials(trials).to_dict("records")
    ]
    problems = []
    if not v.with_verdict and not v.counts["refused"]:
        problems.append("no trial reached a verdict")
    elif not v.with_verdict and not v.counts["unknown"] and v.label != "valid":
        problems.append(f"{v.text}: every one of the {v.counts['refused']} trials was refused")
    if v.with_verdict and v.rate > max_invalid_rate:
        problems.append(f"invalid recovery rate {pct(v.rate)} exceeds {pct(max_invalid_rate)} ({v.counts['invalid']} invalid trials)")
    if v.counts["unknown"]:
        problems.append(f"{v.counts['unknown']} trials ended unknown (the harness or the tool failed; never counted as valid)")
    if not outcome.complete:
        problems.append("the run was interrupted (partial)")
    stopped_at = outcome.run.meta().get("first_invalid")
    if stopped_at and max_invalid_rate > 0:  # a rate over a run cut short at its first failure overstates it
        problems.append(f"the run stopped at its first invalid trial ({stopped_at}; run.stop_at_first_invalid), so "
                        f"its rate is no measure to hold to {pct(max_invalid_rate)}: allow 0 or run every plan")
    return GateResult(label, run_dir, v, max_invalid_rate, outcome.complete, failing, problems)


def check(scenario: Scenario) -> None:
    """Refuse what a run of ``scenario`` would refuse as bad input before any trial (a program's missing file or
    command, a program under a tool it cannot run under), so that a gate says it at collection, in one line.
    Raises :class:`InvalidArgument`; what this machine lacks is said when the arm runs."""
    from cutbench.harness.runner.checks import check_backends, check_programs

    for sub in scenario.variants or (scenario,):
        try:
            check_backends(sub)
        except Unavailable:
            pass  # the machine's, not the scenario's: the arm fails, or skips with --cutbench-allow-skip
        check_programs([(sub.workload_class(), sub.params)])


def run_arm(scenario: Scenario, arm: Arm, results_root: str | Path,
            references: dict[str, Any] | None = None) -> Any:
    """Run one arm of ``scenario``; return the runner's ``RunOutcome``.

    ``references``: ground truth recorded by earlier arms, by reference key (a gate session's), used instead of
    recording it again and updated with what this arm recorded.
    Raises :class:`Unavailable` when the arm's backend cannot run here or
    does not support the arm's fault.
    """
    from cutbench.harness.generator.scheduler import build_specs
    from cutbench.harness.nemesis import Backends
    from cutbench.harness.runner.run import RunOptions, execute
    from cutbench.harness.runner.checks import check_backends

    narrowed = restrict(scenario, arm)
    backends = Backends()
    arms, skipped = check_backends(replace(narrowed, skip_unavailable=False), backends)
    if not arms:
        raise Unavailable(skipped[0]["reason"] if skipped else f"arm {arm.label()} cannot run here")
    if scenario.plan_source == "hypothesis":
        from cutbench.harness.runner.run import run_scenario

        return run_scenario(narrowed, results_root)
    slug = "-".join(x for x in (scenario.variant, arm.label()) if x).replace("/", "_").replace("+", "_")
    specs = [replace(s, variant=scenario.variant) for s in build_specs(narrowed, arms)]
    outcome = execute(narrowed, specs, results_root,
                      RunOptions(name=f"{scenario.name}-{slug}", backends=backends, references=references))
    if references is not None:
        from cutbench.workloads.api import RecordedReference

        references.update({k: RecordedReference.from_dict(d) for k, d in outcome.run.references().items()})
    return outcome


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


# ``run_trial``'s keywords and the scenario fields each one sets: a list field gets a list of one value.
TRIAL_KEYWORDS: dict[str, str] = {
    "workload": "workload.name", "params": "workload.params", "array": "workload.array",
    "backend": "pipeline.backends", "receiver_mode": "receiver.modes", "fault": "pipeline.faults",
    "crash_after_ms": "pipeline.crash_after_ms", "split_window_ms": "pipeline.split_window_ms",
    "rank_skew_ms": "pipeline.rank_skew_ms", "restore_target": "pipeline.restore_targets", "certify": "pipeline.certify",
    "watchdog_s": "run.watchdog_s", "trial_timeout_s": "run.trial_timeout_s", "stage_timeout_s": "run.stage_timeout_s",
}


def trial_overrides(keywords: dict[str, Any]) -> list[str]:
    """Return ``run_trial``'s keywords as ``--set`` overrides (``workload.params`` one key each, so a scenario's others
    stay); InvalidArgument naming an unknown keyword and the known ones."""
    unknown = sorted(set(keywords) - set(TRIAL_KEYWORDS))
    if unknown:
        raise InvalidArgument(f"cutbench_trial: unknown keyword(s) {', '.join(unknown)}; allowed: scenario, arm, "
                              + ", ".join(TRIAL_KEYWORDS))
    out = []
    for name, value in keywords.items():
        key = TRIAL_KEYWORDS[name]
        if name == "params":
            if not isinstance(value, dict):
                raise InvalidArgument(f"params = {value!r}: expected a dict of the workload's parameters")
            out += [f"{key}.{k}={toml_value(v)}" for k, v in value.items()]
        else:
            listed = isinstance(schema.default(key), tuple) and not isinstance(value, (list, tuple))
            out.append(f"{key}={toml_value([value] if listed else value)}")
    return out


def trial_scenario(scenario: str | Path | None, overrides: list[str] | None = None, **keywords: Any) -> Scenario:
    """The scenario one trial is drawn from: the file ``scenario`` with ``overrides`` and ``keywords`` applied,
    or, with no file, a scenario of ``keywords`` alone, which must then name the workload.

    There is no default workload: a gate that silently ran another program than the one under test would
    pass for the wrong reason. Raises :class:`InvalidArgument` naming what is missing or wrong.
    """
    extra = [*(overrides or []), *trial_overrides(keywords)]
    if scenario is not None:
        return load_scenario(scenario, extra)
    if keywords.get("workload") is None:
        raise InvalidArgument("cutbench_trial: no workload named: pass workload='NAME' (or 'module:Class'), "
                              "or mark the test @pytest.mark.cutbench(scenario='…') to take it from a scenario")
    return load_scenario({"name": "trial"}, extra)


def run_trial(results_root: str | Path, scen: Scenario, plan: Any = "3/publish", *,
              arm: str | None = None) -> TrialOutcome:
    """Run one trial of ``scen`` and store it as a run of one trial; return its :class:`TrialOutcome`.

    ``scen`` is the scenario the trial is drawn from (built by :func:`trial_scenario` from a file, overrides
    and the ``cutbench_trial`` keywords, validated there once). When it has several arms (variants included),
    ``arm`` names one by its gate label (``variant:criu/idempotent/kill``); InvalidArgument otherwise. An
    unavailable backend raises :class:`Unavailable`.
    """
    from cutbench.harness.model.trial import spec_for
    from cutbench.harness.runner.run import RunOptions, execute
    from cutbench.harness.nemesis import Backends
    from cutbench.harness.runner.checks import check_backends

    points = gate_points(scen)
    if arm is not None:
        sub, chosen = point_by_label(scen, arm)
    elif len(points) == 1:
        _label, sub, chosen = points[0]
    else:
        raise InvalidArgument(f"scenario {scen.name!r} has {len(points)} arms ({', '.join(p[0] for p in points)}): "
                              "pass arm='LABEL', or narrow it with fault=, receiver_mode=, backend=, …")
    narrowed = sub.narrowed(chosen)
    backends = Backends()
    arms, skipped = check_backends(narrowed, backends)
    if not arms:
        raise Unavailable(skipped[0]["reason"] if skipped else f"backend {chosen.backend!r} cannot run here")
    cut_plan = parse_plan(plan, arms[0])
    spec = replace(spec_for(narrowed, arms[0], cut_plan, 1), variant=sub.variant)
    name = f"trial-{cut_plan.describe().split(' ')[0].replace('/', '-')}"
    outcome = execute(narrowed, [spec], results_root, RunOptions(name=name, backends=backends))
    records = outcome.run.trial_records()
    if not records:
        raise KeyboardInterrupt  # the only way execute returns without the trial: interrupted
    rec = records[0]
    return TrialOutcome(outcome.run.path, spec.trial_id, rec["verdict"]["outcome"], rec["verdict"]["findings"], rec["record"])

"""The adaptive plan source: Hypothesis searches cut plans, one real trial per example.

Hypothesis draws a :class:`~cutbench.harness.model.plan.CutPlan` (one to ``plan.cuts_per_trial``
cuts at increasing positions; per cut a precise or asynchronous mode, an
async offset, a split window and a crash delay), the runner executes it as
an ordinary trial in the run's :class:`~cutbench.harness.runner.trial.Session`, and the
example fails when the oracle says ``invalid``. ``hypothesis.target()`` on the
number of findings steers generation toward plans that break more; shrinking
(``research`` profile) reduces a failing plan to the smallest one that still
fails — typically a single cut at the earliest point that shows the bug.

Under this source the scenario's value lists become per-cut choices: each
cut draws its crash delay from ``pipeline.crash_after_ms``, its split window
from ``pipeline.split_window_ms`` (backends with a split window only) and its
async offset from ``plan.async_offset_ms``; shrinking prefers the value listed
first. Arms are therefore backend × receiver mode × fault (× the GPU axes),
labelled with the largest values. List more values (``[0, 25, 50, 100]``)
for a finer search.

Every example is a fresh trial: a new receiver trial key, control file, work
directory and workload process, so no state of ours leaks from one example
into the next. What remains nondeterministic is the system under test (when
a ``leave_running`` crash lands); a failure Hypothesis cannot reproduce is
reported as flaky with the smallest failing plan seen, not raised.

Profiles (``plan.profile``):

* ``ci``: derandomized and seeded from ``plan.seed`` and the arm, at most
  ``plan.trials`` generated examples, no shrinking, no example database —
  stops at the first failure (Hypothesis may try one more example) and
  replays it once.
* ``research``: random, shrinking on, example database under
  ``<run>/hypothesis-db/<arm>/`` (failing examples are saved there and
  replayed first when the same database is searched again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, event, given, seed, settings, target
from hypothesis import example as hyp_example
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky

from cutbench.harness.generator import scheduler
from cutbench.errors import InvalidArgument
from cutbench.harness.model.plan import CutPlan
from cutbench.harness.model.trial import TrialResult
from cutbench.harness.model.scenario import PROFILES, Arm, Scenario

# Trials cost seconds: no deadline, no health check about slow data, and no
# `explain` phase (it re-runs variations of the failing example: more trials).
_COMMON: dict[str, Any] = dict(deadline=None, verbosity=Verbosity.quiet, print_blob=False,
                                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


@dataclass(frozen=True)
class SearchArm:
    """One arm of the search and the values its cuts choose from (ms, in the scenario's order)."""

    arm: Arm
    crash_after_ms: tuple[float, ...]
    split_window_ms: tuple[float, ...]


def search_arms(scenario: Scenario, arms: list[Arm] | None = None) -> list[SearchArm]:
    """The scenario's arms with the crash-delay and split-window axes folded into per-cut choices.

    ``arms`` (default ``scenario.arms()``) may be a runnable subset. Each
    returned arm carries the values its cuts draw from, so its label reads
    e.g. ``criu/at_least_once/leave_running+0|150ms``.
    """
    groups: dict[Arm, list[Arm]] = {}
    for arm in scenario.arms() if arms is None else arms:
        groups.setdefault(replace(arm, crash_after_ms=0.0, split_window_ms=0.0), []).append(arm)
    out = []
    for members in groups.values():
        crash = tuple(dict.fromkeys(a.crash_after_ms for a in members))
        split = tuple(dict.fromkeys(a.split_window_ms for a in members))
        bound = replace(members[0], crash_after_ms=max(crash), split_window_ms=max(split),
                        crash_choices=crash if len(crash) > 1 else (), split_choices=split if len(split) > 1 else ())
        out.append(SearchArm(bound, crash, split))
    return out


def _choice(values: tuple[float, ...]) -> st.SearchStrategy[float]:
    """One of ``values``; shrinks toward the first."""
    return st.just(float(values[0])) if len(values) == 1 else st.sampled_from([float(v) for v in values])


def plan_strategy(scenario: Scenario, sarm: SearchArm) -> st.SearchStrategy[CutPlan]:
    """Plans of 1 to ``cuts_per_trial`` cuts at distinct, increasing allowed positions.

    Shrinks toward fewer cuts, earlier positions, precise mode and the first
    listed value of every choice.
    """
    allowed = scheduler.positions(scenario)
    if not allowed:
        raise InvalidArgument("plan: no cut position to search (check plan.ops and plan.phases)")
    k_max = min(scenario.cuts_per_trial, len(allowed))
    mode_names = list(dict.fromkeys(m for m, _ in scheduler.modes(scenario)))
    offset_st = _choice(tuple(scenario.async_offset_ms))
    crash_st = _choice(sarm.crash_after_ms)
    split_st = _choice(sarm.split_window_ms)

    @st.composite
    def plans(draw: Any) -> CutPlan:
        picks = draw(st.lists(st.integers(0, len(allowed) - 1), min_size=1, max_size=k_max, unique=True))
        cuts = []
        picks = sorted(picks)
        for n, idx in enumerate(picks):
            op, phase = allowed[idx]
            # Only the last cut may be asynchronous: the plan stays executable (CutPlan.validate_for).
            mode = draw(st.sampled_from(mode_names)) if n == len(picks) - 1 else "precise"
            offset = draw(offset_st) if mode == "async" else 0.0
            cuts.append(scheduler.cut_from_position(sarm.arm, op, phase, mode=mode, async_offset_ms=offset,
                                                    crash_after_ms=draw(crash_st), split_window_ms=draw(split_st)))
        return CutPlan(tuple(cuts))

    return plans()


# -- signals: measured per trial, rising before a failure appears ---------------------

SIGNALS: dict[str, str] = {
    "in_flight": "effects the checkpointed process had sent without an acknowledgement at the image: "
                 "a restore that reconnects sends them again",
    "escaped": "effects the receiver recorded after the cut from a process that ran on (leave_running): "
               "each is one a rolled-back restore will send again",
    "epoch_skew": "cut points between the domains' captures (CUDA lock vs CRIU freeze): "
                  "state from two moments in one image",
    "uncovered": "state domains the workload uses that the backend's image does not hold",
    "findings": "findings of the trial (0 unless it already failed)",
}


def signals(result: TrialResult) -> dict[str, float]:
    """The trial's :data:`SIGNALS`, from its record (cut evidence, domains) and the receiver's effects."""
    rec = result.record
    evidence = rec.cut_evidence
    first = evidence[0] if evidence else {}
    sent, acked = int(first.get("sent_through", 0)), int(first.get("acked_through", 0))
    escaped = 0
    effects = result.effects
    if first and effects is not None and not effects.empty and "epoch" in effects:
        # Rows of the incarnation that was cut (epoch 0 for the first cut) past what its image had sent.
        late = effects[(effects["epoch"] == 0) & (effects["op_id"] > sent) & (effects["kind"] != "commit")]
        escaped = int(len(late))
    uncovered = rec.uncovered_domains
    return {
        "in_flight": float(max(0, sent - acked)),
        "escaped": float(escaped),
        "epoch_skew": float(max((e.get("epoch_steps", 0) for e in evidence), default=0)),
        "uncovered": float(len(uncovered)),
        "findings": float(len(result.verdict.findings)),
    }


def cells(plan: CutPlan) -> list[str]:
    """The coverage cells a plan visits within its arm: each cut's phase and mode."""
    return [f"{c.phase}/{c.mode}" for c in plan.cuts]


def explicit_plans(scenario: Scenario, sarm: SearchArm) -> list[CutPlan]:
    """Plans that together cut once at every phase (precise where allowed, first listed values): tried first.

    Swarm-style coverage: every phase of this arm (fault × receiver mode) is
    tried before generated plans. A plan holds up to ``plan.cuts_per_trial``
    of these cuts, each at the next op of the range (positions increase), so
    a failure confined to one phase costs at most ``phases / cuts_per_trial``
    trials (rounded up).
    """
    lo, hi = scenario.plan_ops
    phases = list(dict.fromkeys(phase for _, phase in scheduler.positions(scenario)))
    per_plan = max(1, min(scenario.cuts_per_trial, hi - lo + 1))
    # The first mode plan.cut_mode allows ("async" alone for a program, which cannot park) for a plan's last cut;
    # the cuts before it precise, as every plan must be (CutPlan.validate_for).
    last_mode, last_offset = scheduler.modes(scenario)[0]
    plans = []
    for start in range(0, len(phases), per_plan):
        group = phases[start:start + per_plan]
        plans.append(CutPlan(tuple(
            scheduler.cut_from_position(sarm.arm, lo + m, phase, crash_after_ms=sarm.crash_after_ms[0],
                                        split_window_ms=sarm.split_window_ms[0],
                                        mode=last_mode if m == len(group) - 1 else "precise",
                                        async_offset_ms=last_offset if m == len(group) - 1 else 0.0)
            for m, phase in enumerate(group))))
    return plans[: max(1, scenario.trials - 1)]


def profile_settings(profile: str, max_examples: int, database_dir: Path | None = None) -> settings:
    """The Hypothesis settings of ``profile`` (see the module docstring)."""
    if profile == "ci":
        return settings(max_examples=max_examples, derandomize=True, database=None,
                        phases=(Phase.explicit, Phase.generate, Phase.target), **_COMMON)
    if profile == "research":
        database = DirectoryBasedExampleDatabase(str(database_dir)) if database_dir is not None else None
        return settings(max_examples=max_examples, derandomize=False, database=database,
                        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink), **_COMMON)
    raise InvalidArgument(f"plan.profile = {profile!r}: allowed {', '.join(PROFILES)}")


class _InvalidRecovery(AssertionError):
    """Raised inside a Hypothesis example when the trial's verdict is ``invalid``."""

    def __init__(self, trial_id: str, plan: CutPlan, kinds: list[str]):
        super().__init__(f"{trial_id}: {plan.describe()} -> invalid ({', '.join(kinds)})")
        self.trial_id = trial_id
        self.plan = plan


@dataclass
class ArmSearch:
    """What the search found for one arm."""

    arm: str
    profile: str
    trials: int = 0
    failures: int = 0
    first_failure: int | None = None  # 1-based trial number within the arm
    first_failure_trial: str | None = None
    minimal_plan: dict[str, Any] | None = None  # the smallest failing plan (Hypothesis's final example)
    minimal_trial: str | None = None
    minimal_cuts: int | None = None
    reproduced: bool | None = None  # did the final replay of the minimal plan fail again?
    flaky: str = ""
    trial_ids: list[str] = field(default_factory=list)
    coverage: dict[str, int] = field(default_factory=dict)  # cell (phase/mode of a cut) -> trials that cut there
    signal_history: list[dict[str, Any]] = field(default_factory=list)  # per trial: id, cell, outcome, signals

    def note(self, result: TrialResult) -> dict[str, float]:
        """Account for one finished trial of this arm; return its signals."""
        self.trials += 1
        self.trial_ids.append(result.spec.trial_id)
        where = cells(result.spec.cut_plan())
        for c in where:
            self.coverage[c] = self.coverage.get(c, 0) + 1
        sig = signals(result)
        self.signal_history.append({"trial": result.spec.trial_id, "cells": where, "outcome": result.verdict.outcome, **sig})
        if result.verdict.outcome == "invalid":
            self.failures += 1
            if self.first_failure is None:
                self.first_failure, self.first_failure_trial = self.trials, result.spec.trial_id
            self._minimal(result.spec.cut_plan(), result.spec.trial_id)
        return sig

    def _minimal(self, plan: CutPlan, trial_id: str) -> None:
        self.minimal_plan, self.minimal_trial, self.minimal_cuts = plan.to_dict(), trial_id, len(plan.cuts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``search.json``, ``run.toml``)."""
        return asdict(self)


def search_arm(scenario: Scenario, sarm: SearchArm, run_plan: Callable[[CutPlan], TrialResult],
               database_dir: Path | None = None) -> ArmSearch:
    """Let Hypothesis search plans for one arm; ``run_plan`` runs one trial. Returns the :class:`ArmSearch`."""
    found = ArmSearch(sarm.arm.label(), scenario.profile)

    explicit = explicit_plans(scenario, sarm)

    def example(plan: CutPlan) -> None:
        result = run_plan(plan)
        sig = found.note(result)
        for c in cells(plan):
            event(f"cell {c}")
        for name, value in sig.items():
            target(value, label=name)  # several labelled targets: Hypothesis climbs each
            if value and name != "findings":
                event(f"signal {name}")
        if result.verdict.outcome == "invalid":
            raise _InvalidRecovery(result.spec.trial_id, plan, sorted({f.kind for f in result.verdict.findings}))

    test = given(plan_strategy(scenario, sarm))(example)
    for plan in reversed(explicit):  # decorators apply inside out: the first phase runs first
        test = hyp_example(plan)(test)
    # The budget is the arm's trials, explicit ones included.
    test = profile_settings(scenario.profile, max(1, scenario.trials - len(explicit)), database_dir)(test)
    if scenario.profile == "ci":
        # Hypothesis's seed also switches the example database off: ci only.
        test = seed(scheduler.arm_seed(scenario, sarm.arm))(test)
    try:
        test()
    except _InvalidRecovery as exc:
        found._minimal(exc.plan, exc.trial_id)
        if exc.plan in explicit:
            # An explicit example fails once and is raised as it is (already a single
            # cut at the first listed values): replay it once, as Hypothesis replays its own.
            again = run_plan(exc.plan)
            found.note(again)
            found.reproduced = again.verdict.outcome == "invalid"
        else:
            # Hypothesis re-runs its final (smallest) failing example to raise it:
            # that run just failed again, so this is the reproduced minimal plan.
            found.reproduced = True
    except Flaky as exc:
        # The smallest failing plan passed when Hypothesis replayed it: the
        # failure depends on timing (e.g. where a crash lands). Keep the plan.
        found.reproduced = False
        found.flaky = f"{type(exc).__name__}: the smallest failing plan passed when replayed (timing-dependent)"
    return found

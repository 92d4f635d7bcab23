"""The hypothesis plan source.

Unit tests drive :func:`cutbench.harness.generator.search.search_arm` with a stand-in system (a
pure rule deciding which plans break) to pin the profiles' behaviour:
ci stops at the first failure and replays it, research shrinks, flakiness
is reported, not raised. The CRIU test is the must-show: on ``counter`` with
``at_least_once`` + ``leave_running`` the search finds a failing plan and
shrinks it to a single cut.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cutbench.harness.checker import oracle
from cutbench.harness.generator import search
from cutbench.harness.model.plan import Cut, CutPlan
from cutbench.harness.model.trial import TrialRecord, TrialResult
from cutbench.workloads.counter import Counter
from cutbench.harness.model.trial import spec_for
from cutbench.harness.model.scenario import parse_scenario


def scenario(profile: str, trials: int = 20, **pipeline):
    return parse_scenario({
        "workload": {"name": "counter", "params": {"ops": 5}},
        "pipeline": {"faults": ["leave_running"], "crash_after_ms": [0, 150], **pipeline},
        "plan": {"source": "hypothesis", "profile": profile, "ops": [1, 5], "cuts_per_trial": 3, "trials": trials},
    })


class System:
    """A stand-in for the trials: ``breaks(plan)`` decides the verdict; every call is one trial."""

    def __init__(self, scen, breaks):
        self.scen, self.breaks, self.plans = scen, breaks, []

    def __call__(self, plan: CutPlan) -> TrialResult:
        self.plans.append(plan)
        spec = spec_for(self.scen, search.search_arms(self.scen)[0].arm, plan, len(self.plans))
        bad = self.breaks(plan)
        verdict = oracle.Verdict("invalid", (oracle.Finding("duplicate", 1, "x"),)) if bad else oracle.Verdict("valid")
        return TrialResult(spec, TrialRecord(status="completed"), [], pd.DataFrame(), verdict)


def late_publish(plan: CutPlan) -> bool:
    return any(c.op >= 4 and c.phase == "publish" for c in plan.cuts)


def test_ci_profile_stops_at_the_first_failure_replays_it_and_is_deterministic():
    scen = scenario("ci", trials=60)
    runs = []
    for _ in range(2):
        system = System(scen, late_publish)
        found = search.search_arm(scen, search.search_arms(scen)[0], system)
        runs.append([p.to_json() for p in system.plans])
        assert found.first_failure is not None and found.first_failure <= 60
        # No shrinking: at most one more example, then the replay of the failing plan.
        assert found.first_failure < found.trials <= found.first_failure + 2
        assert system.plans[-1] == system.plans[found.first_failure - 1]
        assert found.reproduced is True and found.flaky == ""
        assert CutPlan.from_dict(found.minimal_plan) == system.plans[-1]
    assert runs[0] == runs[1], "derandomized and seeded: the same plans each time"


def test_ci_profile_runs_the_whole_budget_when_nothing_fails():
    scen = scenario("ci", trials=15)
    system = System(scen, lambda plan: False)
    found = search.search_arm(scen, search.search_arms(scen)[0], system)
    assert (found.trials, found.first_failure, found.minimal_plan, found.reproduced) == (15, None, None, None)


def test_research_profile_shrinks_to_the_single_smallest_cut(tmp_path: Path):
    """Breaks when any cut lets the process run 150 ms before the crash: the simplest example
    (one cut, 0 ms) passes; whatever failing plan is found shrinks to one cut at 1/admit."""
    scen = scenario("research", trials=30)
    system = System(scen, lambda plan: any(c.crash_after_ms >= 150 for c in plan.cuts))
    found = search.search_arm(scen, search.search_arms(scen)[0], system, tmp_path / "db")
    assert found.failures >= 2 and found.reproduced
    assert CutPlan.from_dict(found.minimal_plan) == CutPlan((Cut(1, "admit", fault="leave_running", crash_after_ms=150.0),))
    assert any((tmp_path / "db").rglob("*")), "failing examples are saved in the run's example database"


def test_a_failure_that_does_not_reproduce_is_reported_as_flaky_not_raised():
    scen = scenario("ci", trials=40)
    seen: set[str] = set()

    def once(plan: CutPlan) -> bool:  # fails the first time a late publish cut is tried, never again
        if late_publish(plan) and plan.to_json() not in seen:
            seen.add(plan.to_json())
            return True
        return False

    found = search.search_arm(scen, search.search_arms(scen)[0], System(scen, once))
    assert found.reproduced is False and "Flaky" in found.flaky
    assert found.minimal_plan is not None and found.first_failure is not None


def test_unknown_profile_is_refused():
    from cutbench.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="plan.profile"):
        search.profile_settings("fast", 5)


def test_every_drawn_plan_is_executable():
    """Over many draws (mixed precise and async cuts, up to 3 per plan) no plan is one the runner cannot carry out."""
    from hypothesis import HealthCheck, given, settings

    scen = parse_scenario({
        "workload": {"name": "counter", "params": {"ops": 5}},
        "pipeline": {"faults": ["kill"]},
        "plan": {"source": "hypothesis", "ops": [1, 5], "cuts_per_trial": 3, "cut_mode": "mixed", "async_offset_ms": [0, 5]},
    })
    phases = tuple(Counter.phases)

    @settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(search.plan_strategy(scen, search.search_arms(scen)[0]))
    def check(plan):
        plan.validate_for(phases, 5)
        assert all(c.mode == "precise" for c in plan.cuts[:-1])

    check()


def test_static_sources_draw_only_executable_plans():
    from cutbench.harness.generator import scheduler

    for source in ("exhaustive", "random"):
        scen = parse_scenario({
            "workload": {"name": "counter", "params": {"ops": 4}},
            "plan": {"source": source, "ops": [1, 3], "phases": ["launch", "publish"], "cuts_per_trial": 2,
                     "cut_mode": "mixed", "trials": 200},
        })
        plans = scheduler.plans(scen, scen.arms()[0])
        assert plans and all(p.validate_for(tuple(Counter.phases), 4) for p in plans)
        assert any(p.cuts[-1].mode == "async" for p in plans) and any(len(p.cuts) == 2 for p in plans)


def test_every_phase_is_tried_before_generated_plans_and_signals_are_recorded():
    scen = scenario("ci", trials=12)
    system = System(scen, lambda plan: False)
    found = search.search_arm(scen, search.search_arms(scen)[0], system)
    # cuts_per_trial = 3: three plans of up to three cuts each visit all seven phases, in order.
    first = [c.phase for p in system.plans[:3] for c in p.cuts]
    assert first == list(Counter.phases), first
    assert found.trials == 12 and set(found.coverage) >= {f"{p}/precise" for p in Counter.phases}
    assert {c for h in found.signal_history for c in h["cells"]} >= {f"{p}/precise" for p in Counter.phases}
    assert set(found.signal_history[0]) >= set(search.SIGNALS)


def test_a_plan_with_a_cut_after_an_async_one_is_refused():
    from cutbench.errors import InvalidArgument

    plan = CutPlan((Cut(1, "launch", mode="async"), Cut(2, "publish")))
    with pytest.raises(InvalidArgument, match="follows an asynchronous cut"):
        plan.validate_for(tuple(Counter.phases), 5)

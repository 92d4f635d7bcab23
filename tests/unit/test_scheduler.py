"""The generator: exhaustive, random and the hypothesis strategy are pure and well-formed;
multi-cut and asynchronous plans really run in tests/criu/test_scheduler.py."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings

from cutbench.errors import InvalidArgument
from cutbench.harness.generator import scheduler
from cutbench.harness.generator import search
from cutbench.harness.model.plan import Cut, CutPlan
from cutbench.harness.model.trial import spec_for
from cutbench.harness.model.scenario import parse_scenario
from cutbench.workloads.api import load


def scenario(**plan):
    data = {"workload": {"name": "counter", "params": {"ops": 6}}, "pipeline": {"faults": ["kill", "leave_running"]},
            "plan": {"ops": [2, 3], "trials": 12, **plan}}
    return parse_scenario(data)


def test_positions_follow_the_workload_order_whatever_the_scenario_order():
    s = scenario(phases=["commit", "admit", "publish"])
    assert scheduler.positions(s) == [(2, "admit"), (2, "publish"), (2, "commit"), (3, "admit"), (3, "publish"), (3, "commit")]


def test_exhaustive_enumerates_every_position_then_every_pair():
    s = scenario(phases=["admit", "publish", "ack"], cuts_per_trial=2)
    arm = s.arms()[0]
    plans = scheduler.exhaustive(s, arm)
    n = len(scheduler.positions(s))
    assert len(plans) == n + n * (n - 1) // 2
    assert [len(p.cuts) for p in plans] == [1] * n + [2] * (n * (n - 1) // 2)
    assert len({p.to_json() for p in plans}) == len(plans)
    for p in plans:
        p.validate_for(load("counter").phases, ops=6)
        assert all(c.fault == arm.fault for c in p.cuts)


def test_exhaustive_multiplies_async_offsets_in_mixed_mode():
    s = scenario(phases=["admit"], cut_mode="mixed", async_offset_ms=[0, 5])
    plans = scheduler.exhaustive(s, s.arms()[0])
    assert [(p.cuts[0].op, p.cuts[0].mode, p.cuts[0].async_offset_ms) for p in plans] == [
        (op, m, off) for op in (2, 3) for m, off in (("precise", 0.0), ("async", 0.0), ("async", 5.0))]


def test_random_is_seeded_per_arm_and_well_formed():
    s = scenario(source="random", cuts_per_trial=3)
    a, b = s.arms()
    first = scheduler.random_plans(s, a)
    assert first == scheduler.random_plans(s, a), "same seed, same plans"
    assert first != scheduler.random_plans(replace(s, seed=1), a), "another seed, other plans"
    assert first != scheduler.random_plans(s, b), "each arm has its own stream"
    only_a = replace(s, faults=("kill",))
    assert scheduler.random_plans(only_a, only_a.arms()[0]) == first, "removing an arm does not change the others"
    assert len(first) == s.trials
    assert {len(p.cuts) for p in first} <= {1, 2, 3} and len({len(p.cuts) for p in first}) > 1
    for p in first:
        p.validate_for(load("counter").phases, ops=6)


def test_search_arms_fold_crash_delays_into_per_cut_choices():
    s = parse_scenario({"workload": {"name": "counter"}, "receiver": {"modes": ["at_least_once", "idempotent"]},
                        "pipeline": {"faults": ["kill", "leave_running"], "crash_after_ms": [0, 50, 150]}})
    assert len(s.arms()) == 2 * (1 + 3)
    sarms = search.search_arms(s)
    assert len(sarms) == 4
    lr = [a for a in sarms if a.arm.fault == "leave_running"]
    # The label names every delay its cuts draw from, not one of them.
    assert {a.arm.label() for a in lr} == {"criu/at_least_once/leave_running+0|50|150ms", "criu/idempotent/leave_running+0|50|150ms"}
    assert all(a.crash_after_ms == (0.0, 50.0, 150.0) for a in lr)


SEARCH_SCENARIO = parse_scenario({
    "workload": {"name": "echo_peer", "params": {"ops": 5}},
    "pipeline": {"faults": ["leave_running"], "crash_after_ms": [0, 40, 200]},
    "plan": {"source": "hypothesis", "ops": [1, 5], "cuts_per_trial": 3, "cut_mode": "mixed", "async_offset_ms": [0, 3]},
})
SEARCH_ARM = search.search_arms(SEARCH_SCENARIO)[0]


@settings(max_examples=200)
@given(search.plan_strategy(SEARCH_SCENARIO, SEARCH_ARM))
def test_the_hypothesis_strategy_draws_only_runnable_plans(plan):
    assert 1 <= len(plan.cuts) <= 3
    plan.validate_for(load("echo_peer").phases, ops=5)
    for cut in plan.cuts:
        assert cut.fault == "leave_running" and cut.crash_after_ms in (0.0, 40.0, 200.0)
        assert cut.async_offset_ms in ((0.0,) if cut.mode == "precise" else (0.0, 3.0))
        assert cut.split_window_ms == 0.0  # criu has no split window


def test_exhaustive_and_random_are_pure():
    s = scenario(source="random", cuts_per_trial=2)
    for arm in s.arms():
        assert scheduler.exhaustive(s, arm) == scheduler.exhaustive(s, arm)
        assert scheduler.plans(s, arm) == scheduler.random_plans(s, arm)
    assert list(itertools.chain.from_iterable(scheduler.plans(s, a) for a in s.arms()))


def test_a_plan_with_a_cut_after_an_async_one_is_refused_when_its_spec_is_made():
    """An async dump lands wherever the workload then is, possibly past the next cut's point: such a plan
    never becomes a trial (as a stored spec with it is refused on replay)."""
    s = scenario()
    plan = CutPlan((Cut(2, "admit", mode="async", async_offset_ms=50, fault="kill"), Cut(2, "launch", fault="kill")))
    with pytest.raises(InvalidArgument, match=r"plan.cuts\[1\] follows an asynchronous cut"):
        spec_for(s, s.arms()[0], plan, 1)


def test_every_static_source_keeps_earlier_cuts_precise_and_only_the_last_async():
    """The same rule in exhaustive and random: with only async cuts asked for, a multi-cut plan's
    earlier cuts are precise and its last is async (none is dropped), and the exhaustive count is exact."""
    s = scenario(phases=["admit", "publish"], cuts_per_trial=2, cut_mode="async", async_offset_ms=[5.0, 10.0])
    arm = s.arms()[0]
    n = len(scheduler.positions(s))
    plans = scheduler.exhaustive(s, arm)
    assert len(plans) == n * 2 + n * (n - 1) // 2 * 2  # 2 offsets for the (last) async cut
    for source in (plans, scheduler.random_plans(s, arm)):
        for plan in source:
            assert [c.mode for c in plan.cuts] == ["precise"] * (len(plan.cuts) - 1) + ["async"]
    assert any(len(p.cuts) == 2 for p in plans)


def test_periodic_plans_cut_every_interval_and_zero_means_no_checkpointer():
    from cutbench.harness.generator.scheduler import periodic
    from cutbench.harness.model.scenario import Arm, parse_scenario

    base = {"workload": {"name": "counter", "params": {"ops": 20}}, "pipeline": {"faults": ["none"]},
            "plan": {"source": "periodic", "ops": [5, 20], "phases": ["commit", "admit"], "interval_ops": 5, "trials": 3}}
    scen = parse_scenario(base)
    arm = Arm(backend="criu", receiver_mode="idempotent", fault="none", crash_after_ms=0.0, split_window_ms=0.0)
    plans = periodic(scen, arm)
    assert len(plans) == 3 and len(set(p.to_json() for p in plans)) == 1  # repeats of one plan
    assert [(c.op, c.phase, c.mode) for c in plans[0].cuts] == [(5, "admit", "precise"), (10, "admit", "precise"),
                                                               (15, "admit", "precise"), (20, "admit", "precise")]
    native = parse_scenario({**base, "plan": {**base["plan"], "interval_ops": 0}})
    assert [p.cuts for p in periodic(native, arm)] == [()] * 3


def test_periodic_refuses_a_plan_with_too_many_cuts_and_a_negative_interval():
    from cutbench.errors import InvalidArgument
    from cutbench.harness.generator.scheduler import periodic
    from cutbench.harness.model.scenario import Arm, parse_scenario

    plan = {"source": "periodic", "ops": [1, 50_000], "phases": ["commit"], "interval_ops": 1}
    scen = parse_scenario({"workload": {"name": "counter", "params": {"ops": 50_000}}, "plan": plan})
    with pytest.raises(InvalidArgument, match="plan.interval_ops"):
        periodic(scen, Arm(backend="criu", receiver_mode="idempotent", fault="kill", crash_after_ms=0.0, split_window_ms=0.0))
    with pytest.raises(InvalidArgument, match="plan.interval_ops"):
        parse_scenario({"workload": {"name": "counter", "params": {"ops": 50_000}}, "plan": {**plan, "interval_ops": -1}})


def test_a_run_of_chosen_variants_only_and_an_unknown_variant_named():
    from cutbench.errors import InvalidArgument
    from cutbench.harness.model.scenario import load_scenario, select_variants
    from tests.conftest import REPO

    scen = load_scenario(REPO / "scenarios" / "criteria-cpu.toml")
    picked = select_variants(scen, ["soak-native", "soak-every-20"])
    assert [v.variant for v in picked.variants] == ["soak-native", "soak-every-20"]
    assert select_variants(scen, []) is scen
    with pytest.raises(InvalidArgument, match="soak-native"):
        select_variants(scen, ["nope"])

"""Sweep axes (``cutbench sweep --axis``): which fields widen the arms, which make variants, which cannot vary."""

from __future__ import annotations

import pytest

from cutbench.errors import InvalidArgument
from cutbench.harness.generator import sweep
from tests.conftest import REPO

QUICK = REPO / "scenarios" / "quick.toml"


def test_every_arm_axis_of_the_scenario_widens_the_arms_and_makes_no_variant():
    assert sweep.ARM_AXES == {"pipeline.backends", "receiver.modes", "pipeline.faults", "pipeline.crash_after_ms",
                              "pipeline.split_window_ms", "pipeline.rank_skew_ms", "pipeline.restore_targets",
                              "pipeline.certify", "pipeline.criu_options"}
    [point] = sweep.expand(QUICK, [sweep.parse_axis("pipeline.certify=off,audit")])
    assert point.variant == "" and point.scenario.certify == ("off", "audit")
    assert {arm.certify for arm in point.scenario.arms()} == {"off", "audit"}


def test_a_field_the_run_has_one_value_of_cannot_be_swept():
    for key in ("receiver.store", "run.jobs", "run.executor", "run.ray_address", "run.trials_per_gpu", "name"):
        with pytest.raises(InvalidArgument, match=f"--axis {key}: cannot be swept in one run"):
            sweep.parse_axis(f"{key}=1,2")


def test_any_other_field_makes_one_variant_per_value():
    points = sweep.expand(QUICK, [sweep.parse_axis("workload.params.seed=1,2")])
    assert [p.variant for p in points] == ["seed=1", "seed=2"]
    assert [p.scenario.params["seed"] for p in points] == [1, 2]

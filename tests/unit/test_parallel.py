"""``run.jobs`` / ``--jobs`` / ``--cutbench-jobs``: validated at the boundary, resolved by the runner (no CRIU)."""

from __future__ import annotations

import os

import pytest

from cutbench.errors import InvalidArgument
from cutbench.harness.model.scenario import LIMITS, check_jobs, load_scenario, parse_scenario
from cutbench.harness.runner.executors import resolve_jobs
from tests.conftest import REPO

QUICK = REPO / "scenarios" / "quick.toml"


@pytest.mark.parametrize("value", [1, 2, LIMITS["run.jobs"], "auto"])
def test_jobs_accepts_a_whole_number_or_auto(value):
    assert check_jobs("run.jobs", value) == value
    assert load_scenario(QUICK, [f"run.jobs={value}"]).jobs == value


@pytest.mark.parametrize("text", ["0", "-1", str(LIMITS["run.jobs"] + 1), "2.5", "true", "'2'", "AUTO", "[2]", "all"])
def test_a_bad_jobs_value_names_the_field_and_the_fix(text):
    with pytest.raises(InvalidArgument) as exc:
        load_scenario(QUICK, [f"run.jobs={text}"])
    message = str(exc.value)
    assert message.startswith("run.jobs = ") and '"auto"' in message and "whole number" in message


def test_jobs_defaults_to_one_and_trials_per_gpu_is_checked():
    scenario = load_scenario(QUICK)
    assert (scenario.jobs, scenario.trials_per_gpu) == (1, 1)
    assert load_scenario(QUICK, ["run.trials_per_gpu=4"]).trials_per_gpu == 4
    for bad in ("0", "1.5", f"{LIMITS['run.trials_per_gpu'] + 1}"):
        with pytest.raises(InvalidArgument, match=r"^run\.trials_per_gpu = "):
            load_scenario(QUICK, [f"run.trials_per_gpu={bad}"])


def test_a_variant_may_not_set_its_own_jobs():
    """One run has one pool of workers: ``run.jobs`` is top-level (variants inherit it), never a variant's own."""
    base = {"name": "v", "workload": {"name": "counter", "array": "numpy"}, "run": {"jobs": 2},
            "variants": [{"name": "a"}, {"name": "b", "plan": {"ops": [2, 2]}}]}
    parsed = parse_scenario(base)
    assert parsed.jobs == 2 and [v.jobs for v in parsed.variants] == [2, 2]
    for key in ("jobs", "trials_per_gpu"):
        bad = {**base, "variants": [{"name": "a", "run": {key: 3}}]}
        with pytest.raises(InvalidArgument, match=rf"variants\[0\]\.run\.{key}: .*set run\.{key} at the top level"):
            parse_scenario(bad)


def test_auto_is_gpus_times_trials_per_gpu_on_a_gpu_host_else_the_cpus():
    scenario = load_scenario(QUICK, ["run.jobs=auto", "run.trials_per_gpu=3"])
    two_gpus = {"gpu": {"gpus": [{"index": 0}, {"index": 1}]}}
    assert resolve_jobs(scenario, two_gpus) == 6
    assert resolve_jobs(scenario, {"gpu": {"gpus": [], "cupy": {"device_count": 1}}}) == 3
    assert resolve_jobs(scenario, {"gpu": {"gpus": []}}) == len(os.sched_getaffinity(0))
    assert resolve_jobs(load_scenario(QUICK, ["run.jobs=5"]), two_gpus) == 5  # a number is taken as it is



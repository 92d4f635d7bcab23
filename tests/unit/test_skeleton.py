"""Unit tests of the walking skeleton's pure parts: control file, counter reference, scenarios."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import numpy as np
import pytest

from cutbench.errors import InvalidArgument
from cutbench.harness.model.scenario import load_scenario, parse_scenario
from cutbench.workloads import counter
from cutbench.workloads.control import PHASES, ControlFile

REPO = Path(__file__).resolve().parents[2]


def test_counter_reference_matches_a_real_run():
    """The reference computes the same digests as applying the ops for real (different code path: no cache)."""
    ref = counter.Counter.reference({"seed": 3, "state_size": 257})
    state = counter.initial_state(np, 257, 3)
    assert ref.checksum(0) == counter.digest(np, state)
    for op in range(1, 11):
        counter.apply_op(np, state, 3, op)
        assert ref.payload(op) == counter.digest(np, state)
    # Different seeds give different histories.
    assert counter.Counter.reference({"seed": 4, "state_size": 257}).payload(5) != ref.payload(5)


def _park_child(path: str) -> None:
    from cutbench.workloads.runtime import Runtime, WorkloadConfig

    cfg = WorkloadConfig("counter", "t", {}, path, "", "", "/dev/null")
    rt = Runtime(config=cfg, control=ControlFile(path), xp=np)
    for op in (1, 2):
        for phase in PHASES:
            rt.point(op, phase)


def test_control_file_parks_and_releases_across_processes(tmp_path: Path):
    control = ControlFile.create(tmp_path / "control")
    seq = control.arm(2, PHASES.index("publish"))
    child = multiprocessing.get_context("fork").Process(target=_park_child, args=(str(control.path),))
    child.start()
    deadline = time.monotonic() + 10
    while control.get("parked_seq") < seq:
        assert time.monotonic() < deadline, "workload never parked"
        time.sleep(0.005)
    assert (control.get("progress_op"), control.get("progress_phase")) == (2, PHASES.index("publish"))
    time.sleep(0.05)
    assert child.is_alive(), "a parked workload must wait for the release"
    control.release(seq)
    child.join(10)
    assert child.exitcode == 0
    assert control.get("progress_count") == 2 * len(PHASES)


def test_quick_scenario_resolves_to_28_trials():
    from cutbench.harness.generator import scheduler

    scen = load_scenario(REPO / "scenarios" / "quick.toml")
    assert sum(len(scheduler.plans(scen, arm)) for arm in scen.arms()) == 28


@pytest.mark.parametrize(
    "data, field, allowed",
    [
        ({"workload": {"name": "countr"}}, "workload.name", "counter"),
        ({"workload": {"params": {"opz": 3}}}, "workload.params", "ops"),
        ({"plan": {"phases": ["admit", "publsh"]}}, "plan.phases", "publish"),
        ({"plan": {"source": "clever"}}, "plan.source", "hypothesis"),
        ({"receiver": {"modes": ["exactly_once"]}}, "receiver.modes", "idempotent"),
        ({"pipeline": {"faults": ["reboot"]}}, "pipeline.faults", "leave_running"),
        ({"pipeline": {"backends": ["kubernetes"]}}, "pipeline.backends", "cuda+criu"),
        ({"run": {"watchdog": 3}}, "run.watchdog", "watchdog_s"),
        ({"plan": {"ops": [3, 99]}, "workload": {"params": {"ops": 6}}}, "plan.ops", "workload.params.ops"),
    ],
)
def test_bad_scenarios_name_the_field_and_the_allowed_values(data, field, allowed):
    with pytest.raises(InvalidArgument) as info:
        parse_scenario(data)
    assert field in str(info.value) and allowed in str(info.value)


def test_include_and_override(tmp_path: Path):
    base = tmp_path / "base.toml"
    base.write_text('[workload]\nname = "counter"\nparams = { ops = 5 }\n[plan]\nsource = "exhaustive"\n')
    child = tmp_path / "child.toml"
    child.write_text('include = "base.toml"\nname = "child"\n[plan]\nops = [2, 3]\n')
    scen = load_scenario(child, ["plan.source=random", "plan.trials=4"])
    assert (scen.name, scen.params["ops"], scen.plan_ops, scen.plan_source, scen.trials) == ("child", 5, (2, 3), "random", 4)

"""What ``cutbench run --resume`` refuses, and the stored forms it rebuilds a run from (pure; the runs are in
``tests/criu/test_resume.py``)."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from cutbench.errors import InvalidArgument
from cutbench.harness.environment.record import fingerprint
from cutbench.harness.model.scenario import Scenario, load_scenario
from cutbench.harness.model.trial import Finding, TrialRecord, TrialResult, TrialSpec, Verdict
from cutbench.harness.runner.resume import resume_refusal
from cutbench.harness.store.rundir import as_stored
from cutbench.harness.store.tables import result_from_file, trial_file
from tests.conftest import REPO

ENV = {"machine": "x86_64", "kernel": "6.1.0", "criu": {"version": "4.2.1"}}


def meta(**kw):
    scenario = load_scenario(REPO / "scenarios" / "quick.toml")
    base = {"status": "partial", "code_digest": "abc", "environment": ENV, "scenario": as_stored(scenario.to_dict())}
    return {**base, **kw}


def refusal(m, **kw):
    return resume_refusal(m, code_digest=kw.pop("code", "abc"), fingerprint=kw.pop("fp", fingerprint(ENV)), **kw)


def test_a_partial_run_of_this_code_on_this_machine_can_resume():
    assert refusal(meta()) is None
    assert refusal(meta(status="running")) is None  # a SIGKILLed harness never wrote its end


@pytest.mark.parametrize("changes, says", [
    ({"status": "complete"}, "the run is complete: nothing to resume"),
    ({"sweep": {"axes": {}}}, "it is a sweep"),
    ({"code_digest": ""}, "run.toml has no code_digest"),
    ({"code_digest": "def"}, "the code differs"),
])
def test_what_the_run_toml_says_can_refuse(changes, says):
    assert says in refusal(meta(**changes))


def test_another_machine_is_named_field_by_field():
    said = refusal(meta(), fp=fingerprint({**ENV, "kernel": "6.12.0"}))
    assert said == "the machine differs: kernel was '6.1.0', is '6.12.0'"


def test_a_store_that_outlives_the_run_and_a_matrix_run_cannot_resume():
    m = meta()
    m["scenario"]["store"] = "postgresql://localhost/cutbench"
    assert "still holds the killed attempt's deliveries" in refusal(m)
    assert "support-matrix run" in refusal(meta(matrix={"rows": []}))


def test_how_the_trials_run_may_differ_in_every_variant_too():
    scenario = load_scenario(REPO / "scenarios" / "all-workloads.toml")
    m = meta(scenario=as_stored(scenario.to_dict()))
    moved = replace(scenario, jobs=3, source_path="x.toml",
                    variants=tuple(replace(v, jobs=3, source_path="x.toml") for v in scenario.variants))
    assert scenario.variants and refusal(m, scenario=moved) is None
    seeded = replace(scenario, variants=tuple(replace(v, seed=9) for v in scenario.variants))
    assert refusal(m, scenario=seeded).startswith("the scenario differs from the run's: variants was")


def test_a_hypothesis_search_cannot_resume():
    m = meta()
    m["scenario"]["plan_source"] = "hypothesis"
    assert "plan source is hypothesis" in refusal(m)


def test_a_named_scenario_must_be_the_run_s_apart_from_how_many_trials_run_at_once():
    scenario = load_scenario(REPO / "scenarios" / "quick.toml")
    assert refusal(meta(), scenario=replace(scenario, jobs=4, source_path="elsewhere.toml")) is None
    assert refusal(meta(), scenario=replace(scenario, seed=7)) == "the scenario differs from the run's: seed was 0, is 7"


def test_a_stored_scenario_reads_back_as_the_scenario_that_ran():
    for name in ("quick.toml", "all-workloads.toml"):
        scenario = load_scenario(REPO / "scenarios" / name)
        assert Scenario.from_dict(as_stored(scenario.to_dict())) == scenario
    with pytest.raises(InvalidArgument, match="unknown field"):
        Scenario.from_dict({"name": "x", "colour": "red"})


def test_a_trial_file_gives_back_the_result_it_was_written_from():
    spec = TrialSpec("t0003", 3, "counter", "numpy", {"ops": 6}, "criu", "idempotent",
                     {"backend": "criu", "receiver_mode": "idempotent", "fault": "kill", "crash_after_ms": 0.0,
                      "split_window_ms": 0.0}, {"cuts": []})
    effects = pd.DataFrame([{"arrival_seq": 1, "op_id": 1, "epoch": 0, "decision": "applied", "received_at": 1.5},
                            {"arrival_seq": 2, "op_id": 2, "epoch": 1, "decision": "applied", "received_at": float("nan")}])
    result = TrialResult(spec, TrialRecord(trial_id="t0003", status="completed", exit_code=0),
                         [{"trial_id": "t0003", "stage": "spawn", "t_start": 0.0, "t_end": 0.1}], effects,
                         Verdict("invalid", (Finding("duplicate", 2, "applied 2 times"),)))
    back = result_from_file(json.loads(json.dumps(trial_file(result, "R", "sqlite"))))
    assert back.spec == spec and back.record == result.record and back.timeline == result.timeline
    assert back.verdict == result.verdict
    assert list(back.effects.columns) == list(effects.columns) and back.effects["op_id"].tolist() == [1, 2]
    assert back.effects["received_at"].isna().tolist() == [False, True]


def test_a_trial_file_without_its_rows_is_named_as_older():
    with pytest.raises(InvalidArgument, match="lacks timeline, effects"):
        result_from_file({"spec": {}, "record": {}, "verdict": {}})


def test_a_trials_row_times_the_stages_its_run_recorded_and_a_reader_finds_them_all():
    """The stage columns come from ``run.toml``'s ``backends`` (what the run stored), the adapters' first; a reader
    of the stored table (``cutbench compare``) finds exactly those, whatever other ``…_s`` column a row holds."""
    from cutbench.harness.store.tables import stage_columns, stored_stage_columns, trial_row
    from cutbench.workloads.adapters import VERBS

    stages = stage_columns({"criu": {"stages": ["criu_dump", "criu_restore"]},
                            "docker": {"stages": ["docker_checkpoint", "criu_restore"]}})
    assert stages == (*VERBS, "criu_dump", "criu_restore", "docker_checkpoint")
    spec = TrialSpec("t0001", 1, "counter", "numpy", {"ops": 6}, "criu", "idempotent",
                     {"backend": "criu", "receiver_mode": "idempotent", "fault": "kill", "crash_after_ms": 0.0,
                      "split_window_ms": 0.0}, {"cuts": []})
    record = TrialRecord(trial_id="t0001", status="completed", exit_code=0,
                         facts={"release_latency_median_s": 0.1, "release_latency_p99_s": 0.2})
    timeline = [{"trial_id": "t0001", "stage": "criu_dump", "t_start": 0.0, "t_end": 0.5, "duration_s": 0.5},
                {"trial_id": "t0001", "stage": "criu_dump", "t_start": 1.0, "t_end": 1.25, "duration_s": 0.25}]
    row = trial_row(TrialResult(spec, record, timeline, pd.DataFrame(), Verdict("valid", ())), stages)
    assert row["criu_dump_s"] == 0.75 and row["criu_restore_s"] is None
    assert stored_stage_columns(pd.DataFrame([row])) == [f"{s}_s" for s in stages]

"""``cutbench analyze`` recomputes every stored verdict; ``cutbench replay`` reruns a stored trial."""

from __future__ import annotations

import json

import pytest

from cutbench.harness.store.analysis import verdict_class, verdict_key, verdicts_by_plan


def test_verdict_comparisons():
    a = {"outcome": "invalid", "findings": [{"kind": "duplicate", "op": 3}, {"kind": "duplicate", "op": 4}]}
    b = {"outcome": "invalid", "findings": [{"kind": "duplicate", "op": 3}]}
    assert verdict_class(a) == verdict_class(b) and verdict_key(a) != verdict_key(b)
    c = {"outcome": "invalid", "findings": [{"kind": "missing", "op": 3}]}
    assert verdict_class(a) != verdict_class(c)


def test_verdicts_by_plan_are_the_outcome_and_the_kinds_of_finding_of_each_plan():
    import pandas as pd

    findings = [{"kind": "duplicate_effect", "op": 3}, {"kind": "duplicate_effect", "op": 4}, {"kind": "lost_ack", "op": 2}]
    trials = pd.DataFrame({"variant": ["", "seed=2"], "arm": ["criu/at_least_once/kill"] * 2,
                           "plan": ["3/publish kill", "3/publish kill"], "outcome": ["invalid", "valid"],
                           "findings": [json.dumps(findings), "[]"]})
    assert verdicts_by_plan(trials) == {
        ("", "criu/at_least_once/kill", "3/publish kill"): ("invalid", ("duplicate_effect", "lost_ack")),
        ("seed=2", "criu/at_least_once/kill", "3/publish kill"): ("valid", ()),
    }



def test_a_replayed_spec_reads_a_parameter_its_workload_gained_since_at_its_default(tmp_path, monkeypatch):
    """A program trial stored before ``workload.params.image`` existed replays: its spec runs with the default ("")
    (its programs' checks raised KeyError: 'image' before)."""
    from cutbench.harness.runner import replay as replay_mod
    from tests.conftest import REPO

    [path] = (REPO / "results" / "reference" / "programs" / "ticker").glob("*/trials/t0001.json")
    assert "image" not in replay_mod.read_trial_file(path)["spec"]["params"]
    ran = []

    def execute(scen, specs, *args, **kwargs):  # what the replay would run: its checks, no trial
        from cutbench.harness.runner.checks import check_programs

        check_programs([(s.workload_class(), s.params) for s in specs])
        ran.extend(specs)
        raise SystemExit

    monkeypatch.setattr(replay_mod, "execute", execute)
    with pytest.raises(SystemExit):
        replay_mod.replay(path, tmp_path)
    assert ran[0].params["image"] == ""

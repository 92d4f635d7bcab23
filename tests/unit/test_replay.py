"""``cutbench analyze`` recomputes every stored verdict; ``cutbench replay`` reruns a stored trial."""

from __future__ import annotations

import json

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

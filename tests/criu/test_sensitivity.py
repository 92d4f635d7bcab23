"""Sensitivity built into the suite: each known-bad variant is caught within a bounded number
of trials by its plan source, and its correct twin gives zero findings on the same plans.

Real CRIU runs (``criu``): if a change to the harness, the pipeline or the
oracle makes one of these go blind, this file fails. The variants are in
``workloads/variants.py`` and ``workloads/echo_peer.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from cutbench.harness.model.trial import TrialSpec
from cutbench.harness.runner.run import execute, run_scenario
from cutbench.harness.model.scenario import parse_scenario

pytestmark = pytest.mark.criu


@dataclass(frozen=True)
class Case:
    bad: str
    twin: str
    finding: str
    source: str  # plan source (cut_mode "async" for the asynchronous one)
    budget: int  # the bad variant must be caught within this many trials
    receiver: str = "idempotent"
    fault: str = "kill"
    plan: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)


CASES = [
    # A kill exactly between the mark and the send: exhaustive reaches it at the 5th position of op 2.
    Case("outbox_mark_before_send", "outbox", "missing", "exhaustive", budget=8, plan={"ops": [2, 3]}),
    # Any restore inside an op before its publish (4 of 7 positions): random finds one in a few trials.
    Case("resend_stale_digest", "resend", "mixed_epoch", "random", budget=8, receiver="at_least_once",
         plan={"ops": [2, 4], "trials": 8, "seed": 1}),
    # Any restore at all: asynchronous cuts, wherever the workload happens to be (ops left to run
    # after the cut: a dump, which takes tens of ms to freeze the process, must land before the end).
    Case("restore_hook_realloc", "restore_hook", "pointer_changed", "random", budget=2, receiver="at_least_once",
         plan={"ops": [2, 3], "trials": 3, "cut_mode": "async", "async_offset_ms": [0, 3]},
         params={"ops": 8, "op_interval_ms": 20.0}),
    # A rollback past a sent request (leave_running, cut after `send`): the seeded ci search.
    Case("echo_peer_noseq", "echo_peer", "deadlock", "hypothesis", budget=12, fault="leave_running",
         plan={"ops": [2, 3], "trials": 12, "phases": ["record", "send", "recv", "publish"], "profile": "ci"}),
]


def scenario_for(case: Case, workload: str):
    return parse_scenario({
        "name": workload,
        "workload": {"name": workload, "array": "numpy", "params": {"ops": 5, "state_size": 512, "seed": 2, "op_interval_ms": 10.0, **case.params}},
        "receiver": {"modes": [case.receiver]},
        "pipeline": {"backends": ["criu"], "faults": [case.fault], "crash_after_ms": [100]},
        "plan": {"source": case.source, **case.plan},
        "run": {"watchdog_s": 3, "stage_timeout_s": 20},
    })


def catch_bad(case: Case, root: Path) -> tuple[list[TrialSpec], int]:
    """Run the bad variant under its source until the first invalid trial; return the specs run and that trial's number."""
    scen = scenario_for(case, case.bad)
    if case.source != "hypothesis":  # the search stops each arm at its first failure; a list of plans is told to
        scen = replace(scen, stop_at_first_invalid=True)
    outcome = run_scenario(scen, root)
    records = outcome.run.trial_records()
    specs = [TrialSpec.from_dict(r["spec"]) for r in records]
    outcomes = [r["verdict"] for r in records]
    first = next((n for n, v in enumerate(outcomes, 1) if v["outcome"] == "invalid"), None)
    assert first is not None and first <= case.budget, (
        f"{case.bad} not caught within {case.budget} trials: {[v['outcome'] for v in outcomes]}")
    kinds = {f["kind"] for f in outcomes[first - 1]["findings"]}
    assert kinds == {case.finding}, f"{case.bad}: expected only {case.finding}, got {outcomes[first - 1]}"
    assert all(v["outcome"] != "unknown" for v in outcomes), [v for v in outcomes if v["outcome"] == "unknown"]
    if case.source != "hypothesis":  # it stopped there, and says so
        assert len(records) == first and outcome.run.meta()["first_invalid"] == first
    return specs, first


@pytest.mark.parametrize("case", CASES, ids=[c.bad for c in CASES])
def test_bad_variant_is_caught_and_its_twin_is_clean_on_the_same_plans(case: Case, criu, results_root: Path):
    specs, first = catch_bad(case, results_root / "bad")
    print(f"{case.bad}: caught at trial {first} by {case.source}")
    # The twin on exactly the plans the bad variant ran (up to and including the catch).
    twin_scen = scenario_for(case, case.twin)
    twin_specs = [replace(s, workload=case.twin) for s in specs[:first]]
    outcome = execute(twin_scen, twin_specs, results_root / "twin")
    bad = outcome.trials[outcome.trials["outcome"] != "valid"]
    assert bad.empty, f"{case.twin} must give zero findings on the same plans:\n{bad[['plan', 'outcome', 'findings', 'error']]}"
    assert len(outcome.trials) == first
    assert (outcome.trials["restores"] >= 1).all(), "every plan really restored the twin"

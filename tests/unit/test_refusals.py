"""A run whose every trial was refused tested nothing: exit 2 and a failed gate, unless the scenario expects it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cutbench.harness.integrations import gate
from cutbench.harness.reports.summary import run_verdict
from cutbench.harness.runner.run import RunOutcome
from cutbench.harness.store.rundir import RunDir
from tests.fixtures.run_fixtures import write_run


def _outcome(tmp_path: Path, outcomes: list[str], expect: bool) -> RunOutcome:
    trials = pd.DataFrame({"trial_id": [f"t{i:04d}" for i in range(1, len(outcomes) + 1)], "outcome": outcomes,
                           "arm": "criu/idempotent/kill", "plan": "2/publish kill", "findings": "[]", "error": ""})
    path = write_run(tmp_path, "refusals", {"status": "complete", "scenario": {"name": "r", "expect_refusals": expect}},
                     trials)
    return RunOutcome(RunDir.open(path), trials, True)


@pytest.mark.parametrize("expect", [False, True])
def test_a_run_of_refusals_is_a_verdict_only_when_the_scenario_expects_it(tmp_path: Path, expect: bool):
    outcome = _outcome(tmp_path, ["refused", "refused"], expect)
    result = gate.evaluate(outcome, 0.0, "r")
    verdict = run_verdict(outcome.trials, outcome.run.meta())
    if expect:
        assert outcome.exit_code() == 0 and result.passed and verdict.label == "valid"
    else:
        assert outcome.exit_code() == 2 and not result.passed and verdict.label == "unknown"
        assert "every one of the 2 trials was refused" in result.message()
        assert "pipeline.expect_refusals" in verdict.text


def test_some_refusals_beside_valid_trials_pass(tmp_path: Path):
    outcome = _outcome(tmp_path, ["refused", "valid"], False)
    assert outcome.exit_code() == 0 and gate.evaluate(outcome, 0.0, "r").passed

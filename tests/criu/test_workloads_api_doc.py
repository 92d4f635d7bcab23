"""The workload written from docs/workload-api.md alone, run through real CRIU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.criu
def test_the_example_scenario_runs_through_criu(criu, tally_dir: Path, results_root: Path):
    """The doc's scenario, one cut point: the control arm is valid, the rollback arm duplicates under at-least-once."""
    proc = subprocess.run(
        [sys.executable, "-m", "cutbench", "run", str(tally_dir / "tally.toml"), "--out", str(results_root),
         "--json", "--set", 'plan.phases=["commit"]'],
        capture_output=True, text=True, timeout=300, cwd=tally_dir,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    import pandas as pd

    trials = pd.read_parquet((results_root / "latest").resolve() / "trials.parquet")
    outcome = {row.arm: (row.outcome, json.loads(row.findings)) for row in trials.itertuples()}
    assert outcome["criu/idempotent/none"][0] == "valid"
    assert outcome["criu/idempotent/leave_running+100ms"][0] == "valid"
    kinds = {f["kind"] for f in outcome["criu/at_least_once/leave_running+100ms"][1]}
    assert kinds == {"duplicate"}

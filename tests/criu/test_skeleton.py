"""The walking skeleton end to end through real CRIU (marked ``criu``: must run in CI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, workload_processes

pytestmark = pytest.mark.criu

AFTER_PUBLISH = ("publish", "ack", "commit")


def _images_left(run_id: str) -> list[str]:
    return [p.name for p in Path("/dev/shm").glob(f"cutbench-{run_id}-*")]


def test_quick_scenario_through_real_criu(criu, results_root: Path):
    """``cutbench run scenarios/quick.toml``: every trial really dumped and restored; duplicates exactly where expected."""
    proc = subprocess.run(
        [sys.executable, "-m", "cutbench", "run", str(REPO / "scenarios" / "quick.toml"), "--out", str(results_root), "--json",
         "--jobs", "2"],  # a parallel run stores a serial one's verdicts (tests/criu/test_parallel.py)
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    run_dir = (results_root / "latest").resolve()
    trials = pd.read_parquet(run_dir / "trials.parquet")
    timeline = pd.read_parquet(run_dir / "timeline.parquet")
    print(trials[["trial_id", "arm", "cut_phase", "outcome", "duplicate", "criu_dump_s", "criu_restore_s"]].to_string())

    assert len(trials) == 28
    assert (trials["status"] != "unknown").all(), trials[trials["status"] == "unknown"][["trial_id", "error"]]
    # Every trial went through a real CRIU dump and restore.
    per_trial = timeline[timeline["result"] == "ok"].groupby("trial_id")["stage"].apply(set)
    assert all({"criu_dump", "criu_restore"} <= stages for stages in per_trial)
    assert (trials["restores"] == 1).all()

    alo_lr = trials[(trials["receiver_mode"] == "at_least_once") & (trials["fault"] == "leave_running")]
    late = alo_lr[alo_lr["cut_phase"].isin(AFTER_PUBLISH)]
    assert len(late) == 3 and (late["duplicate"] > 0).all()
    assert (trials[trials["receiver_mode"] == "idempotent"]["duplicate"] == 0).all()
    # A kill fault restores the connection intact: nothing is resent twice.
    assert (trials[trials["fault"] == "kill"]["outcome"] == "valid").all()

    assert proc.returncode == 1  # invalid recoveries were found
    # Processes of this run carry its run id in their command line (work directory).
    stray = [cmd for _, cmd in workload_processes() if run_dir.name in cmd]
    assert not stray, f"processes left behind: {stray}"
    assert not _images_left(run_dir.name), "an image directory was left behind"


def test_bad_scenario_exits_254_without_traceback(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[workload]\nname = "counter"\n[plan]\nphases = ["admit", "flush"]\n')
    proc = subprocess.run([sys.executable, "-m", "cutbench", "run", str(bad), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 254
    assert "plan.phases" in proc.stderr and "publish" in proc.stderr and "flush" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("*/run.toml")), "a rejected scenario must not create a run"


def test_unusable_criu_stops_the_run_with_a_clear_message(tmp_path: Path):
    """With no CRIU anywhere, ``run`` exits 254 and says how to fix it (no trial is attempted)."""
    env = dict(os.environ, CUTBENCH_CRIU_PREFIX=str(tmp_path / "no-criu"), PATH="/nonexistent")
    proc = subprocess.run([sys.executable, "-m", "cutbench", "run", str(REPO / "scenarios" / "quick.toml"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert proc.returncode == 254, proc.stderr
    assert "criu install" in proc.stderr and "Traceback" not in proc.stderr


def test_a_file_of_the_trial_held_open_across_the_cut_is_no_finding_against_the_tool(criu, tmp_path, monkeypatch):
    """CRIU cannot restore a file the image held open after it grew: when that file is the trial's own (the
    runtime's report being written, a workload that broke the rule), the trial is unknown, not the tool's loss."""
    from tests.fixtures.run_fixtures import cli

    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the workload process imports the fixture from tests/
    scenario = tmp_path / "held.toml"
    scenario.write_text("""
name = "held-file"
[workload]
name = "tests.fixtures.holds_file:HoldsFileOpen"
array = "numpy"
params = { ops = 6, state_size = 64, seed = 1, op_interval_ms = 30.0 }
[receiver]
modes = ["idempotent"]
[pipeline]
backends = ["criu"]
faults = ["leave_running"]
crash_after_ms = [150]
[plan]
source = "exhaustive"
ops = [2, 2]
phases = ["commit"]
""")
    proc = cli("run", str(scenario), "--out", str(tmp_path / "r"), "--json", env=dict(os.environ))
    assert proc.returncode == 2, proc.stderr[-2000:]  # unknown only: no verdict either way
    [row] = pd.read_parquet((tmp_path / "r" / "latest").resolve() / "trials.parquet").itertuples()
    assert row.outcome == "unknown" and row.process_lost == 0
    assert "held.txt, a file of the trial directory that changed after the dump" in row.error

"""``md_simulation`` through real CRIU on NumPy: its recorded ground truth, and what each tool makes of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.run_fixtures import cli

pytestmark = pytest.mark.criu

SCENARIO = """
name = "md"
[workload]
name = "md_simulation"
array = "numpy"
params = { ops = 8, particles = 216, CPT }
[receiver]
modes = ["idempotent"]
[pipeline]
backends = ["criu", "app", "restart"]
faults = ["kill", "leave_running"]
[plan]
source = "exhaustive"
ops = [4, 4]
phases = ["launch", "commit"]
"""


def run(tmp_path: Path, cpt: int):
    import pandas as pd

    scenario = tmp_path / "md.toml"
    scenario.write_text(SCENARIO.replace("CPT", f"cpt_every_ops = {cpt}"))
    out = cli("run", str(scenario), "--out", str(tmp_path / "r"), "--json", timeout=900)
    assert out.returncode in (0, 1), out.stderr[-3000:]
    run_dir = (tmp_path / "r" / "latest").resolve()
    return pd.read_parquet(run_dir / "trials.parquet"), run_dir


def test_a_system_level_restore_continues_the_simulation_bit_for_bit(criu, tmp_path: Path):
    trials, run_dir = run(tmp_path, 0)
    [ref] = list((run_dir / "references").glob("md_simulation-numpy-*.json"))
    recorded = json.loads(ref.read_text())
    assert recorded["runs"] == 2 and len(recorded["payloads"]) == 8  # two clean runs agreed on every step
    by = trials.groupby("backend")["outcome"].apply(set).to_dict()
    assert by["criu"] == {"valid"} and by["app"] == {"valid"}, trials[["arm", "plan", "outcome", "findings", "error"]]
    restart = trials[trials["backend"] == "restart"]
    assert (restart["outcome"] == "invalid").all() and (restart["restarted"] > 0).all()


def test_its_own_checkpoint_on_disk_is_state_no_process_image_holds(criu, tmp_path: Path):
    trials, _ = run(tmp_path, 2)
    criu_trials = trials[trials["backend"] == "criu"]
    assert (criu_trials["unsafe_acceptance"] > 0).all(), criu_trials[["plan", "outcome", "findings"]]
    assert (trials[trials["backend"] == "app"]["outcome"] == "valid").all()


MAXH = """
name = "md-maxh"
[workload]
name = "md_simulation"
array = "numpy"
params = { ops = 10, particles = 216, cpt_every_s = 0.25, continue_from_cpt = true, max_wall_s = 0.4, op_interval_ms = 120.0 }
[receiver]
modes = ["at_least_once"]
[pipeline]
backends = ["criu", "app"]
faults = ["kill"]
[plan]
source = "exhaustive"
ops = [7, 7]
phases = ["commit"]
"""


def test_a_run_that_stops_at_its_wall_time_limit_goes_on_from_its_checkpoint_through_every_cut(criu, tmp_path: Path):
    """GROMACS's -cpt and -maxh: a checkpoint every 0.25 s, and each run of the program lasts 0.4 s, writes md.cpt
    at its last step and is run again
    with it, so a 10-step trajectory takes several program images; the recorded references (two clean runs)
    agree, nothing is sent twice or lost across the restarts, and a CRIU cut and an app cut land in one of them."""
    import pandas as pd

    scenario = tmp_path / "maxh.toml"
    scenario.write_text(MAXH)
    out = cli("run", str(scenario), "--out", str(tmp_path / "r"), "--json", timeout=600)
    assert out.returncode in (0, 1), out.stderr[-3000:]
    run_dir = (tmp_path / "r" / "latest").resolve()
    [ref] = list((run_dir / "references").glob("md_simulation-numpy-*.json"))
    assert json.loads(ref.read_text())["runs"] == 2
    trials = pd.read_parquet(run_dir / "trials.parquet")
    for t in trials.itertuples():
        kinds = {f["kind"] for f in json.loads(t.findings)}
        # The checkpoint on disk is a domain CRIU's image does not hold: its coverage rule is the only finding.
        assert kinds <= ({"unsafe_acceptance"} if t.backend == "criu" else set()), (t.backend, t.findings)
        assert "load_state" in json.loads(t.startup), t.startup  # the last image went on from md.cpt

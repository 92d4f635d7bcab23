"""The hypothesis plan source through real CRIU: on ``counter`` with ``at_least_once`` +
``leave_running`` the search finds a failing plan and shrinks it to a single cut.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cutbench.harness.model.plan import Cut, CutPlan
from tests.conftest import REPO


@pytest.mark.criu
def test_hypothesis_finds_a_duplicate_on_counter_and_shrinks_it_to_one_cut(criu, tmp_path: Path):
    """The must-show, through the CLI: counter, at_least_once, leave_running, research profile.

    Cuts after ``commit``: a crash 0 ms later lands in the 200 ms op interval
    (nothing published after the cut: valid, and not a race), a crash 1000 ms
    later lets ops after the cut publish, and the restore publishes them again
    (duplicates), except after the last op. So the simplest example passes and
    every failing plan shrinks to the same single cut: 1/commit, +1000 ms. The
    margins are wide so that a loaded host (an xdist worker's neighbours)
    delays the crash well inside them: at 30 ms and +150 ms a late "+0 ms"
    crash let the next op publish, and the search shrank to two cuts."""
    scen = tmp_path / "hyp.toml"
    scen.write_text(
        'name = "hyp"\n'
        '[workload]\nname = "counter"\narray = "numpy"\nparams = { ops = 5, state_size = 512, seed = 3, op_interval_ms = 200.0 }\n'
        '[receiver]\nmodes = ["at_least_once"]\n'
        '[pipeline]\nbackends = ["criu"]\nfaults = ["leave_running"]\ncrash_after_ms = [0, 1000]\n'
        '[plan]\nsource = "hypothesis"\nprofile = "research"\nops = [1, 5]\nphases = ["commit"]\ncuts_per_trial = 2\ntrials = 10\n'
        '[run]\nwatchdog_s = 5\n'
    )
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "cutbench", "run", str(scen), "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=400, cwd=REPO)
    assert proc.returncode == 1, proc.stderr[-3000:]
    run = Path(json.loads(proc.stdout)["run_dir"])
    found = json.loads((run / "search.json").read_text())["arms"][0]
    trials = pd.read_parquet(run / "trials.parquet")
    print(trials[["trial_id", "plan", "outcome", "n_findings"]].to_string())
    print({k: found[k] for k in ("trials", "first_failure", "minimal_trial", "minimal_cuts", "reproduced", "flaky")})

    assert found["first_failure"] is not None
    assert found["minimal_cuts"] == 1
    minimal = CutPlan.from_dict(found["minimal_plan"])
    assert minimal == CutPlan((Cut(1, "commit", fault="leave_running", crash_after_ms=1000.0),))
    assert found["reproduced"] is True
    stored = json.loads((run / "trials" / f"{found['minimal_trial']}.json").read_text())
    assert stored["verdict"]["outcome"] == "invalid"
    assert {f["kind"] for f in stored["verdict"]["findings"]} == {"duplicate"}
    assert len(trials) == found["trials"] and (trials["outcome"] != "unknown").all()
    assert (run / "hypothesis-db").is_dir()
    assert "Hypothesis search (profile `research`)" in (run / "summary.md").read_text()

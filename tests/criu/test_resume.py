"""``cutbench run --resume``: a run whose harness was SIGKILLed continues to the tables an uninterrupted run writes.

The harness is killed at seeded random moments (after a random number of finished trials, a random
fraction of a second into the next), its leftovers are checked to be gone once the resume starts, and
the resumed run's verdicts are compared plan by plan with an uninterrupted run of the same scenario.
``benchmarks/resume_after_sigkill.py`` does the same at twenty moments.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from cutbench.harness.store.analysis import verdicts_by_plan
from cutbench.procs import processes_in
from tests.conftest import REPO
from tests.fixtures.run_fixtures import cli

pytestmark = pytest.mark.criu

# Eight CRIU trials of the quick counter: both faults, both receiver modes, two phases.
SMALL = ["--set", 'pipeline.backends=["criu"]', "--set", 'plan.phases=["publish", "commit"]', "--set", "plan.ops=[3, 3]"]


def start(out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cutbench", "run", str(REPO / "scenarios" / "quick.toml"), *SMALL,
                             "--out", str(out)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_after(proc: subprocess.Popen, out: Path, trials: int, delay_s: float) -> Path:
    """SIGKILL ``proc`` ``delay_s`` after its run has ``trials`` trial files; return the run directory."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        runs = [p for p in out.glob("2*") if p.is_dir()]
        if runs and len(list((runs[0] / "trials").glob("*.json"))) >= trials:
            time.sleep(delay_s)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            return runs[0]
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before it had {trials} trials")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the run did not reach {trials} trials within 240 s")


@pytest.fixture(scope="module")
def uninterrupted_run(criu, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    proc = cli("run", str(REPO / "scenarios" / "quick.toml"), *SMALL, "--out", str(out), timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]  # at_least_once after leave_running duplicates: invalid
    run = (out / "latest").resolve()
    # The result is on stdout, alone, so that a pipe gets it; the summary and progress went to stderr.
    assert proc.stdout.splitlines() == ["verdict: INVALID recoveries found (exit 1)", f"results: {run}",
                                        f"report: {run / 'report.html'}"]
    return run


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run: Path) -> pd.DataFrame:
    trials = pd.read_parquet(uninterrupted_run / "trials.parquet")
    assert len(trials) == 8
    return trials


@pytest.mark.parametrize("seed", [1, 2])
def test_a_sigkilled_run_resumes_to_the_verdicts_of_an_uninterrupted_one(uninterrupted, tmp_path: Path, seed: int):
    rng = random.Random(seed)
    trials, delay = rng.randrange(0, 7), rng.uniform(0.0, 0.6)
    run = kill_after(start(tmp_path / "results"), tmp_path / "results", trials, delay)
    meta_before = (run / "run.toml").read_text()
    assert 'status = "running"' in meta_before  # a SIGKILLed harness wrote no end
    kept = len(list((run / "trials").glob("*.json")))

    resumed = cli("run", "--resume", str(run), "--json", timeout=600)
    assert resumed.returncode == 1, resumed.stderr[-2000:]
    # Once the resume started, nothing of the killed harness is left: its workloads, images, receiver, work dir.
    said = json.loads(resumed.stdout)
    assert not list(Path("/dev/shm").glob(f"cutbench-{run.name}-*"))
    assert not [p for p in Path("/tmp").glob(f"cutbench-{run.name}-*") if processes_in(p)]

    trials_after = pd.read_parquet(run / "trials.parquet")
    assert list(trials_after["trial_id"]) == list(uninterrupted["trial_id"])
    assert verdicts_by_plan(trials_after) == verdicts_by_plan(uninterrupted)
    import tomllib

    meta = tomllib.loads((run / "run.toml").read_text())
    assert meta["status"] == "complete" and meta["n_trials"] == 8
    assert meta["resumes"][0]["kept"] == kept and meta["resumes"][0]["to_run"] == 8 - kept
    assert said["run_dir"] == str(run)
    assert cli("analyze", str(run)).returncode == 0  # the kept trials' stored data judge as stored


def test_a_complete_run_a_run_of_other_code_and_another_scenario_are_refused(uninterrupted_run: Path, tmp_path: Path):
    import shutil
    import tomllib

    import tomli_w

    run = tmp_path / uninterrupted_run.name
    shutil.copytree(uninterrupted_run, run)
    out = cli("run", "--resume", str(run))
    assert out.returncode == 254 and "cannot resume: the run is complete" in out.stderr, out.stderr[-1000:]
    meta = tomllib.loads((run / "run.toml").read_text())
    digest = meta["code_digest"]
    (run / "run.toml").write_text(tomli_w.dumps({**meta, "status": "partial", "code_digest": "0" * 64}))
    out = cli("run", "--resume", str(run))
    assert out.returncode == 254 and "cannot resume: the code differs" in out.stderr, out.stderr[-1000:]
    (run / "run.toml").write_text(tomli_w.dumps({**meta, "status": "partial", "code_digest": digest}))
    out = cli("run", str(REPO / "scenarios" / "quick.toml"), *SMALL, "--set", "plan.seed=5", "--resume", str(run))
    assert out.returncode == 254 and "the scenario differs from the run's: seed was 0, is 5" in out.stderr, out.stderr[-1000:]
    assert (run / "run.toml").read_text() == tomli_w.dumps({**meta, "status": "partial", "code_digest": digest})  # untouched

"""The run's receiver killed in the middle of a run: the harness starts it again on its store at once, runs
the trial in flight again, and ends with the verdicts of an undisturbed run (on SQLite and PostgreSQL)."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

import pytest

from cutbench.harness.store.analysis import verdicts_by_plan
from cutbench.harness.store.rundir import RunDir
from tests.fixtures.receiver_fixtures import receivers_of
from tests.fixtures.run_fixtures import counter_scenario

pytestmark = pytest.mark.criu

SCENARIO = counter_scenario("receiver-death", modes=["at_least_once", "idempotent"], faults=["kill", "leave_running"],
                            phases=["publish"])


def _store_of(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return argv[argv.index("--store") + 1]


def _run(tmp_path: Path, name: str, store: str, *, kill_after_first: bool, break_store: bool = False,
         code: int = 1) -> tuple[Path | str, list[int]]:
    scenario = tmp_path / f"{name}.toml"
    scenario.write_text(SCENARIO.replace("[receiver]", f"[receiver]\nstore = {json.dumps(store)}"))
    out = tmp_path / name
    proc = subprocess.Popen([sys.executable, "-m", "cutbench", "run", str(scenario), "--out", str(out), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed: list[int] = []

    def kill_once_a_trial_is_stored() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            stored = list(out.glob("*/trials/t0001.json"))
            # t0002 is running: its directory is in the session's work directory (cutbench-RUN_ID-…).
            if stored and glob.glob(f"{tempfile.gettempdir()}/cutbench-{stored[0].parents[1].name}-*/t0002"):
                for pid in receivers_of(proc.pid):
                    if break_store:  # the file a new receiver would open becomes a directory: it cannot start
                        db = Path(_store_of(pid).removeprefix("sqlite:"))
                        db.rename(db.with_suffix(".gone"))
                        db.mkdir()
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_once_a_trial_is_stored)
    if kill_after_first:
        killer.start()
    stdout, stderr = proc.communicate(timeout=300)
    if kill_after_first:
        killer.join()
    assert proc.returncode == code, stderr[-3000:]  # 1: the invalid at_least_once/leave_running arm, nothing else
    return (Path(json.loads(stdout)["run_dir"]) if code == 1 else stderr), killed


@pytest.fixture(scope="module")
def calm(criu, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The undisturbed run both stores' disturbed runs are held to (the verdicts do not depend on the store; one per
    test worker)."""
    run, _ = _run(tmp_path_factory.mktemp("calm"), "calm", "sqlite", kill_after_first=False)
    assert isinstance(run, Path)
    return run


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_killed_receiver_is_restarted_and_the_verdicts_are_an_undisturbed_runs(store: str, tmp_path: Path, request,
                                                                                   calm: Path):
    url = "sqlite" if store == "sqlite" else request.getfixturevalue("pg_url")
    disturbed, killed = _run(tmp_path, "disturbed", url, kill_after_first=True)
    assert len(killed) == 1 and isinstance(disturbed, Path)

    calm_trials, disturbed_trials = RunDir.open(calm).table("trials"), RunDir.open(disturbed).table("trials")
    assert len(disturbed_trials) == 4 and (disturbed_trials["outcome"] != "unknown").all()
    assert verdicts_by_plan(disturbed_trials) == verdicts_by_plan(calm_trials)

    meta = tomllib.loads((disturbed / "run.toml").read_text())
    [event] = meta["receiver_restarts"]
    assert event["exit_status"] == -signal.SIGKILL and "lost" not in event
    assert event["trials_rerun"] == ["t0002"]  # killed while t0002 ran: it ran again, under a fresh receiver key
    assert "receiver_restarts" not in tomllib.loads((calm / "run.toml").read_text())
    assert "- the receiver died (exit status -9) and was started again on its store" in (disturbed / "summary.md").read_text()


def test_a_receiver_that_cannot_come_back_stops_the_run_which_resume_finishes(tmp_path: Path):
    said, killed = _run(tmp_path, "broken", "sqlite", kill_after_first=True, break_store=True, code=254)
    assert len(killed) == 1 and isinstance(said, str)
    assert "the run's receiver died (exit status -9) and could not be started again on its store" in said
    assert "Traceback" not in said
    run_dir = Path(said.split("cutbench run --resume ")[1].split("`")[0])
    assert tomllib.loads((run_dir / "run.toml").read_text())["status"] == "partial"
    resumed = subprocess.run([sys.executable, "-m", "cutbench", "run", "--resume", str(run_dir), "--json"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    assert len(RunDir.open(run_dir).table("trials")) == 4

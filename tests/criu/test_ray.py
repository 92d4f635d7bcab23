"""Trials as Ray tasks (``--executor ray``) through real Ray and real CRIU (``criu``: must run in CI).

A run on Ray must store what a serial run of the same plans stores, leave no
process or image behind, and stop the local Ray it started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutbench.harness.model.scenario import load_scenario
from cutbench.harness.runner.run import run_scenario
from cutbench.harness.store.analysis import reanalyze, verdicts_by_plan
from cutbench.harness.store.rundir import RunDir
from tests.conftest import REPO, live_processes, workload_processes

# One local Ray at a time (its fixed ports, its processes): under pytest-xdist every test here runs on one worker.
pytestmark = [pytest.mark.criu, pytest.mark.xdist_group("ray")]

QUICK = REPO / "scenarios" / "quick.toml"
# quick.toml at two phases of op 3: both faults (kill, leave_running) under both receiver modes, 8 trials.
PHASES = 'plan.phases=["admit", "publish"]'


@pytest.fixture(scope="module")
def serial_quick(criu, tmp_path_factory: pytest.TempPathFactory):
    """quick.toml at :data:`PHASES` run serially, once for the module: the verdicts every Ray run must store."""
    return run_scenario(load_scenario(QUICK, [PHASES]), tmp_path_factory.mktemp("serial"))


def ray_processes() -> set[int]:
    """Live processes of Ray (its raylet, GCS, workers, monitors)."""
    return {pid for pid, cmd in live_processes()
            if cmd.startswith("ray::") or "/site-packages/ray/" in cmd or "/ray/core/src/" in cmd}


def _left_behind(run_id: str) -> list[str]:
    stray = [cmd for _, cmd in workload_processes() if run_id in cmd]
    stray += [cmd for _, cmd in live_processes() if "cutbench.harness.runner.trial_worker" in cmd]
    stray += [str(p) for p in Path("/dev/shm").glob(f"cutbench-{run_id}-*")]
    return stray


def _wait_gone(pids: set[int], timeout: float = 20.0) -> set[int]:
    """Those of ``pids`` still alive after ``timeout`` (Ray's processes exit a moment after shutdown)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = pids & ray_processes()
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_executor_ray_stores_the_serial_verdict_of_every_plan(criu, results_root: Path, serial_quick):
    """``cutbench run quick.toml --executor ray`` (a local Ray, one CPU per trial) and a serial run of the same
    plans: the same verdict per plan, trial files and tables in plan order; nothing of the trials or of Ray
    is left afterwards."""
    serial = serial_quick
    before = ray_processes()
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cutbench", "run", str(QUICK), "--out", str(results_root / "ray"),
                           "--set", PHASES, "--executor", "ray", "--json"],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    wall = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr  # invalid found: leave_running under at_least_once duplicates
    printed = json.loads(proc.stdout)
    assert printed["complete"], printed
    run = RunDir.open(printed["run_dir"])
    a, b = serial.trials, run.table("trials")
    assert len(a) == len(b) == 8
    assert list(b["trial_id"]) == list(a["trial_id"]) == sorted(a["trial_id"])  # plan order, whoever ran what
    assert (b["status"] != "unknown").all(), b[b["status"] == "unknown"][["trial_id", "error"]]
    assert (b["restores"] == 1).all()
    assert verdicts_by_plan(b) == verdicts_by_plan(a)
    assert set(b["outcome"]) == {"valid", "invalid"}

    meta = run.meta()
    assert meta["executor"] == "ray" and meta["scenario"]["executor"] == "ray"
    assert meta["ray"]["started_here"] and meta["ray"]["address"] == "local"
    assert meta["jobs"] == min(int(meta["ray"]["cpus"]), 8) and meta["ray"]["task_resources"] == {"num_cpus": 1}
    records = run.trial_records()
    assert [r["spec"]["trial_id"] for r in records] == list(b["trial_id"])
    if meta["jobs"] > 1:  # trials at once: each tree in a PID namespace of its own, as with threads
        assert all(r["record"]["facts"].get("pid_namespace") == 1 for r in records)
    assert not reanalyze(run).differences

    assert not _left_behind(run.run_id), "left behind"
    assert not _wait_gone(ray_processes() - before), "the local Ray the run started is still running"
    print(f"\nray run: {wall:.1f} s wall, Ray start-up {meta['ray']['startup_s']:.1f} s, "
          f"run {meta['duration_s']:.1f} s; serial run {serial.run.meta()['duration_s']:.1f} s")


@pytest.mark.timeout(300)
def test_a_ray_already_running_here_is_used_and_left_running(criu, results_root: Path):
    """A process that started Ray itself (``ray.init``): the run uses that Ray, does not stop it, and the
    run's own capacity follows it (``num_cpus=2``)."""
    import logging

    import signal

    import ray

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    try:
        outcome = run_scenario(load_scenario(QUICK, ['plan.phases=["publish"]', "run.executor=ray"]), results_root)
        assert ray.is_initialized(), "the run shut down a Ray it had not started"
        assert outcome.complete and len(outcome.trials) == 4
        meta = outcome.run.meta()
        assert meta["ray"]["started_here"] is False and meta["jobs"] == 2
        assert (outcome.trials["status"] != "unknown").all(), outcome.trials[["trial_id", "error"]]
        assert _left_behind(outcome.run.run_id) == []
    finally:
        ray.shutdown()
        # ray.init blocks signals in this (the test) process; its later children would inherit that.
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.mark.timeout(300)
def test_ctrl_c_cancels_the_ray_trials_and_keeps_what_finished(criu, results_root: Path):
    """SIGINT to ``cutbench run --executor ray`` mid-run: the trials in flight are interrupted in their own
    processes and clean up, what finished is stored in plan order as a partial run (exit 130), and neither
    a workload, a trial worker nor Ray is left running."""
    before = ray_processes()
    proc = subprocess.Popen([sys.executable, "-m", "cutbench", "run", str(QUICK), "--out", str(results_root),
                             "--executor", "ray"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until the first trial is stored: the next ones are in flight
            if list(results_root.glob("*/trials/t0001.json")):
                break
            time.sleep(0.05)
        else:
            pytest.fail("no trial finished within 120 s")
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    run = RunDir.open(next(p for p in results_root.iterdir() if p.name != "latest"))
    meta = run.meta()
    assert meta["status"] == "partial" and 0 < meta["n_trials"] < 28, meta
    ids = [r["spec"]["trial_id"] for r in run.trial_records()]
    assert ids == sorted(ids) and list(run.table("trials")["trial_id"]) == ids
    assert not _left_behind(run.run_id), "left behind"
    assert not _wait_gone(ray_processes() - before), "the local Ray the run started is still running"


@pytest.mark.timeout(420)
def test_a_two_node_ray_cluster_spreads_the_trials_and_its_receiver_asks_for_the_runs_secret(criu, results_root: Path,
                                                                                             serial_quick):
    """A Ray cluster of two nodes (Ray's own ``cluster_utils.Cluster``: two raylets on this machine): the trials
    run on both nodes, each recording its node, and reach the receiver on the driver node's routable address
    with the run's secret, which it asks of every client; the verdicts are the serial run's."""
    from ray.cluster_utils import Cluster

    serial = serial_quick
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        proc = subprocess.run([sys.executable, "-m", "cutbench", "run", str(QUICK), "--out", str(results_root / "two"),
                               "--set", PHASES, "--executor", "ray", "--ray-address", cluster.address, "--json"],
                              capture_output=True, text=True, timeout=300, cwd=REPO)
    finally:
        cluster.shutdown()
    assert proc.returncode == 1, proc.stderr
    run = RunDir.open(json.loads(proc.stdout)["run_dir"])
    b = run.table("trials")
    assert (b["status"] != "unknown").all(), b[b["status"] == "unknown"][["trial_id", "error"]]
    assert verdicts_by_plan(b) == verdicts_by_plan(serial.trials)
    meta = run.meta()
    assert meta["ray"]["nodes"] == 2 and meta["ray"]["spread"] and meta["ray"]["cpus"] == 4
    assert meta["jobs"] == 4
    nodes = {r["record"]["facts"].get("ray_node") for r in run.trial_records()}
    assert len(nodes) == 2 and None not in nodes, nodes  # SPREAD placed trials on both nodes
    host = meta["ray"]["receiver"].rsplit(":", 1)[0]
    assert not host.startswith("127.") and meta["ray"]["receiver_token"], meta["ray"]  # routable, with the secret
    assert not _left_behind(run.run_id), "left behind"


@pytest.mark.timeout(300)
def test_a_receiver_killed_under_ray_is_restarted_and_the_trials_in_flight_run_again(criu, results_root: Path,
                                                                                     serial_quick):
    """The driver's receiver SIGKILLed while Ray tasks run: the driver starts it again on its store, runs again
    every trial that was in flight, and stores the serial run's verdicts."""
    from tests.fixtures.receiver_fixtures import receivers_of

    # Half the serial run's plans (those at publish): their verdicts are the serial run's for the same plans.
    proc = subprocess.Popen([sys.executable, "-m", "cutbench", "run", str(QUICK), "--set", 'plan.phases=["publish"]',
                             "--out", str(results_root), "--executor", "ray", "--jobs", "2", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not list(results_root.glob("*/trials/t0001.json")):
            time.sleep(0.02)
        killed = receivers_of(proc.pid)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(killed) == 1 and proc.returncode == 1, err[-3000:]
    run = RunDir.open(json.loads(out)["run_dir"])
    trials = run.table("trials")
    assert (trials["outcome"] != "unknown").all()
    serial = verdicts_by_plan(serial_quick.trials)
    assert len(trials) == 4 and verdicts_by_plan(trials) == {k: serial[k] for k in verdicts_by_plan(trials)}
    [event] = run.meta()["receiver_restarts"]
    assert event["exit_status"] == -signal.SIGKILL and event["trials_rerun"], event  # a trial was in flight

"""The ``docker`` and ``podman`` backends on real engines (marked ``criu``: must run in CI).

``make test`` installs Debian's docker.io and podman; the fixtures start the
project's own dockerd for the session and stop it after. The same plans go
through CRIU alone and through each engine: a container checkpoint is CRIU
underneath, so the verdict per plan must be the same, and a restore must
continue the execution (never ``restarted``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from cutbench.harness.environment import engines
from cutbench.harness.nemesis.backends.docker import RUNC_OPTIONS
from tests.conftest import REPO
from tests.fixtures.run_fixtures import run_table as run
from tests.fixtures.container_fixtures import docker_engine, podman_engine  # noqa: F401

pytestmark = pytest.mark.criu


def left_behind() -> list[str]:
    """Trial containers either engine still holds."""
    found = [c.name for c in engines.docker_client().containers.list(all=True, filters={"label": "cutbench"})]
    podman = subprocess.run(["podman", "ps", "--all", "--filter", "label=cutbench", "--format", "{{.Names}}"],
                            capture_output=True, text=True)
    return found + podman.stdout.split()


def test_docker_and_podman_give_criu_s_verdict_on_every_quick_plan_and_continue_the_run(
        criu, docker_engine, podman_engine, results_root):
    trials = run(results_root, "quick.toml", "--set", 'pipeline.backends=["criu", "docker", "podman"]')
    assert len(trials) == 84 and (trials["outcome"] != "unknown").all(), trials[trials["outcome"] == "unknown"][["arm", "error"]]
    key = ["receiver_mode", "fault", "cut_op", "cut_phase"]
    by_backend = {b: t.set_index(key)["outcome"].sort_index() for b, t in trials.groupby("backend")}
    for engine in ("docker", "podman"):
        assert by_backend[engine].equals(by_backend["criu"]), pd.concat([by_backend["criu"], by_backend[engine]], axis=1)
        t = trials[trials["backend"] == engine]
        # Each restore continued the execution: one restore per trial, never a fresh start.
        assert (t["restores"] == 1).all() and (t["restarted"] == 0).all()
        assert (t[f"{engine}_checkpoint_s"] > 0).all() and (t[f"{engine}_restore_s"] > 0).all()
        assert (t["image_bytes"] > 0).all()
    # The pattern the scenario documents: duplicates only where the original ran on and the receiver repeats them.
    invalid = trials[trials["outcome"] == "invalid"]
    assert set(zip(invalid["receiver_mode"], invalid["fault"])) == {("at_least_once", "leave_running")}
    assert left_behind() == [] and not RUNC_OPTIONS.exists()


def test_docker_and_podman_run_every_workload_of_the_ci_subset_to_a_verdict(criu, docker_engine, podman_engine, results_root):
    trials = run(results_root, "all-workloads.toml", "--set", "plan.source=random", "--set", "plan.trials=1",
                 "--set", 'pipeline.backends=["docker", "podman"]')
    assert len(trials) and (trials["status"] != "unknown").all(), trials[trials["status"] == "unknown"][["variant", "arm", "error"]]
    control = trials[(trials["fault"] == "none") & (trials["receiver_mode"] == "idempotent")]
    assert (control["outcome"] != "invalid").all(), control[control["outcome"] == "invalid"][["variant", "arm", "findings"]]
    # A cut of one rank of a multi-process workload: the engines checkpoint whole containers only.
    refused = trials[trials["outcome"] == "refused"]
    assert set(refused["variant"]) <= {"ranks/one-rank"}, refused[["variant", "arm", "error"]]
    assert refused["error"].str.contains("whole containers only").all()
    assert (trials["restarted"] == 0).all()
    assert left_behind() == []


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_several_restores_of_one_container_in_one_trial(criu, docker_engine, podman_engine, results_root, engine):
    """Periodic checkpoints: the restored container is cut, killed and restored again, twice more."""
    trials = run(results_root, "quick.toml", "--set", f'pipeline.backends=["{engine}"]', "--set", 'pipeline.faults=["kill"]',
                 "--set", 'receiver.modes=["at_least_once"]', "--set", "plan.source=periodic", "--set", "plan.ops=[2, 6]",
                 "--set", "plan.interval_ops=2", "--set", "plan.trials=1", "--set", 'plan.phases=["commit"]')
    [row] = trials.itertuples()
    assert row.outcome == "valid" and row.n_cuts == 3 and row.restores == 3, (row.outcome, row.error)


def test_podman_reports_its_own_statistics_as_facts(criu, podman_engine, results_root):
    run(results_root, "quick.toml", "--set", 'pipeline.backends=["podman"]', "--set", 'pipeline.faults=["kill"]',
        "--set", 'receiver.modes=["idempotent"]', "--set", 'plan.phases=["commit"]')
    record = json.loads(next(((results_root / "latest").resolve() / "trials").glob("*.json")).read_text())
    facts = record["record"]["facts"]
    for fact in ("podman_checkpoint_total_s", "podman_criu_frozen_s", "podman_restore_total_s", "podman_criu_restore_s"):
        assert facts[fact] > 0, facts


def test_engine_cli_reports_and_starts_the_project_s_dockerd(docker_engine):
    out = subprocess.run([sys.executable, "-m", "cutbench", "engine", "start", "docker"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    said = out.stdout + out.stderr  # messages for people go to stderr, as for every command
    assert out.returncode == 0 and "already running" in said and "experimental on" in said, said
    status = subprocess.run([sys.executable, "-m", "cutbench", "engine", "status"], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    said = status.stdout + status.stderr
    assert "docker: 20." in said and "experimental on" in said and "podman: " in said, said


def test_a_runc_options_file_of_someone_else_makes_the_docker_backend_unavailable(docker_engine, tmp_path):
    from cutbench.harness.nemesis.backends.docker import DockerCheckpointer

    if RUNC_OPTIONS.exists():
        pytest.fail(f"{RUNC_OPTIONS} exists before the test: a run left it behind")
    RUNC_OPTIONS.parent.mkdir(parents=True, exist_ok=True)
    RUNC_OPTIONS.write_text("tcp-established\n")
    try:
        reason = DockerCheckpointer().unavailable_reason()
    finally:
        RUNC_OPTIONS.unlink()
    assert reason and str(RUNC_OPTIONS) in reason and "move that file away" in reason
    assert DockerCheckpointer().unavailable_reason() is None

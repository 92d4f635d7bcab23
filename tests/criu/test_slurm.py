"""A program run as a Slurm batch job and preempted by a real Slurm (the project's one-node cluster: ``cutbench slurm
up``), judged from what it showed; the job scripts of examples/slurm, correct and broken (docs/slurm.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator

import pandas as pd
import pytest

from cutbench.errors import Unavailable
from cutbench.harness.provision import slurm as cluster
from tests.conftest import REPO
from tests.fixtures.run_fixtures import cli

SCENARIO = REPO / "examples" / "slurm" / "ticker.toml"
# The preemption after the ticker's 5th to 8th step of 50 (100 ms each): it still has more to do than the local
# cluster's grace time.
SHORT = ["--set", "plan.ops=[5, 8]"]
# requeue-restart is left to the reference run (results/reference/slurm): the same mechanism as requeue-resume.
VARIANTS = [arg for name in ("requeue-resume", "criu", "criu-detached", "no-requeue", "foreground")
            for arg in ("--variant", name)]


def cutbench_jobs() -> list[str]:
    """The jobs of cutbench's trials the cluster still has queued or running (``squeue``)."""
    out = cluster.run_client("squeue", "-h", "-o", "%i %j %T")
    return [line for line in out.stdout.splitlines() if " cutbench-" in line]


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[None]:
    """The project's local Slurm for this module (started here unless it answers); at the end, no job of a trial
    may be left queued or running."""
    try:
        started = cluster.start()
    except Unavailable as exc:
        reason = f"no local Slurm: {exc}"
        if os.environ.get("CI") or os.environ.get("CUTBENCH_REQUIRE_SLURM") == "1":
            pytest.fail(f"{reason} (required here because CI or CUTBENCH_REQUIRE_SLURM=1 is set)")
        pytest.skip(reason)
    try:
        yield
        assert cutbench_jobs() == []
    finally:
        if started:
            cluster.stop()


def run(out, *extra: str) -> dict[str, dict]:
    """``cutbench run`` of the ticker's Slurm scenario; its trials by variant, with their findings' kinds."""
    proc = cli("run", str(SCENARIO), "--out", str(out), "--json", *SHORT, *VARIANTS, *extra, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-3000:]
    trials = pd.read_parquet((out / "latest").resolve() / "trials.parquet")
    rows = {}
    for row in trials.to_dict("records"):
        row["kinds"] = {f["kind"] for f in json.loads(row["findings"] or "[]")}
        rows[row["variant"]] = row
    return rows


def test_each_job_script_under_a_real_preemption_gets_its_verdict_and_nothing_stays_queued(slurm_cluster, tmp_path):
    rows = run(tmp_path)
    # Saved on the job step's SIGTERM and resumed there by the requeued job: every step shown once.
    resume = rows["requeue-resume"]
    assert resume["outcome"] == "valid", resume["error"]
    # CRIU from the job script: dumped on the step's signal, restored by the requeued job, every step once.
    assert rows["criu"]["outcome"] == "valid", rows["criu"]["error"]
    # A detached restore leaves the program outside the requeued job, which ends at once: lost, naming the process.
    detached = rows["criu-detached"]
    assert detached["kinds"] == {"process_lost"} and "while its program ran on outside it" in detached["error"], \
        detached["error"]
    # No --requeue: the job ends at the preemption, its work lost, in Slurm's words.
    lost = rows["no-requeue"]
    assert lost["kinds"] == {"process_lost"} and "was not requeued" in lost["error"], lost["error"]
    # A foreground program hears nothing when the grace time begins: the node is not free before it ends. Then, as
    # measured (results/reference/slurm), the program ran to its end before Slurm took the node back (refused), or
    # Slurm cancelled the job at a later pass and it was requeued (valid).
    foreground = rows["foreground"]
    # Seen every 0.2 s, a look that comes late moves time from one stage to the next: the signal-to-off-node sum holds.
    off_node = {name: rows[name]["slurm_grace_s"] + rows[name]["slurm_kill_s"] for name in ("foreground", "requeue-resume")}
    assert off_node["foreground"] >= cluster.GRACE_S - 0.5 > off_node["requeue-resume"], off_node
    assert foreground["outcome"] == "valid" or foreground["status"] == "refused", foreground["error"]
    assert cutbench_jobs() == []


def test_the_certificate_decides_the_requeue_a_stale_image_starts_again(slurm_cluster, tmp_path):
    # The job worker dumped with --leave-running runs on and commits jobs its image knows nothing of. Restored
    # as it is (certify off), its copy meets a database from its future; under enforce the certificate sees the
    # files written after the image and the requeued job starts the worker from the beginning, which a consumer
    # that keeps each job once takes whole. Slurm's requeue (no grace time) keeps the trials short.
    proc = cli("run", str(REPO / "examples" / "slurm" / "jobs.toml"), "--out", str(tmp_path), "--json",
               "--variant", "criu-leave-running", "--set", "workload.params.command=[\"python3\", \"worker.py\", "
               "\"--jobs\", \"40\", \"--interval-ms\", \"200\"]", "--set", "workload.params.ops=40",
               "--set", 'workload.params.slurm={script = "criu-leave-running.sh", preempt = "requeue"}',
               timeout=600)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = (tmp_path / "latest").resolve()
    trials = {r["certify"]: r for r in pd.read_parquet(run_dir / "trials.parquet").to_dict("records")}
    restored, decided = trials["off"], trials["enforce"]
    assert restored["outcome"] == "invalid", (restored["status"], restored["error"])
    assert decided["outcome"] == "valid", (decided["status"], decided["error"], decided["cert_reason"])
    assert not decided["cert_eligible"] and "jobs.db-wal" in decided["cert_reason"], decided["cert_reason"]
    assert "written after the image" in decided["cert_reason"], decided["cert_reason"]
    certificates = pd.read_parquet(run_dir / "certificates.parquet")
    assert certificates["restored"].tolist() == [False]  # started again from the beginning, not restored
    assert cutbench_jobs() == []


def test_a_partition_the_cluster_lacks_is_refused_before_any_trial_naming_the_ones_it_has(slurm_cluster, tmp_path):
    proc = cli("run", str(SCENARIO), "--out", str(tmp_path), *SHORT, "--set",
               'workload.params.slurm={script = "requeue-resume.sh", partition = "gpu-low"}', timeout=300)
    assert proc.returncode == 254, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "workload.params.slurm.partition = 'gpu-low'" in proc.stderr and "low, high" in proc.stderr, proc.stderr
    assert cutbench_jobs() == []


def test_a_job_script_that_never_starts_the_program_fails_the_uninterrupted_runs_and_leaves_no_job(
        slurm_cluster, tmp_path):
    script = tmp_path / "forgets.sh"
    script.write_text("#!/bin/bash\n#SBATCH --requeue\necho 'starting the program (but never does)'\n")
    proc = cli("run", str(SCENARIO), "--out", str(tmp_path / "out"), *SHORT, "--set",
               f'workload.params.slurm={{script = "{script}"}}', timeout=300)
    assert proc.returncode not in (0, 1), proc.stdout[-2000:]
    assert "matched nothing" in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert cutbench_jobs() == []


def test_slurm_cli_and_doctor_say_which_cluster_answers(slurm_cluster):
    status = cli("slurm", "status")
    said = status.stdout + status.stderr
    assert status.returncode == 0 and "answers; partitions low (up), high (up)" in said, said
    doctor = cli("doctor")
    assert "slurm" in doctor.stdout and "partitions low (up), high (up)" in doctor.stdout, doctor.stdout


def test_a_cluster_that_does_not_answer_makes_the_backend_unavailable_with_the_fix(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=nowhere(127.0.0.1)\nSlurmctldPort=9\n"
                    "NodeName=n1 CPUs=1\nPartitionName=low Nodes=n1\n")
    proc = cli("run", str(SCENARIO), "--out", str(tmp_path / "o"), *SHORT, env={**os.environ, "SLURM_CONF": str(conf)})
    assert proc.returncode not in (0, 1) and "backend 'slurm' cannot run here" in proc.stderr, proc.stderr[-2000:]
    assert "no slurmctld answers" in proc.stderr and "cutbench slurm up" in proc.stderr, proc.stderr[-2000:]


def verdicts(out) -> dict[str, tuple[str, int]]:
    """A run's verdict per plan (its arm and plan): outcome and finding count."""
    trials = pd.read_parquet((out / "latest").resolve() / "trials.parquet")
    return {f"{r['arm']} {r['plan']}": (r["outcome"], r["n_findings"]) for r in trials.to_dict("records")}


def test_trials_as_a_job_array_get_a_serial_run_s_verdicts_through_a_controller_restart_and_a_lost_task(
        slurm_cluster, criu, tmp_path):
    scenario = str(REPO / "scenarios" / "quick.toml")
    narrow = ["--set", 'receiver.modes=["at_least_once"]', "--set", 'pipeline.faults=["kill"]']
    serial = cli("run", scenario, "--out", str(tmp_path / "serial"), *narrow, timeout=600)
    assert serial.returncode in (0, 1), serial.stderr[-2000:]
    proc = subprocess.Popen([sys.executable, "-m", "cutbench", "run", scenario, "--out", str(tmp_path / "array"),
                             *narrow, "--executor", "slurm", "--jobs", "1"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        # Once its first task runs: slurmctld restarts (the task runs on), then a task still pending is cancelled
        # (lost without a result: it runs again).
        deadline = time.monotonic() + 120
        while not tasks("R"):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        cluster.restart_controller(down_s=2)
        last = tasks("PD")
        assert last, "no task left pending after the controller's restart"
        cluster.run_client("scancel", last[-1])
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 1), err[-3000:]
    assert verdicts(tmp_path / "array") == verdicts(tmp_path / "serial")
    meta = tomllib.loads(((tmp_path / "array" / "latest").resolve() / "run.toml").read_text())
    assert meta["executor"] == "slurm" and meta["slurm_reruns"] >= 1  # the cancelled task ran again
    assert cutbench_jobs() == []


def tasks(state: str) -> list[str]:
    """The array tasks of cutbench's trials in squeue's ``state`` (``R``, ``PD``), as ``JOB_TASK``."""
    out = cluster.run_client("squeue", "-h", "-r", "-t", state, "-o", "%i %j").stdout
    return [line.split()[0] for line in out.splitlines() if "cutbench-trials-" in line]


def test_a_slurm_carried_as_debian_s_packages_runs_the_cluster_and_its_jobs_from_its_prefix(tmp_path, monkeypatch):
    """`cutbench slurm install` (downloaded, then --from, as for a machine without network): the cluster's daemons
    and the clients a job script calls run from the bundle, and the job's own programs with the host's libraries."""
    debs, prefix = tmp_path / "debs", tmp_path / "prefix"
    got = cli("slurm", "install", "--download-only", str(debs), timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    got = cli("slurm", "install", "--from", str(debs), "--prefix", str(prefix), timeout=300)
    assert got.returncode == 0 and "Slurm 22.05" in got.stdout + got.stderr, got.stderr[-2000:]
    monkeypatch.setenv("CUTBENCH_SLURM_PREFIX", str(prefix))
    monkeypatch.setenv("CUTBENCH_ENGINE_ROOT", str(tmp_path / "state"))
    monkeypatch.setattr(cluster, "PORTS", (26817, 26818))  # beside the project's own cluster, which may be up
    assert cluster.start() is True
    try:
        assert "bundled under " + str(prefix) in cluster.status()
        loader = os.path.realpath(next(prefix.glob("root/lib/*/ld-linux*.so.*")))
        for daemon in cluster.DAEMONS:
            pid = int(cluster.slurm_paths().pidfile(daemon).read_text())
            assert os.path.realpath(f"/proc/{pid}/exe") == loader, daemon
        out = tmp_path / "job.out"
        job = cluster.run_client("sbatch", "--parsable", f"--output={out}", "--wrap",
                                 "command -v scontrol; srun --ntasks=1 echo step ran; ldd /bin/sh | grep -c libc")
        assert job.returncode == 0, job.stderr
        deadline = time.monotonic() + 60
        while "COMPLETED" not in cluster.scontrol("show", "job", job.stdout.strip()).stdout:
            assert time.monotonic() < deadline, out.read_text() if out.exists() else "no output"
            time.sleep(0.3)
        said = out.read_text().split("\n")
        assert said[:3] == [str(prefix / "bin" / "scontrol"), "step ran", "1"], said
    finally:
        assert cluster.stop() is True

"""The slurm backend's reading of Slurm's words, without a cluster: a job's exit code as a process's status, and
what a job that is over instead of requeued means for the trial."""

from __future__ import annotations

import subprocess

import pytest

from cutbench.errors import StageFailed, StageRefused
from cutbench.harness.nemesis.backends.slurm import JobState, SlurmCheckpointer, SlurmChild
from cutbench.workloads.api import WorkloadError
from cutbench.workloads.program import Program


@pytest.mark.parametrize(("exit_code", "status"), [("0:0", 0), ("143:0", 143), ("0:9", -9), ("", -1)])
def test_a_job_s_exit_code_reads_as_a_process_s_status(exit_code, status):
    assert JobState("FAILED", exit_code=exit_code).returncode() == status


def test_a_job_over_is_lost_refused_or_outlived_by_its_program_as_slurm_and_its_directory_say(tmp_path):
    job = SlurmChild(pid=0, job="7", directory=tmp_path)
    with pytest.raises(StageFailed, match="job 7 ended FAILED .* and was not requeued"):
        SlurmCheckpointer._over(job, JobState("FAILED", "NonZeroExitCode", exit_code="143:0"), [])
    with pytest.raises(StageRefused, match="ran to its end before Slurm took the node back") as refused:
        SlurmCheckpointer._over(job, JobState("TIMEOUT", "TimeLimit", exit_code="0:0"), [])
    assert refused.value.resumed_pid == 0  # type: ignore[attr-defined]  # the pipeline's "it went on"
    # A process still working in the job's directory once the job is over outlived it: the node was never free.
    stray = subprocess.Popen(["sleep", "30"], cwd=tmp_path)
    try:
        with pytest.raises(StageFailed, match=r"while its program ran on outside it \(pid \d+ \(sleep 30\)"):
            SlurmCheckpointer._over(job, JobState("TIMEOUT", "TimeLimit", exit_code="0:0"), [])
    finally:
        stray.kill()
        stray.wait()


@pytest.mark.parametrize(("given", "says"), [
    ({}, "workload.params.slurm.script"),
    ({"script": "job.sh", "queue": "x"}, "unknown ['queue']"),
    ({"script": "job.sh", "partition": "high"}, "partition and preemptor are both 'high'"),
    ({"script": "job.sh", "preempt": "suspend"}, "allowed partition, requeue"),
    ({"script": "job.sh", "pending_s": 0}, "workload.params.slurm.pending_s = 0"),
])
def test_bad_slurm_settings_name_the_key_and_the_fix(given, says):
    with pytest.raises(WorkloadError, match=says.replace("[", r"\[").replace("]", r"\]")):
        Program.slurm_settings({"slurm": given})

"""CPU accounting per stage on real CRIU runs (``docs/cpu-accounting.md``; ``criu``: must run in CI).

Every stage row of a run's timeline carries the CPU-seconds of each process role; CRIU's own (the ``criu``
processes the harness runs and reaps) shows on its dump and restore, and a restored workload, a new process,
is followed: in a parallel run it has a new host pid.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cutbench.harness.model.timeline import CPU_COLUMNS, CPU_ROLES
from cutbench.harness.store.rundir import RunDir
from tests.fixtures.run_fixtures import cli

pytestmark = pytest.mark.criu


def stages_of(run: Path):
    timeline = RunDir.open(run).table("timeline")
    return timeline[timeline["result"] != "event"]


def test_every_stage_of_a_criu_run_has_its_cpu_and_criu_shows_on_dump_and_restore(mixed_run: Path):
    stages = stages_of(mixed_run)
    assert set(CPU_COLUMNS) <= set(stages.columns)
    assert stages[list(CPU_COLUMNS)].notna().all().all(), stages[stages[list(CPU_COLUMNS)].isna().any(axis=1)]
    roles = stages[[f"cpu_{r}_s" for r in CPU_ROLES]].sum(axis=1)
    assert (roles - stages["cpu_s"]).abs().max() < 1e-9
    assert ((stages["cpu_user_s"] + stages["cpu_sys_s"] - stages["cpu_s"]).abs() < 1e-9).all()
    dumps = stages[stages["stage"] == "criu_dump"]
    assert len(dumps) == 4 and (dumps["cpu_criu_s"] > 0).all()  # CRIU's CPU-seconds, from wait4, every dump
    restores = stages[stages["stage"] == "criu_restore"]
    assert len(restores) == 4 and (restores["cpu_criu_s"] > 0).all()
    assert (stages.loc[~stages["stage"].str.startswith("criu_"), "cpu_criu_s"] == 0).all()
    # The workload's own running is the workload's, and nothing of a CPU workload runs on a CUDA thread.
    reach = stages[stages["stage"] == "reach_cut"]
    assert (reach["cpu_workload_s"] > 0).all() and (stages["cpu_cuda_threads_s"] == 0).all()
    assert (stages["minflt"] > 0).any() and (dumps["minflt"] > 0).all()
    # The report's timelines say it on hover.
    assert "ms CPU" in (mixed_run / "report.html").read_text()


def test_a_restored_workload_with_a_new_host_pid_is_followed(criu, mixed_scenario: Path, tmp_path: Path):
    """Two jobs: each workload is the init of a PID namespace of its own, and CRIU restores it with a new host pid."""
    proc = cli("run", str(mixed_scenario), "--out", str(tmp_path), "--json", "--jobs", "2",
               "--set", "pipeline.faults=['kill']")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    run = Path(json.loads(proc.stdout)["run_dir"])
    stages = stages_of(run)
    assert stages[list(CPU_COLUMNS)].notna().all().all()
    restores, after = stages[stages["stage"] == "criu_restore"], stages[stages["stage"] == "run_to_end"]
    assert len(restores) == 2 and (restores["cpu_criu_s"] > 0).all()
    # The restored process, under its new host pid, runs the rest of the workload: its own CPU, read in every stage
    # after the restore. (Its restorer's few milliseconds inside the restore stage may read as 0: /proc counts
    # 10 ms ticks, docs/cpu-accounting.md, "Resolution"; measured 0 in both restores in 2 runs of 4 on a loaded
    # 2-core machine.)
    assert (restores["cpu_workload_s"] >= 0).all() and (after["cpu_workload_s"] > 0).all()

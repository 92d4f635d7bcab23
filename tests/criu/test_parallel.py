"""Parallel trials (``run.jobs``, ``--jobs``) through real CRIU (``criu``: must run in CI).

A parallel run must store what a serial run of the same plans stores, and
its trials must not disturb each other: each workload tree runs in a PID
namespace of its own, so a restore never needs a pid another trial's
process may hold by then.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cutbench.errors import StageFailed
from cutbench.harness.model.plan import Cut
from cutbench.harness.model.scenario import load_scenario
from cutbench.harness.model.timeline import Timeline
from cutbench.harness.nemesis.backends.criu import CriuCheckpointer
from cutbench.harness.nemesis.base import CutContext
from cutbench.harness.runner.run import run_scenario
from cutbench.harness.store.analysis import reanalyze, verdicts_by_plan
from cutbench.harness.store.rundir import RunDir
from cutbench.procs import become_subreaper, spawn
from tests.conftest import FULL_SUITE, REPO, workload_processes

pytestmark = pytest.mark.criu

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


@pytest.mark.timeout(300)
def test_jobs_2_stores_the_serial_verdict_of_every_plan(criu, results_root: Path):
    """``scenarios/quick.toml`` (``kill`` and ``leave_running`` restores) on two workers and on one: the same
    verdict per plan, the tables and trial files in plan order, every workload in its own PID namespace. Its cut
    points at two phases of op 3 (8 trials), at all seven (28) with CUTBENCH_FULL_SUITE=1."""
    scenario = load_scenario(REPO / "scenarios" / "quick.toml", [] if FULL_SUITE else ['plan.phases=["publish", "commit"]'])
    n = 28 if FULL_SUITE else 8
    serial = run_scenario(scenario, results_root / "serial")
    seen: list[tuple[str, int, int]] = []
    parallel = run_scenario(replace(scenario, jobs=2), results_root / "parallel",
                            progress=lambda r, done, total: seen.append((r.spec.trial_id, done, total)))
    assert serial.complete and parallel.complete

    a, b = serial.trials, parallel.trials
    assert len(a) == len(b) == n
    assert list(b["trial_id"]) == list(a["trial_id"]) == sorted(a["trial_id"])  # plan order, whoever ran what
    assert (b["status"] != "unknown").all(), b[b["status"] == "unknown"][["trial_id", "error"]]
    assert (b["restores"] == 1).all()
    assert verdicts_by_plan(b) == verdicts_by_plan(a)
    assert set(b["outcome"]) == {"valid", "invalid"}  # kill restores valid, leave_running under at_least_once not

    run = RunDir.open(parallel.run.path)
    assert run.meta()["jobs"] == 2 and RunDir.open(serial.run.path).meta()["jobs"] == 1
    records = run.trial_records()
    assert [r["spec"]["trial_id"] for r in records] == list(b["trial_id"])
    assert all(r["record"]["facts"].get("pid_namespace") == 1 for r in records)
    assert not any(r["record"]["facts"].get("pid_namespace") for r in RunDir.open(serial.run.path).trial_records())
    assert not reanalyze(run).differences
    # The progress display counted the whole run: 1..n of n, each trial once.
    assert [(done, total) for _, done, total in seen] == [(i, n) for i in range(1, n + 1)]
    assert sorted(t for t, _, _ in seen) == sorted(b["trial_id"])

    stray = [cmd for _, cmd in workload_processes() if parallel.run.run_id in cmd]
    assert not stray, f"processes left behind: {stray}"
    assert not list(Path("/dev/shm").glob(f"cutbench-{parallel.run.run_id}-*")), "an image directory was left behind"


def _occupy(pid: int) -> subprocess.Popen[bytes] | None:
    """A process holding ``pid`` (free now), or None when another process took it first.

    The kernel gives the next process ``ns_last_pid + 1``; the value is put
    back at once, so other processes on the machine go on where they were.
    """
    last = NS_LAST_PID.read_text().strip()
    NS_LAST_PID.write_text(str(pid - 1))
    squatter = subprocess.Popen(["sleep", "120"], stdin=subprocess.DEVNULL)
    NS_LAST_PID.write_text(last)
    if squatter.pid == pid:
        return squatter
    squatter.kill()
    squatter.wait()
    return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pid_namespace", [False, True], ids=["host-pids", "own-pid-namespace"])
def test_a_restore_whose_pid_another_process_took(criu, tmp_path: Path, pid_namespace: bool):
    """A tree is dumped (``kill``), another process takes its pid, then it is restored: in the host's PID
    namespace CRIU cannot give the pid back ("Can't fork … File exists"); as the init of a namespace of its
    own it comes back with its namespace-local pid and a new host pid. A parallel run is the first case
    waiting to happen (another trial's process), which is why it runs every tree in its own namespace."""
    become_subreaper()
    backend = CriuCheckpointer()
    for _ in range(20):  # another process on the machine may take the freed pid first: try again
        child = spawn([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"], cwd=str(tmp_path),
                      pid_namespace=pid_namespace)
        images = Path("/dev/shm") / f"cutbench-test-collision-{tmp_path.name}"
        ctx = CutContext(images_dir=images, timeline=Timeline("t0"), cut_index=0,
                         cut=Cut(op=1, phase="admit", fault="kill"), stage_timeout_s=30)
        squatter = None
        try:
            time.sleep(0.2)  # the interpreter is up
            backend.checkpoint(child, ctx)
            assert child.wait(5) is not None, "a kill dump leaves no process"
            squatter = _occupy(child.pid)
            if squatter is None:
                continue
            if not pid_namespace:
                with pytest.raises(StageFailed, match="File exists"):
                    backend.restore(ctx)
                return
            restored = backend.restore(ctx)
            ctx.restored = True  # as the pipeline says it
            assert restored != child.pid  # the pidfile names the restored init's host pid
            child.replaced_by(restored)
            assert child.alive() and _ns_pid(restored) == 1  # pid 1 of its namespace, as before
            return
        finally:
            child.kill()
            if squatter is not None:
                squatter.kill()
                squatter.wait()
            backend.cleanup(ctx)  # the network lock of a dump never restored (the pipeline's cleanup, called by hand)
            subprocess.run(["rm", "-rf", str(images)], check=False)
    pytest.fail("the freed pid was always taken by another process first")


def test_a_namespace_init_is_pid_1_inside_and_mapped_back(tmp_path: Path):
    """``spawn(pid_namespace=True)``: the workload sees itself as pid 1 and its children by namespace pids;
    the harness reaps the init (it is re-parented to the subreaper), and killing it ends its tree."""
    become_subreaper()
    out = tmp_path / "pids"
    code = ("import os, subprocess, sys, time\n"
            "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(out)!r}, 'w').write(f'{{os.getpid()}} {{kid.pid}}')\n"
            "time.sleep(60)\n")
    child = spawn([sys.executable, "-c", code], cwd=str(tmp_path), pid_namespace=True)
    try:
        deadline = time.monotonic() + 20
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        own, kid = map(int, out.read_text().split())
        assert own == 1 and kid > 1 and _ns_pid(child.pid) == 1
        children = Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split()
        [host_kid] = [int(c) for c in children]
        assert host_kid != child.pid and _ns_pid(host_kid) == kid
    finally:
        assert child.kill() == -9
    assert not Path(f"/proc/{host_kid}").exists() or Path(f"/proc/{host_kid}/stat").read_text().split()[2] == "Z", \
        "the namespace's other processes die with its init"


@pytest.mark.timeout(300)
def test_plugin_gate_runs_its_arms_on_cutbench_jobs_workers(criu, pytester: pytest.Pytester, tmp_path: Path):
    """``--cutbench-jobs 2``: each gate arm's trials run two at a time, with the serial gate's verdicts."""
    from tests.fixtures.run_fixtures import MIXED_SCENARIO

    (pytester.path / "mixed.toml").write_text(MIXED_SCENARIO)
    out = tmp_path / "gate"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-scenario", "mixed.toml",
                                           "--cutbench-out", str(out), "--cutbench-jobs", "2")
    result.assert_outcomes(passed=1, failed=1)  # kill restores valid; leave_running under at_least_once duplicates
    assert "cutbench gate FAILED for mixed [criu/at_least_once/leave_running+100ms]" in result.stdout.str()
    runs = [RunDir.open(p) for p in out.iterdir() if p.name != "latest"]
    assert len(runs) == 2 and all(r.meta()["jobs"] == 2 and r.meta()["n_trials"] == 2 for r in runs)


@pytest.mark.timeout(300)
def test_a_one_rank_cut_runs_without_a_namespace_and_a_tree_cut_in_one(criu, results_root: Path):
    """``ranks``: a cut of the whole tree runs in a PID namespace; ``cut = "rank"`` (the ``peer`` domain: the
    workload names one process of its tree, which CRIU cannot dump out of a namespace) runs without one."""
    from cutbench.harness.model.scenario import parse_scenario

    scenario = parse_scenario({
        "name": "ranks-parallel",
        "workload": {"name": "ranks", "array": "numpy", "params": {"ops": 8, "ranks": 3, "op_interval_ms": 40.0}},
        "receiver": {"modes": ["idempotent"]},
        "pipeline": {"backends": ["criu"], "faults": ["kill"]},
        "plan": {"source": "exhaustive", "ops": [3, 3], "phases": ["publish", "commit"]},
        "run": {"watchdog_s": 6, "trial_timeout_s": 60, "jobs": 2},
        "variants": [{"name": "tree", "workload": {"params": {"cut": "tree"}}},
                     {"name": "one-rank", "workload": {"params": {"cut": "rank", "cut_rank": 1}}}],
    })
    outcome = run_scenario(scenario, results_root)
    assert outcome.complete and RunDir.open(outcome.run.path).meta()["jobs"] == 2
    records = RunDir.open(outcome.run.path).trial_records()
    in_namespace = {r["spec"]["variant"]: set() for r in records}
    for r in records:
        in_namespace[r["spec"]["variant"]].add(r["record"]["facts"].get("pid_namespace", 0))
        assert r["record"]["status"] != "unknown", r["record"]["error"]
    assert in_namespace == {"tree": {1}, "one-rank": {0}}


def _ns_pid(host_pid: int) -> int:
    """The pid ``host_pid`` has in its innermost PID namespace (the last of ``NSpid``)."""
    for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise AssertionError(f"no NSpid for {host_pid}")

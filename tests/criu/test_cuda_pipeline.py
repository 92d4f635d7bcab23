"""Ordering and recovery of the CUDA pipelines around real CRIU, on the CPU (marked ``criu``).

The GPU side is :class:`tests.fixtures.cuda_fixtures.SimDriver` (the driver's state
machine, no GPU); the workload, the receiver, CRIU dump/restore and the
oracle are real. What these tests establish is the harness's part: stage
order, the split window releasing the workload before the CPU cut, and that
no process is left LOCKED or CHECKPOINTED whatever fails. GPU behaviour is
covered by the ``gpu``-marked tests against the real driver.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cutbench.harness.nemesis.backends.app import AppCheckpointer
from cutbench.harness.nemesis.backends.criu import CriuCheckpointer
from cutbench.harness.nemesis.backends.cuda import CudaCheckpointer
from cutbench.harness.nemesis.backends.cuda_criu import CudaCriuCheckpointer
from cutbench.harness.runner.checks import check_backends
from cutbench.harness.model.scenario import parse_scenario
from tests.conftest import REPO, workload_processes
from tests.fixtures.cuda_fixtures import SimDriver, run_id_for, run_trials, stages

pytestmark = pytest.mark.criu


def scenario(backend: str, fault: str, *, phase: str = "record", split: float = 0.0, interval_ms: float = 40.0,
             **extra) -> dict:
    return {
        "name": "cudacpu",
        "workload": {"name": extra.pop("workload", "counter"), "array": "numpy",
                     "params": {"ops": 6, "state_size": 256, "seed": 5, "op_interval_ms": interval_ms}},
        "receiver": {"modes": [extra.pop("mode", "at_least_once")]},
        "pipeline": {"backends": [backend], "faults": [fault], "crash_after_ms": [80], "split_window_ms": [split]},
        "plan": {"source": "exhaustive", "ops": [2, 2], "phases": [phase]},
        "run": {"watchdog_s": 10, "trial_timeout_s": 60, "stage_timeout_s": 30},
    }


def subsequence(seq: list[str], wanted: list[str]) -> bool:
    it = iter(seq)
    return all(any(s == w for s in it) for w in wanted)


def no_leftovers(run_id_prefix: str = "cutbench-t") -> None:
    assert not list(Path("/dev/shm").glob(f"{run_id_prefix}*-c0")), "an image directory was left behind"


def test_kill_with_split_window_runs_host_code_between_cuda_and_cpu_cut(criu, tmp_path):
    sim = SimDriver()
    # A window of 1 s for a publish that follows the release at once (250 ms was too short on a machine
    # loaded by four test workers), and 700 ms between ops, so that the workload cannot finish before the dump.
    [r] = run_trials(scenario("cuda+criu", "kill", split=1000, interval_ms=700.0), tmp_path,
                     backends={"cuda+criu": CudaCriuCheckpointer(driver=sim)})
    assert r.verdict.outcome == "valid", (r.record.error, r.verdict)
    order = ["cuda_discover", "cuda_lock", "cuda_checkpoint", "split_window", "criu_dump", "fault_kill",
             "criu_restore", "cuda_restore", "cuda_unlock"]
    assert subsequence(stages(r), order), stages(r)
    window = next(row for row in r.timeline if row["stage"] == "split_window")
    # Parked after `record` of op 2 and released at the window's start: op 2's effect arrives inside it
    # (the simulated lock does not block the NumPy workload, so op_interval_ms keeps it from finishing).
    assert window["hwm_after"] > window["hwm_before"]
    pid = r.spec and [p for _, p in sim.calls][0]
    assert [c for c, p in sim.calls if p == pid] == ["lock", "checkpoint", "restore", "unlock"]
    assert set(sim.states.values()) == {"running"}
    assert r.record.restores == 1


def test_leave_running_restores_and_unlocks_the_original_before_the_crash(criu, tmp_path):
    sim = SimDriver()
    [r] = run_trials(scenario("cuda+criu", "leave_running", phase="publish"), tmp_path,
                     backends={"cuda+criu": CudaCriuCheckpointer(driver=sim)})
    assert r.record.status == "completed", r.record.error
    order = ["cuda_lock", "cuda_checkpoint", "criu_dump", "cuda_restore_original", "cuda_unlock_original",
             "run_until_crash", "fault_leave_running", "criu_restore", "cuda_restore", "cuda_unlock"]
    assert subsequence(stages(r), order), stages(r)
    assert [c for c, _ in sim.calls] == ["lock", "checkpoint", "restore", "unlock", "restore", "unlock"]
    # Rolled back past op 2's publish under at_least_once: op 2 onwards is applied twice.
    assert r.verdict.counts()["duplicate"] >= 1


class WatchesTheCopy(CriuCheckpointer):
    """CRIU, plus a look at the restored copy before the pipeline releases it."""

    def restore(self, ctx):
        pid = super().restore(ctx)
        before = ctx.control.get("progress_count")
        time.sleep(0.3)  # the GPU pipeline's CUDA restore and unlock happen here
        ctx.facts["copy_moved_before_release"] = ctx.control.get("progress_count") - before
        return pid


@pytest.mark.parametrize("phase", ["launch", "commit"])
def test_after_leave_running_the_restored_copy_stays_parked_until_released(criu, tmp_path, phase):
    """The original was released to run until the crash; its copy must not leave the park before the
    restore is complete (on the GPU a CUDA call before the CUDA restore kills it: benchmarks/repro/)."""
    [r] = run_trials(scenario("criu", "leave_running", phase=phase), tmp_path, backends={"criu": WatchesTheCopy()})
    assert r.record.restores == 1 and r.record.status == "completed", r.record.error
    assert r.record.facts["copy_moved_before_release"] == 0
    assert r.record.report["host_op"] == 6


def test_fault_none_suspends_and_resumes_in_place(criu, tmp_path):
    # idempotent: an effect sent in the split window whose ack the dump's network lock holds past the client's
    # ack timeout (a loaded machine) is resent; at_least_once would count that resend, which is the receiver
    # mode's property, not the in-place pipeline's that this test is about.
    sim = SimDriver()
    [r] = run_trials(scenario("cuda+criu", "none", split=20, mode="idempotent"), tmp_path,
                     backends={"cuda+criu": CudaCriuCheckpointer(driver=sim)})
    assert r.verdict.outcome == "valid", (r.record.error, r.verdict, r.timeline)
    assert subsequence(stages(r), ["cuda_lock", "cuda_checkpoint", "split_window", "criu_dump", "cuda_restore", "cuda_unlock"])
    assert "criu_restore" not in stages(r) and r.record.restores == 0


def test_lock_timeout_is_refused_and_the_workload_finishes(criu, tmp_path):
    sim = SimDriver(refuse_lock=True)
    [r] = run_trials(scenario("cuda+criu", "kill"), tmp_path, backends={"cuda+criu": CudaCriuCheckpointer(driver=sim)})
    assert r.verdict.outcome == "refused", (r.record.error, r.verdict)
    assert r.record.failed_stage == "cuda_lock" and "CUDA_ERROR_NOT_READY" in r.record.error
    assert r.record.report["host_op"] == 6  # it ran on to the end, correctly
    assert "criu_dump" not in stages(r)


@pytest.mark.parametrize("failing,outcome", [("checkpoint", "refused"), ("unlock", "invalid")])
def test_a_later_failing_stage_is_refused_or_lost_and_leaves_nothing_locked(criu, tmp_path, failing, outcome):
    """A checkpoint the harness undid (the process RUNNING again) is a refusal and the workload finishes;
    an unlock of the restored copy that fails loses the application: ``process_lost``."""
    sim = SimDriver(fail=failing)
    [r] = run_trials(scenario("cuda+criu", "kill"), tmp_path, backends={"cuda+criu": CudaCriuCheckpointer(driver=sim)})
    assert r.verdict.outcome == outcome, (r.record.error, r.verdict)
    assert r.record.failed_stage == f"cuda_{failing}" and "CUDA_ERROR_UNKNOWN" in r.record.error
    if failing == "checkpoint":
        assert r.record.status == "refused" and r.record.report["host_op"] == 6  # it went on to the end
    else:
        assert r.record.status == "lost" and [f.kind for f in r.verdict.findings] == ["process_lost"]
    assert set(sim.states.values()) <= {"running"}, sim.states
    assert not [cmd for _, cmd in workload_processes() if str(tmp_path) in cmd], "a workload was left behind"
    no_leftovers(f"cutbench-{run_id_for(tmp_path)}-")  # this session's images, not another test's


def test_in_place_cuda_backend_supports_only_suspend_resume(criu, tmp_path):
    data = scenario("cuda", "none")
    data["pipeline"]["faults"] = ["kill", "none"]
    backend = CudaCheckpointer(driver=SimDriver())
    s = parse_scenario(data)
    from cutbench.harness.nemesis import Backends

    class Simulated(Backends):
        """The run's backends, with the simulated driver's in place of the registry's."""

        def new(self, name):
            return backend

    runnable, skipped = check_backends(s, Simulated())
    assert [a.fault for a in runnable] == ["none"]
    assert "does not support fault 'kill'" in skipped[0]["reason"]
    data["pipeline"]["faults"] = ["none"]
    [r] = run_trials(data, tmp_path, backends={"cuda": backend})
    assert r.verdict.outcome == "valid"
    assert subsequence(stages(r), ["cuda_lock", "cuda_checkpoint", "cuda_restore", "cuda_unlock"])


@pytest.mark.parametrize("fault,mode,expect", [
    ("kill", "at_least_once", "valid"),
    ("leave_running", "at_least_once", "invalid"),
    ("leave_running", "idempotent", "valid"),
])
def test_app_backend_saves_at_the_op_boundary(criu, tmp_path, fault, mode, expect):
    [r] = run_trials(scenario("app", fault, phase="launch", mode=mode), tmp_path, backends={"app": AppCheckpointer()})
    assert r.verdict.outcome == expect, (r.record.error, r.verdict)
    save = next(row for row in r.timeline if row["stage"] == "app_save")
    assert "saved after op 2" in save["detail"]  # cut inside op 2: the checkpoint is its end
    assert r.record.restores == 1 and r.record.facts["image_bytes"] > 0
    assert subsequence(stages(r), ["app_save", f"fault_{fault}", "app_restore"])


def test_app_backend_refuses_a_workload_that_cannot_save(criu, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the workload process imports it from tests/
    data = scenario("app", "kill", workload="tests.fixtures.nosave_workload:CounterWithoutSave")
    [r] = run_trials(data, tmp_path, backends={"app": AppCheckpointer()})
    assert r.verdict.outcome == "refused" and "save_state" in r.record.error
    assert r.record.report["host_op"] == 6

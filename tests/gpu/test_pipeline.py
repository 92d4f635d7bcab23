"""The real GPU pipeline on a real GPU (marked ``gpu``: skipped, with the reason, without one).

Every test here drives the CUDA driver's checkpoint calls through
cuda-bindings on CuPy processes, with real CRIU where the backend uses it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cutbench.harness.environment import gpu_mem
from tests.fixtures.cuda_fixtures import run_trials, stages

pytestmark = pytest.mark.gpu


def gpu_count() -> int:
    from cutbench.harness.environment import gpu_probe

    return len(gpu_probe.probe().get("gpus") or [])


two_gpus = pytest.mark.skipif("gpu_count() < 2", reason="needs 2 GPUs")
# NVIDIA's utility is not part of cutbench: the GPU runner puts it on PATH (scripts/device_run.sh).
with_utility = pytest.mark.skipif(shutil.which("cuda-checkpoint") is None, reason="needs NVIDIA's cuda-checkpoint on PATH")


def scenario(backend: str, fault: str, *, phase: str = "record", workload: str = "counter", params=None,
             split: float = 0.0, mode: str = "at_least_once", target: str = "same", skew: float = 0.0) -> dict:
    return {
        "name": "gputest",
        "workload": {"name": workload, "array": "cupy",
                     "params": {"ops": 4, "seed": 9, **(params or {"state_size": 1 << 18})}},
        "receiver": {"modes": [mode]},
        "pipeline": {"backends": [backend], "faults": [fault], "crash_after_ms": [100], "split_window_ms": [split],
                     "restore_targets": [target], "rank_skew_ms": [skew]},
        "plan": {"source": "exhaustive", "ops": [2, 2], "phases": [phase]},
        "run": {"watchdog_s": 20, "trial_timeout_s": 120, "stage_timeout_s": 60},
    }


def one(data: dict, tmp_path: Path):
    [r] = run_trials(data, tmp_path)
    print(r.record.status, r.record.error, r.verdict, r.record.log_tail)
    return r


CHILD = textwrap.dedent("""
    import sys, time, cupy as cp
    n = (256 << 20) // 8
    a = cp.arange(n, dtype=cp.uint64) * cp.uint64(2654435761)
    cp.cuda.Device().synchronize()
    ptr, want = a.data.ptr, int(a.sum())
    print(ptr, flush=True)
    go = sys.argv[1]
    import os
    while not os.path.exists(go):
        time.sleep(0.01)
    ok = a.data.ptr == ptr and int(a.sum()) == want
    sys.exit(0 if ok else 1)
""")


def test_driver_calls_free_the_gpu_and_restore_contents_in_place(tmp_path):
    from cutbench.harness.nemesis.backends.cuda_driver import CudaDriver

    go = tmp_path / "go"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(go)], stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()
        drv = CudaDriver()
        assert drv.get_state(child.pid) == "running"
        before = gpu_mem.process_gpu_memory([child.pid])
        assert sum(before.get(child.pid, {}).values()) >= 256 << 20
        drv.lock(child.pid, 5000)
        assert drv.get_state(child.pid) == "locked"
        drv.checkpoint(child.pid)
        assert drv.get_state(child.pid) == "checkpointed"
        assert gpu_mem.process_gpu_memory([child.pid]) == {}  # the GPU is released
        drv.restore(child.pid)
        drv.unlock(child.pid)
        assert drv.get_state(child.pid) == "running"
        go.touch()
        assert child.wait(60) == 0  # same device pointer, same contents
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("backend", ["cuda+criu", pytest.param("cuda-checkpoint+criu", marks=with_utility)])
@pytest.mark.parametrize("fault,mode,split", [("kill", "at_least_once", 0.0), ("kill", "at_least_once", 25.0),
                                              ("leave_running", "idempotent", 0.0), ("none", "at_least_once", 0.0)])
def test_cuda_criu_counter(tmp_path, backend, fault, mode, split):
    """The driver API and NVIDIA's documented recipe through its utility, on the same cuts."""
    r = one(scenario(backend, fault, mode=mode, split=split), tmp_path)
    assert r.verdict.outcome == "valid", r.verdict
    rep = r.record.report
    assert rep["pointer_table_ok"] and rep["pointers_initial"] == rep["pointers_final"]
    assert r.record.facts["gpu_bytes"] > 0 and r.record.facts["image_bytes"] > 0
    want = ["cuda_lock", "cuda_checkpoint", "criu_dump"] + (["criu_restore", "cuda_restore", "cuda_unlock"] if fault != "none"
                                                            else ["cuda_restore", "cuda_unlock"])
    got = stages(r)
    assert all(s in got for s in want), got


@with_utility
@pytest.mark.parametrize("fault,mode", [("kill", "at_least_once"), ("none", "at_least_once"),
                                        ("leave_running", "idempotent")])
def test_criu_cuda_plugin_counter(tmp_path, fault, mode):
    """CRIU's CUDA plugin (CRIUgpu's design), built by `cutbench criu install --with-cuda-plugin`, on the same cuts."""
    from cutbench.harness.nemesis.backends.criu_cuda_plugin import CriuCudaPluginCheckpointer

    reason = CriuCudaPluginCheckpointer().unavailable_reason()
    if reason:
        pytest.skip(reason)
    r = one(scenario("criu-cuda-plugin", fault, mode=mode), tmp_path)
    assert r.verdict.outcome == "valid", r.verdict
    assert r.record.report["pointer_table_ok"]
    assert r.record.restores == (0 if fault == "none" else 1) and r.record.facts["image_bytes"] > 0


@pytest.mark.parametrize("backend", ["cuda", pytest.param("cuda-checkpoint", marks=with_utility)])
def test_cuda_in_place_suspend_resume(tmp_path, backend):
    r = one(scenario(backend, "none"), tmp_path)
    assert r.verdict.outcome == "valid"
    assert r.record.report["pointer_table_ok"]


def test_app_baseline_on_gpu(tmp_path):
    r = one(scenario("app", "kill", phase="launch"), tmp_path)
    assert r.verdict.outcome == "valid"
    assert r.record.restores == 1


def test_criu_alone_does_not_restore_a_gpu_process(tmp_path):
    r = one(scenario("criu", "kill"), tmp_path)
    # CRIU alone cannot dump device state: it must refuse (or, if it ever
    # restored, the oracle must flag the uncovered domain).
    assert r.verdict.outcome in ("refused", "invalid"), r.verdict
    if r.verdict.outcome == "invalid":
        assert r.verdict.counts()["unsafe_acceptance"] >= 1


def test_persistent_kernel_without_adapter_is_refused_and_finishes(tmp_path):
    r = one(scenario("cuda+criu", "kill", workload="persistent_kernel",
                     params={"state_size": 1 << 16, "quiesce_adapter": False}), tmp_path)
    assert r.verdict.outcome == "refused", r.verdict
    assert r.record.failed_stage == "cuda_lock" and "CUDA_ERROR_NOT_READY" in r.record.error
    rep = r.record.report
    assert rep["host_op"] == 4 and rep["domain_ops"] == {"host": 4, "device": 4}
    assert not r.verdict.findings


@pytest.mark.parametrize("fault, split", [("kill", 0.0), ("leave_running", 0.0), ("none", 0.0), ("kill", 20.0)])
def test_persistent_kernel_with_adapter_is_cut(tmp_path, fault, split):
    # idempotent: a leave_running rollback sends again what the original published after the cut, by design.
    # With a split window the host runs on after the lock: the drained kernel is held, so device_work still joins.
    data = scenario("cuda+criu", fault, workload="persistent_kernel", params={"state_size": 1 << 16, "quiesce_adapter": True},
                    mode="idempotent", split=split)
    data["pipeline"]["certify"] = ["audit"]
    r = one(data, tmp_path)
    assert r.verdict.outcome == "valid", r.verdict
    assert r.record.restores == (0 if fault == "none" else 1)
    order = stages(r)
    assert order.index("prepare") < order.index("cuda_lock")
    # The adapter drained the kernel at the cut, and it is in the certificate: device_work joined, quiescent.
    [cert] = r.record.certificates
    assert cert["eligible"] and cert["domains"]["device_work"].startswith("quiescent(op 2)@"), cert
    assert r.record.joined_domains == (["device_work"] if fault != "none" else [])


@two_gpus
def test_restore_onto_the_other_gpu(tmp_path):
    r = one(scenario("cuda+criu", "kill", target="other_gpu", params={"state_size": 1 << 18, "ballast_mib": 256}), tmp_path)
    assert r.verdict.outcome == "valid", r.verdict
    rep = r.record.report
    assert rep["pointers_initial"] == rep["pointers_final"] and rep["pointer_table_ok"]
    before = next(row["detail"] for row in r.timeline if row["stage"] == "cuda_discover").split(":", 1)[1]
    after = r.record.facts["gpus_after_remap"].split(":", 1)[1]
    print("GPU before/after (NVML):", before, after, "runtime says:", rep["gpu_uuid_initial"], rep["gpu_uuid"])
    assert after.startswith("GPU-") and after != before  # the device memory really moved


HOG = textwrap.dedent("""
    import time, cupy as cp
    free, total = cp.cuda.runtime.memGetInfo()
    x = cp.empty(free - (128 << 20), dtype=cp.uint8)
    print("ready", flush=True)
    time.sleep(600)
""")


@two_gpus
def test_impossible_remap_is_refused_with_the_drivers_reason(tmp_path):
    import os

    hog = subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"})
    try:
        assert hog.stdout.readline().strip() == "ready"
        r = one(scenario("cuda+criu", "kill", target="other_gpu", params={"state_size": 1 << 18, "ballast_mib": 1024}),
                tmp_path)
    finally:
        hog.kill()
        hog.wait()
    assert r.verdict.outcome == "refused", r.verdict
    # Refused before the cut (NVML: not enough free memory on the target): the workload never stopped.
    assert r.record.failed_stage == "cuda_restore" and "remap refused before the cut" in r.record.error
    assert r.record.report["host_op"] == 4 and "cuda_lock" not in stages(r)
    print("refusal:", r.record.error)


@two_gpus
def test_driver_remap_onto_a_full_gpu(tmp_path):
    """The driver's own answer to a remap that cannot fit, and whether the process comes back afterwards."""
    import os

    from cutbench.errors import CudaCallError
    from cutbench.harness.nemesis.backends.cuda_driver import CudaDriver

    drv = CudaDriver()
    gpus = drv.gpu_uuids()
    go = tmp_path / "go"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(go)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"})
    hog = subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"})
    seen = {}
    try:
        child.stdout.readline()
        assert hog.stdout.readline().strip() == "ready"
        drv.lock(child.pid, 5000)
        drv.checkpoint(child.pid)
        with pytest.raises(CudaCallError) as remap:
            drv.restore(child.pid, [(gpus[0], gpus[1]), (gpus[1], gpus[0])])
        seen["remap"] = str(remap.value)
        seen["state_after_remap"] = drv.get_state(child.pid)
        try:
            drv.restore(child.pid)
            seen["plain_restore_with_hog"] = "ok"
        except CudaCallError as exc:
            seen["plain_restore_with_hog"] = str(exc)
        hog.kill()
        hog.wait()
        for _ in range(10):
            if drv.get_state(child.pid) != "checkpointed":
                break
            try:
                drv.restore(child.pid)
                seen["plain_restore_after_hog"] = "ok"
            except CudaCallError as exc:
                seen["plain_restore_after_hog"] = str(exc)
                time.sleep(1)
        seen["state_final"] = drv.get_state(child.pid)
        if seen["state_final"] == "locked":
            drv.unlock(child.pid)
            go.touch()
            seen["child_exit"] = child.wait(60)
    finally:
        print("remap onto a full GPU:", seen)
        for p in (hog, child):
            p.kill()
            p.wait()
    # The driver's reason for the refusal. (Driver 580.159.04 then left the
    # process CHECKPOINTED for good, CUDA_ERROR_OPERATING_SYSTEM on every later
    # restore, which is why the harness checks free memory before a remap.)
    assert remap.value.name == "CUDA_ERROR_OUT_OF_MEMORY", seen
    assert seen["state_after_remap"] == "checkpointed"


@two_gpus
@pytest.mark.parametrize("target", ["same", "other_gpu"])
def test_nccl_ranks_coordinated_suspend_resume(tmp_path, target):
    """Both ranks locked, checkpointed, dumped, restored (swapping GPUs for other_gpu) and unlocked: the job goes on."""
    r = one(scenario("cuda+criu", "none", workload="nccl_ranks", phase="record", target=target,
                     params={"state_size": 4096, "world_size": 2}), tmp_path)
    assert r.verdict.outcome == "valid", r.verdict
    assert r.record.facts["cuda_processes"] == 2
    restores = [row["detail"] for row in r.timeline if row["stage"] == "cuda_restore"]
    assert len(restores) == 2 and all(("remap" in d) == (target == "other_gpu") for d in restores), restores
    if target == "other_gpu":
        before = next(row["detail"] for row in r.timeline if row["stage"] == "cuda_discover")
        after = r.record.facts["gpus_after_remap"]
        print("ranks' GPUs before/after (NVML):", before, "|", after)
        gpu = {part.split(":")[0]: part.split(":")[1] for part in before.replace("pid ", "").split()}
        moved = {part.split(":")[0]: part.split(":")[1] for part in after.replace("pid ", "").split()}
        assert all(moved[p] != gpu[p] for p in gpu), (before, after)  # the two ranks swapped GPUs


@two_gpus
@pytest.mark.xfail(strict=True, reason="CRIU 4.2.1 cannot restore NCCL's loopback sockets after a kill "
                                       "(sk-inet: Can't bind inet socket: Address already in use)")
def test_nccl_ranks_kill_and_restore(tmp_path):
    r = one(scenario("cuda+criu", "kill", workload="nccl_ranks", phase="record",
                     params={"state_size": 4096, "world_size": 2}), tmp_path)
    assert r.verdict.outcome == "valid", r.record.error

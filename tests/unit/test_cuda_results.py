"""CUresult mapping and stage classification of the CUDA backends (pure; no GPU needed)."""

from __future__ import annotations

import pytest

from cutbench.harness.nemesis.backends.cuda import classify
from cutbench.harness.nemesis.backends.cuda_driver import RESULTS, call_error
from cutbench.errors import StageFailed, StageRefused


def test_codes_are_unique_and_success_is_zero():
    codes = [code for code, _ in RESULTS.values()]
    assert len(codes) == len(set(codes))
    assert RESULTS["CUDA_SUCCESS"][0] == 0


def test_names_and_codes_match_the_bindings():
    drv = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings not installed")
    for name, (code, _) in RESULTS.items():
        assert int(getattr(drv.CUresult, name)) == code, name


def test_error_text_names_call_pid_result_and_meaning():
    err = call_error("cuCheckpointProcessLock", 4242, 600)
    text = str(err)
    assert "cuCheckpointProcessLock(pid 4242)" in text
    assert "CUDA_ERROR_NOT_READY" in text and "lock timeout" in text
    unknown = call_error("cuCheckpointProcessRestore", 1, 12345)
    assert "CUresult 12345" in str(unknown) and "not documented" in str(unknown)


def test_lock_failure_leaving_processes_running_is_a_refusal():
    err = call_error("cuCheckpointProcessLock", 7, 600)
    out = classify("cuda_lock", err, ["running", "running"])
    assert isinstance(out, StageRefused) and out.stage == "cuda_lock" and "RUNNING" in out.reason


@pytest.mark.parametrize("states", [["running", "locked"], [], ["failed"]])
def test_lock_failure_that_disturbed_a_process_is_a_failure(states):
    out = classify("cuda_lock", call_error("cuCheckpointProcessLock", 7, 999), states)
    assert isinstance(out, StageFailed)


@pytest.mark.parametrize("stage", ["cuda_restore", "cuda_unlock"])
def test_a_failing_restore_of_the_image_is_a_failure_naming_the_stage(stage):
    """Restoring the image is the tool's job: its failure loses the application, whatever the state after."""
    out = classify(stage, call_error("x", 7, 401), ["running"])
    assert isinstance(out, StageFailed) and out.stage == stage and "CUDA_ERROR_ILLEGAL_STATE" in out.reason


@pytest.mark.parametrize("stage", ["cuda_checkpoint", "cuda_restore_original", "cuda_unlock_original"])
def test_a_failure_undone_with_every_process_running_again_is_a_refusal(stage):
    """On the way to the image, or resuming the original after a leave_running dump: the application went on."""
    out = classify(stage, call_error("x", 7, 999), ["running"])
    assert isinstance(out, StageRefused) and out.stage == stage and "brought back RUNNING" in out.reason
    assert isinstance(classify(stage, call_error("x", 7, 999), ["checkpointed"]), StageFailed)

"""Units of the CUDA backends that need no GPU: availability, the utility's output, remap planning."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cutbench.harness.nemesis import Backends
from cutbench.harness.environment import gpu_mem
from cutbench.harness.provision.criu import plugin
from cutbench.harness.nemesis.backends.cuda import CudaStages
from cutbench.harness.nemesis.backends.cuda_discovery import CudaProcs
from cutbench.errors import CudaCallError
from cutbench.harness.nemesis.backends.cuda_checkpoint_util import UtilityDriver
from cutbench.errors import StageRefused


def fake_tool(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "bin" / "cuda-checkpoint"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


@pytest.mark.parametrize("name", ["cuda-checkpoint", "cuda-checkpoint+criu"])
def test_utility_backends_are_unavailable_without_the_utility(monkeypatch, tmp_path, name):
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = Backends().new(name).unavailable_reason()
    assert reason and "cuda-checkpoint utility is not on PATH" in reason


def test_the_utility_recipe_offers_what_the_driver_api_pipeline_offers(tmp_path):
    """``cuda-checkpoint+criu`` is ``cuda+criu`` over the utility: same faults, split window, stages and
    coverage, so the same plans run through both; its driver is the utility."""
    via_utility, via_api = Backends().new("cuda-checkpoint+criu"), Backends().new("cuda+criu")
    assert via_utility.capabilities == via_api.capabilities
    assert isinstance(via_utility.make_driver(), UtilityDriver)


def test_utility_driver_reads_state_and_maps_errors(tmp_path):
    exe = fake_tool(tmp_path, 'case "$*" in\n'
                              '  *--get-state*) echo "locked";;\n'
                              '  *unlock*) exit 0;;\n'
                              '  *lock*) echo "Error: CUDA_ERROR_NOT_READY while locking" >&2; exit 1;;\n'
                              '  *) exit 0;;\nesac\n')
    drv = UtilityDriver(str(exe))
    assert drv.get_state(123) == "locked"
    with pytest.raises(CudaCallError) as err:
        drv.lock(123, 1000)
    assert err.value.name == "CUDA_ERROR_NOT_READY" and err.value.code == 600
    drv.unlock(123)
    with pytest.raises(CudaCallError, match="cannot remap"):
        drv.restore(123, [("GPU-a", "GPU-b")])


def test_plugin_backend_says_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.delenv(plugin.PLUGIN_ENV, raising=False)
    assert plugin.PLUGIN_ENV in plugin.plugin_unavailable_reason()
    monkeypatch.setenv(plugin.PLUGIN_ENV, str(tmp_path))
    assert "holds no cuda_plugin.so" in plugin.plugin_unavailable_reason()
    (tmp_path / "cuda_plugin.so").write_bytes(b"")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "cuda-checkpoint" in plugin.plugin_unavailable_reason()
    fake_tool(tmp_path, "exit 0\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ.get("PATH", ""))
    assert plugin.plugin_unavailable_reason() is None
    assert Backends().new("criu-cuda-plugin").extra_args == ("--libdir", str(tmp_path))


class TwoGpus:
    supports_remap = True

    def __init__(self, n: int = 2):
        self.uuids = [f"GPU-{i}" for i in range(n)]

    def gpu_uuids(self) -> list[str]:
        return self.uuids


def test_remap_rotates_every_visible_gpu(monkeypatch):
    monkeypatch.setattr(gpu_mem, "free_bytes", lambda: {})
    stages = CudaStages(TwoGpus())
    procs = CudaProcs([10, 11], {10: ["GPU-0"], 11: ["GPU-1"]}, 0, {10: {"GPU-0": 1}, 11: {"GPU-1": 1}})
    pairs = stages.remap_pairs(procs, "other_gpu")
    assert pairs == {10: [[("GPU-0", "GPU-1"), ("GPU-1", "GPU-0")]], 11: [[("GPU-0", "GPU-1"), ("GPU-1", "GPU-0")]]}
    assert stages.remap_pairs(procs, "same") == {}


@pytest.mark.parametrize("n,gpus,reason", [(1, {10: ["GPU-0"]}, "needs 2 GPUs"), (2, {10: []}, "cannot tell which GPU")])
def test_remap_that_cannot_be_asked_for_is_refused(monkeypatch, n, gpus, reason):
    monkeypatch.setattr(gpu_mem, "free_bytes", lambda: {})
    with pytest.raises(StageRefused, match=reason):
        CudaStages(TwoGpus(n)).remap_pairs(CudaProcs([10], gpus), "other_gpu")


def test_remap_onto_a_gpu_without_room_is_refused_before_the_cut(monkeypatch):
    gib = 1 << 30
    procs = CudaProcs([10], {10: ["GPU-0"]}, 2 * gib, {10: {"GPU-0": 2 * gib}})
    monkeypatch.setattr(gpu_mem, "free_bytes", lambda: {"GPU-0": 100 * gib, "GPU-1": gib})
    with pytest.raises(StageRefused, match="remap refused before the cut: GPU-1"):
        CudaStages(TwoGpus()).remap_pairs(procs, "other_gpu")
    # A swap fits when the memory the checkpoint frees is counted.
    monkeypatch.setattr(gpu_mem, "free_bytes", lambda: {"GPU-0": gib, "GPU-1": 3 * gib})
    assert CudaStages(TwoGpus()).remap_pairs(procs, "other_gpu")


class _StuckDriver:
    """A driver interface whose checkpoint call never returns (a process stuck in the driver)."""

    supports_remap = False

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()
        self.calls: list[str] = []

    def get_state(self, pid: int) -> str:
        self.calls.append("get_state")
        return "locked"

    def lock(self, pid: int, timeout_ms: int) -> None:
        self.calls.append("lock")

    def checkpoint(self, pid: int) -> None:
        self.calls.append("checkpoint")
        self.release.wait()  # until the test ends

    def restore(self, pid: int, pairs=()) -> None:
        self.calls.append("restore")

    def unlock(self, pid: int) -> None:
        self.calls.append("unlock")

    def gpu_uuids(self) -> list[str]:
        return []


def test_a_driver_call_that_never_returns_is_a_hung_stage_and_nothing_waits_behind_it():
    from cutbench.errors import HUNG_MARK, StageFailed
    from cutbench.harness.model.plan import Cut
    from cutbench.harness.model.timeline import Timeline
    from cutbench.harness.nemesis.base import CutContext

    driver = _StuckDriver()
    stages = CudaStages(driver)
    ctx = CutContext(images_dir=Path("/nonexistent"), timeline=Timeline("t"), cut_index=0, cut=Cut(2, "launch"),
                     stage_timeout_s=0.3)
    try:
        with pytest.raises(StageFailed, match=HUNG_MARK) as err:
            stages.cut(CudaProcs([os.getpid()]), ctx)
        assert err.value.stage == "cuda_checkpoint"
        # The way back asks nothing more about the stuck process (a second call would queue behind the first).
        calls = len(driver.calls)
        assert stages.bring_back([os.getpid()]) == []
        assert len(driver.calls) == calls
        assert "inside its hung cuda_checkpoint call" in stages.take_actions()
    finally:
        driver.release.set()

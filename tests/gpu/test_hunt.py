"""``cutbench hunt`` on a real GPU: the driver API's lifecycle searched, every deviation shown by its reproducer alone."""

from __future__ import annotations

import pytest

from cutbench.harness.hunt.nemesis import unavailable_reason
from cutbench.harness.hunt.runner import hunt

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tool", ["cuda", "cuda-checkpoint"])
def test_the_hunt_blames_no_deviation_on_the_harness(tool, tmp_path):
    reason = unavailable_reason(tool)
    if reason:
        pytest.skip(reason)
    doc = hunt(tool, tmp_path, budget_s=40, length=8, repeat=1, bound_s=30, say=lambda _m: None)
    assert doc["search"]["sequences"] >= 3 and not doc["search"]["harness_errors"]
    # Every deviation found must show in its standalone reproducer: one that does not is the harness's bug.
    assert doc["harness_deviations"] == [], [f["standalone"] for f in doc["findings"]]
    tried = doc["search"]["transitions"]
    assert any(k.startswith("checkpoint@locked->ok") for k in tried), tried
    # The documented round trip held whenever it was walked: an unlock after a restore answered ok.
    assert "unlock@locked->refused" not in tried, tried


@pytest.mark.parametrize("probe", ["buffers", "streams", "pinned"])
@pytest.mark.parametrize("tool", ["cuda", "cuda-checkpoint"])
def test_each_probe_left_at_its_launch_comes_back_with_its_work_done(tool, probe, monkeypatch):
    """Half a second of GPU work in flight at the lock, on each probe: the documented round trip (and a CRIU dump
    and restore of the CHECKPOINTED process in the middle) answers ok at every step, and the digest after the
    unlock finds the work done once, the buffers where they were and the pinned mirror up to date."""
    from cutbench.harness.hunt import nemesis as hands
    from cutbench.harness.nemesis.lifecycle_kit import replay

    reason = unavailable_reason(tool)
    if reason:
        pytest.skip(reason)
    for k, v in hands.environment(tool).items():
        monkeypatch.setenv(k, v)
    launch = {"action": "step", "args": {"k": 2, "phase": "launch"}}
    steps = [launch, {"action": "lock", "args": {"timeout_ms": 5000}}, {"action": "checkpoint"},
             {"action": "criu_dump"}, {"action": "criu_restore"}, {"action": "restore"}, {"action": "unlock"},
             {"action": "step", "args": {"k": 1}}, launch, {"action": "kill"}]
    seen = replay(tool, steps, bound_s=60, probe=probe)
    assert [o["answer"] for o in seen] == ["ok"] * len(seen), seen
    assert seen[6]["continues"] and seen[7]["continues"], seen


def test_a_probe_restored_onto_another_gpu_continues(monkeypatch):
    """lock → checkpoint → restore onto device 1 (the driver's GPU UUID pair) → unlock → step: every step ok and
    the probe's buffers as they were. Needs two GPUs of one chip type."""
    import shutil
    import subprocess

    from cutbench.harness.hunt import nemesis as hands
    from cutbench.harness.nemesis.lifecycle_kit import replay

    reason = unavailable_reason("cuda")
    if reason:
        pytest.skip(reason)
    smi = shutil.which("nvidia-smi")
    names = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=60).stdout.split("\n") if smi else []
    names = [n for n in names if n.strip()]
    if len(names) < 2 or len(set(names)) > 1:
        pytest.skip(f"needs two GPUs of one chip type (a restore onto another GPU); this machine has {len(names)}")
    for k, v in hands.environment("cuda").items():
        monkeypatch.setenv(k, v)
    steps = [{"action": "lock", "args": {"timeout_ms": 5000}}, {"action": "checkpoint"},
             {"action": "restore_other_gpu"}, {"action": "unlock"}, {"action": "step", "args": {"k": 1}}]
    seen = replay("cuda", steps, bound_s=60)
    assert [o["answer"] for o in seen] == ["ok"] * len(seen), seen
    assert seen[3]["continues"] and seen[4]["continues"], seen

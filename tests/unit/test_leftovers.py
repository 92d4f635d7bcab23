"""What a killed harness leaves behind and the sweep that removes it (claims, image and work directories)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cutbench.harness.environment import leftovers
from cutbench.harness.provision import engines
from cutbench.procs import identity, identity_alive, package_env


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private claims directory, and no engine to ask (the container half runs in tests/criu/test_containers.py)."""
    monkeypatch.setenv(leftovers.RUNS_ENV, str(tmp_path / "runs"))
    monkeypatch.setattr(engines, "trial_containers", lambda: [])
    return tmp_path / "runs"


def dead_identity() -> str:
    """The identity of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    ident = identity(proc.pid)
    proc.kill()
    proc.wait()
    return ident


def test_an_identity_names_one_process_for_as_long_as_it_runs():
    me = identity()
    assert identity_alive(me)
    gone = dead_identity()
    assert not identity_alive(gone)
    pid, ticks = me.split(":")
    assert not identity_alive(f"{pid}:{int(ticks) + 1}")  # the same pid, started at another time: another process
    assert not identity_alive("garbage")


def test_a_claim_lasts_as_long_as_its_run_and_the_sweep_leaves_a_live_run_alone(runs: Path, tmp_path: Path):
    images = tmp_path / "shm"
    (images / "cutbench-R1-t0001-c0").mkdir(parents=True)
    with leftovers.claim("R1", images_dirs={str(images)}, workdir=tmp_path / "cutbench-R1-w", receiver_pid=None) as path:
        body = json.loads(path.read_text())
        assert body["harness"] == identity() and body["images_dirs"] == [str(images)]
        assert leftovers.sweep() == []  # its harness (this process) runs
        assert (images / "cutbench-R1-t0001-c0").is_dir()
    assert not path.exists()


def test_the_sweep_removes_what_a_dead_harness_left_and_says_so(runs: Path, tmp_path: Path):
    images, work = tmp_path / "shm", tmp_path / "cutbench-R2-abcd"
    for d in (images / "cutbench-R2-t0001-c0", images / "cutbench-R2-t0002-c1", images / "cutbench-OTHER-t0001-c0", work):
        d.mkdir(parents=True)
    receiver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (work / "t0003").mkdir()  # a workload parked at its cut, working in its trial's directory
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=work / "t0003", env=package_env())
    elsewhere = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path, env=package_env())
    # A person's shell looking into the dead run's directory: not the harness's, left alone.
    onlooker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=work / "t0003")
    runs.mkdir(parents=True)
    (runs / "R2.json").write_text(json.dumps({"run_id": "R2", "harness": dead_identity(), "images_dirs": [str(images)],
                                              "workdir": str(work), "receiver": identity(receiver.pid)}))
    (runs / "broken.json").write_text("{not json")
    # A stopped dump's image in each run's directory: the dead run's lock is released (tests/criu/test_network_lock.py
    # holds the release itself to CRIU's table), the other run's is not this claim's.
    for d in (images / "cutbench-R2-t0002-c1", images / "cutbench-OTHER-t0001-c0"):
        (d / "inventory.img").write_bytes(b"\x00")
    asked: list[Path] = []
    said = leftovers.sweep(lambda image: asked.append(image) or "CRIU-0123")
    receiver.wait(timeout=10)
    assert asked == [images / "cutbench-R2-t0002-c1"] and "CRIU network lock CRIU-0123 of run R2" in said
    assert workload.wait(timeout=10) == -9 and elsewhere.poll() is None  # only what works in the run's directory
    assert onlooker.poll() is None
    elsewhere.kill()
    onlooker.kill()
    assert f"workload process {workload.pid} of run R2" in said
    assert not (images / "cutbench-R2-t0001-c0").exists() and not (images / "cutbench-R2-t0002-c1").exists()
    assert (images / "cutbench-OTHER-t0001-c0").is_dir()  # another run's: not this claim's to remove
    assert not work.exists() and not (runs / "R2.json").exists() and not (runs / "broken.json").exists()
    assert receiver.returncode == -9
    assert any("image directory of run R2" in line for line in said) and any("receiver of run R2" in line for line in said)
    assert any("claim of run R2" in line and "is gone" in line for line in said)
    assert leftovers.sweep() == []

"""The nemesis pipeline's classification of a failing stage, whose failure it is.

A real process is cut by a small backend whose stage ends the way a tool's
does (declines, loses the application, or the harness cannot carry it out);
the pipeline's outcome is what the runner turns into ``refused``, ``lost``
or ``unknown``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from cutbench.errors import HarnessFault, StageFailed, StageRefused
from cutbench.harness.model.plan import Cut
from cutbench.harness.model.timeline import Timeline
from cutbench.harness.nemesis.base import Capabilities, CutContext
from cutbench.harness.nemesis.pipeline import execute_cut
from cutbench.procs import spawn


class EndsWith:
    """A backend whose checkpoint stage ends with ``error`` (it never takes an image)."""

    name = "ends-with"
    capabilities = Capabilities(stages=("stage",), covers=frozenset({"cpu"}))

    def __init__(self, error: Exception):
        self.error = error

    def unavailable_reason(self) -> None:
        return None

    def checkpoint(self, target, ctx) -> None:
        with ctx.timeline.stage("stage", ctx.cut_index):
            raise self.error

    def restore(self, ctx) -> int:
        raise AssertionError("never reached")

    def resume_in_place(self, target, ctx) -> None:
        raise AssertionError("never reached")

    def cleanup(self, ctx) -> None:
        pass


@pytest.mark.parametrize("error,status", [
    (StageRefused("stage", "declined, the process went on"), "refused"),
    (StageFailed("stage", "the process died"), "failed"),
    (HarnessFault("stage", "no record of the processes"), "error"),
])
def test_a_failing_stage_is_the_tools_refusal_the_tools_loss_or_the_harness_own(tmp_path: Path, error, status):
    child = spawn([sys.executable, "-c", "import time; time.sleep(30)"], cwd=str(tmp_path))
    released = []
    try:
        ctx = CutContext(images_dir=tmp_path / "images", timeline=Timeline("t0"), cut_index=0,
                         cut=Cut(op=1, phase="admit", fault="kill"))
        out = execute_cut(EndsWith(error), child, ctx, release=lambda: released.append(1), before_resume=lambda: None)
        assert (out.status, out.stage, out.error) == (status, "stage", error.reason)
        assert released == [1]  # whatever the outcome, a parked workload is let go
        assert not (tmp_path / "images").exists()
    finally:
        child.kill()


def test_a_cuts_images_go_to_the_discard_it_is_given_and_a_session_waits_for_its_discards(tmp_path: Path):
    from cutbench.harness.runner.session import Session

    child = spawn([sys.executable, "-c", "import time; time.sleep(30)"], cwd=str(tmp_path))
    handed = []
    try:
        images = tmp_path / "images"
        images.mkdir()
        (images / "pages-1.img").write_bytes(b"x" * 4096)
        ctx = CutContext(images_dir=images, timeline=Timeline("t0"), cut_index=0,
                         cut=Cut(op=1, phase="admit", fault="kill"))
        execute_cut(EndsWith(StageRefused("stage", "no")), child, ctx, release=lambda: None,
                    before_resume=lambda: None, discard=handed.append)
        assert handed == [images] and images.exists()  # the cut does not wait for the removal
    finally:
        child.kill()
    session = Session("r")
    session.images.discard(images)
    session.images.settle(keep=0)  # this thread's removals (a worker's next cut waits for all but its latest)
    assert not images.exists()
    older, latest = tmp_path / "older", tmp_path / "latest"
    for d in (older, latest):
        d.mkdir()
        session.images.discard(d)
    session.images.settle()  # before a cut: all but the latest are gone (at most two images per worker)
    assert not older.exists()
    session.images.drain()  # every thread's: what the session waits for before it ends
    assert not latest.exists()


def test_a_session_builds_one_reference_per_parameter_set_and_thread():
    """Shared by a thread's trials; never by two threads (a reference may advance a model as it is asked)."""
    import threading

    from cutbench.harness.runner.session import Session
    from cutbench.workloads.counter import Counter

    session = Session("r")
    one = session.references.get(Counter, {"seed": 1, "state_size": 64})
    assert session.references.get(Counter, {"state_size": 64, "seed": 1}) is one
    other = session.references.get(Counter, {"seed": 2, "state_size": 64})
    assert other is not one and other.checksum(3) != one.checksum(3)
    elsewhere = []
    thread = threading.Thread(target=lambda: elsewhere.append(session.references.get(Counter, {"seed": 1, "state_size": 64})))
    thread.start()
    thread.join()
    assert elsewhere[0] is not one and elsewhere[0].checksum(3) == one.checksum(3)


def test_settle_waits_for_an_older_removal_still_running_when_a_newer_one_has_finished(tmp_path: Path, monkeypatch):
    """The removals finish in any order: when the latest is done first, the one before it is still waited for."""
    import threading

    from cutbench.harness.runner import shared

    older, latest = tmp_path / "older", tmp_path / "latest"
    release = threading.Event()

    def remove(path: Path) -> None:
        if path == older:
            release.wait(10)  # the older removal is slow ...
        shutil.rmtree(path)

    monkeypatch.setattr(shared, "remove_tree", remove)
    discards = shared.ImageDiscards()
    for d in (older, latest):
        d.mkdir()
        discards.discard(d)
    while latest.exists():  # ... and the latest is done first
        threading.Event().wait(0.01)
    threading.Timer(0.2, release.set).start()
    discards.settle()
    assert not older.exists()


@pytest.mark.parametrize("exit_status, error", [(0, HarnessFault), (-9, StageFailed), (1, StageFailed)])
def test_a_dump_that_finds_its_workload_gone_blames_the_tool_unless_the_workload_had_ended_on_its_own(exit_status, error):
    # CRIU's, Docker's and Podman's checkpoints alike: an asynchronous cut that came after the program exited 0 is
    # the harness's timing (the trial is unknown); a workload killed or failed under the dump is the tool's loss.
    from cutbench.harness.nemesis.backends.criu import dump_failure
    from cutbench.procs import Child

    failure = dump_failure("docker_checkpoint", "docker checkpoint: 500 Container abc not running",
                           Child(pid=2**22 + 1, returncode=exit_status))
    assert type(failure) is error and failure.stage == "docker_checkpoint"
    assert "not running" in failure.reason
    assert ("no claim about the tool" in failure.reason) == (exit_status == 0)


# A workload whose child calls setsid and sleeps on: a session and a group of its own, as a daemonised helper's.
SETSID_CHILD = ("import os, sys, time\n"
                "if os.fork() == 0:\n"
                "    os.setsid(); print('ready', flush=True); time.sleep(60); os._exit(0)\n"
                "time.sleep(60)\n")


def test_a_kill_takes_a_child_that_left_the_process_group_and_reaps_it(tmp_path: Path):
    # CRIU restores every pid of the tree it dumped: a child in a session of its own that outlived the kill of its
    # parent's group held its pid, and every restore failed "File exists", blamed on the tool.
    import os

    from cutbench import procs

    read, write = os.pipe()
    child = spawn([sys.executable, "-c", SETSID_CHILD], cwd=str(tmp_path), stdout=write)
    os.close(write)
    with os.fdopen(read) as out:
        assert out.readline() == "ready\n"
    members = procs.tree(child.pid)
    (helper,) = [m for m in members if not m.startswith(f"{child.pid}:")]
    helper_pid = int(helper.split(":")[0])
    assert os.getsid(helper_pid) == helper_pid != os.getsid(child.pid)
    child.kill()
    # Gone and reaped (it was re-parented to the harness, the subreaper): its pid is free for a restore.
    assert not procs.holds_pid(helper) and child.members == set()


def test_a_restore_that_finds_a_pid_of_its_image_taken_names_the_holder_and_is_the_harness_own(tmp_path: Path):
    from cutbench.harness.nemesis.backends.criu import restore_failure

    import time

    holder = spawn([sys.executable, "-c", "import time; time.sleep(30)"], cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 10  # its command line is there once it runs
        while b"sleep" not in Path(f"/proc/{holder.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        ctx = CutContext(images_dir=tmp_path / "images", timeline=Timeline("t0"), cut_index=0,
                         cut=Cut(op=1, phase="effect", fault="kill"))
        words = f"criu restore exit 1: 5269: Error (criu/cr-restore.c:1237): Can't fork for {holder.pid}: File exists"
        failure = restore_failure("criu_restore", words, ctx)
        assert type(failure) is HarnessFault and "no claim about the tool" in failure.reason
        assert f"pid {holder.pid} ({sys.executable} -c import time; time.sleep(30))" in failure.reason
        # Any other failed restore is still the tool's.
        assert type(restore_failure("criu_restore", "criu restore exit 1: Can't open file x", ctx)) is StageFailed
    finally:
        holder.kill()

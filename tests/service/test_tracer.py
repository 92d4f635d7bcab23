"""The system-call tracer on real programs (``harness/observer/syscalls.py``, ``tracer.py``): ptrace, no CRIU.

What a cut of phase ``syscall`` rests on: the counted calls are the ones that make an effect visible or durable
on the program's own targets; a program held before its k-th call has not made it, stopped whole and untraced it
is a process any tool can seize, and continued it makes that call exactly once; while held, its other threads run.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from cutbench.harness.observer.syscalls import Tracer, unavailable_reason, waiting_command
from cutbench.procs import spawn, stat_fields

# Two lines on stdout, a saved file (write, fsync, rename into place), a scratch file unlinked; writes to
# /dev/null and outside its directory, which count for nothing.
PROGRAM = """
import os, sys
for i in (1, 2):
    os.write(1, b"line %d\\n" % i)
with open("state.tmp", "w") as f:
    f.write("saved"); f.flush(); os.fsync(f.fileno())
os.rename("state.tmp", "state")
open("scratch", "w").close(); os.unlink("scratch")
os.write(os.open(os.devnull, os.O_WRONLY), b"nothing")
with open(sys.argv[1], "w") as f:
    f.write("outside")
"""

# A writer thread keeps appending (outside its directory: it does not count) while the main thread writes its
# lines: the held thread alone stops.
THREADED = """
import os, sys, threading, time
def beat():
    while True:
        with open(sys.argv[1], "a") as f:
            f.write("x")
        time.sleep(0.01)
threading.Thread(target=beat, daemon=True).start()
time.sleep(0.2)
for i in range(1, 4):
    os.write(1, b"line %d\\n" % i)
time.sleep(0.3)
"""

CALLS = ("write", "fsync", "rename", "unlink", "unlinkat", "exit_group")


def start(tmp_path: Path, source: str, *, stop_at: int = 0, calls=CALLS, args=(), stops: bool = False):
    (tmp_path / "prog.py").write_text(source)
    read, write = os.pipe()
    child = spawn(waiting_command([sys.executable, "prog.py", *args], tmp_path), cwd=str(tmp_path), stdout=write)
    os.close(write)
    tracer = Tracer(child, calls=calls, directory=tmp_path, stop_at=stop_at, stops=stops)
    try:
        tracer.start()
    except BaseException:
        child.kill()
        os.close(read)
        raise
    return child, tracer, os.fdopen(read)


def test_this_machine_can_trace():
    assert unavailable_reason() is None


def test_the_counted_calls_are_those_on_the_program_s_own_targets(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    child, tracer, out = start(work, PROGRAM, args=[str(tmp_path / "elsewhere")])
    try:
        assert child.wait(20) == 0 and tracer.wait_ended(10)
    finally:
        tracer.close()
        out.close()
    said = [b.words() for b in tracer.boundaries]
    assert said == ["write(stdout) `line 1`", "write(stdout) `line 2`", "write(file:state.tmp) `saved`",
                    "fsync(file:state.tmp)", "rename(file:state.tmp -> file:state)", "unlink(file:scratch)",
                    "exit_group"], said


def test_the_kernel_s_counters_count_what_a_stop_at_every_call_counts_for_a_fraction_of_the_stops(tmp_path: Path):
    # The same program recorded both ways; 3,000 calls that never count stop it only where every call stops.
    recorded = {}
    for stops in (False, True):
        work = tmp_path / f"stops-{stops}"
        work.mkdir()
        child, tracer, out = start(work, "import os\nfor _ in range(3000): os.getppid()\n" + PROGRAM,
                                   args=[str(tmp_path / "elsewhere")], stops=stops)
        try:
            assert child.wait(30) == 0 and tracer.wait_ended(10)
        finally:
            tracer.close()
            out.close()
        recorded[stops] = [b.words() for b in tracer.boundaries], tracer.mode, tracer.stops
    (counted, mode, stops_made), (counted_at_stops, mode_at_stops, stops_at_every_call) = recorded[False], recorded[True]
    assert counted == counted_at_stops and len(counted) == 7 and counted[-1] == "exit_group", recorded
    assert (mode, mode_at_stops) == ("counters", "stops")
    assert 0 < stops_made * 10 < stops_at_every_call, recorded


# Lines on stdout, each a counted call: far more than the margin before the held call, so the kernel's counters
# count the first ones and a stop at every call the last ones before it.
LINES = """
import os
for i in range(1, 401):
    os.write(1, b"line %d\\n" % i)
"""

# Four threads writing their lines at once: the held call's count must survive calls in flight at the switch.
WRITERS = """
import os, threading
def lines(t):
    for i in range(100):
        os.write(1, b"t%d line %d\\n" % (t, i))
        for _ in range(20):
            os.getppid()
threads = [threading.Thread(target=lines, args=(t,)) for t in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def test_a_program_held_far_from_its_start_is_held_at_that_very_call(tmp_path: Path):
    child, tracer, out = start(tmp_path, LINES, stop_at=300, calls=("write",))
    try:
        assert tracer.wait_held(20) and tracer.mode == "counters"
        assert tracer.held.words() == "write(stdout) `line 300`", tracer.held
        tracer.freeze()
        time.sleep(0.2)
        assert [out.readline() for _ in range(299)][-1] == "line 299\n"
        tracer.release(child)
        assert child.wait(20) == 0 and out.read() == "".join(f"line {i}\n" for i in range(300, 401))
    finally:
        tracer.close()
        child.kill()
        out.close()


@pytest.mark.parametrize("then", ["freeze", "release"])
def test_threads_writing_at_once_are_held_at_the_call_and_make_every_call_once(tmp_path: Path, then: str):
    child, tracer, out = start(tmp_path, WRITERS, stop_at=250, calls=("write",))
    try:
        assert tracer.wait_held(20) and tracer.held.n == 250 and tracer.mode == "counters"
        if then == "freeze":
            tracer.freeze()
            assert stat_fields(f"/proc/{child.pid}/stat")[1][0] == "T"
        tracer.release(child)
        # No counter's signal reached the program untraced (it would have died of SIGTRAP), no call was lost
        # or made twice.
        assert child.wait(30) == 0
        lines = out.read().splitlines()
        assert sorted(lines) == sorted(f"t{t} line {i}" for t in range(4) for i in range(100))
        assert tracer.held.head.rstrip("\n") in lines
    finally:
        tracer.close()
        child.kill()
        out.close()


# WRITERS at a pace (10 ms a line, a second at least): still writing when the harness ends its tracer.
PACED_WRITERS = WRITERS.replace("for _ in range(20):\n            os.getppid()", "time.sleep(0.01)").replace(
    "import os, threading", "import os, threading, time")


def test_a_recording_tracer_ended_mid_run_lets_the_program_go_unharmed(tmp_path: Path):
    # The harness ends a tracer with SIGTERM (Tracer.close): it disables its counters and detaches, and no
    # counter's signal reaches the program after it (untraced, one would kill it with SIGTRAP).
    child, tracer, out = start(tmp_path, PACED_WRITERS, calls=("write",))
    try:
        while len(tracer.boundaries) < 100:
            time.sleep(0.005)
        assert len(tracer.boundaries) < 400  # mid-run
        tracer.close()
        assert tracer._proc.returncode == 0, "the tracer did not end on SIGTERM by itself"
        assert child.wait(30) == 0
        assert sorted(out.read().splitlines()) == sorted(f"t{t} line {i}" for t in range(4) for i in range(100))
    finally:
        tracer.close()
        child.kill()
        out.close()


def test_a_held_program_has_not_made_its_call_and_makes_it_once_when_continued(tmp_path: Path):
    child, tracer, out = start(tmp_path, PROGRAM, stop_at=3, args=[str(tmp_path / "elsewhere")])
    try:
        assert tracer.wait_held(20) and tracer.held.words() == "write(file:state.tmp) `saved`"
        tracer.freeze()
        # Stopped whole, nothing of the tracer left in it: a tool can seize it.
        status = Path(f"/proc/{child.pid}/status").read_text()
        assert stat_fields(f"/proc/{child.pid}/stat")[1][0] == "T"
        assert "TracerPid:\t0" in status and "Seccomp:\t0" in status
        time.sleep(0.2)
        assert out.readline() == "line 1\n" and out.readline() == "line 2\n"
        assert (tmp_path / "state.tmp").read_text() == ""  # opened, not yet written
        tracer.release(child)
        assert child.wait(20) == 0
        assert (tmp_path / "state").read_text() == "saved" and out.read() == ""
    finally:
        tracer.close()
        child.kill()
        out.close()


def test_a_released_program_goes_on_from_its_call_and_its_other_threads_run_while_it_is_held(tmp_path: Path):
    work, beat = tmp_path / "work", tmp_path / "beat"
    work.mkdir()
    child, tracer, out = start(work, THREADED, stop_at=2, calls=("write",), args=[str(beat)])
    try:
        assert tracer.wait_held(20) and tracer.held.words() == "write(stdout) `line 2`"
        before = beat.stat().st_size
        time.sleep(0.3)
        assert beat.stat().st_size > before  # the writer thread ran on
        tracer.release(child)
        assert child.wait(20) == 0
        assert out.read() == "line 1\nline 2\nline 3\n"
    finally:
        tracer.close()
        child.kill()
        out.close()


def test_a_program_that_ends_before_its_call_ends_the_tracer_without_a_hold(tmp_path: Path):
    child, tracer, out = start(tmp_path, "import os\nos.write(1, b'only\\n')\n", stop_at=5, calls=("write",))
    try:
        assert not tracer.wait_held(20) and child.wait(10) == 0 and len(tracer.boundaries) == 1
    finally:
        tracer.close()
        out.close()


# A writer thread that starts writing a file of its directory (calls that count) once told to (a file "go").
LATE_WRITER = """
import os, threading, time
def beat():
    while not os.path.exists("go"):
        time.sleep(0.01)
    while True:
        with open("beat", "a") as f:
            f.write("x")
        time.sleep(0.01)
threading.Thread(target=beat, daemon=True).start()
time.sleep(0.2)
for i in range(1, 4):
    os.write(1, b"line %d\\n" % i)
time.sleep(0.3)
"""


def test_a_frozen_program_runs_again_but_for_its_held_call_and_makes_it_once_when_released(tmp_path: Path):
    # What a GPU tool's CUDA restore needs between its CRIU half and its CUDA half: the program's threads running,
    # the thread held at the boundary held there still. Another thread's counted calls, which come after the
    # boundary, pass (a threaded server's other requests' sends, on an H100, were held instead).
    beat = tmp_path / "beat"
    child, tracer, out = start(tmp_path, LATE_WRITER, stop_at=2, calls=("write",))
    again = None
    try:
        assert tracer.wait_held(20)
        tracer.freeze()
        (tmp_path / "go").touch()
        time.sleep(0.2)
        assert not beat.exists()  # stopped whole
        again = tracer.rehold(child.pid)
        assert again.held is not None and again.held.words() == "write(stdout) `line 2`"
        time.sleep(0.3)
        assert beat.stat().st_size > 0  # its other thread runs again, its calls not held
        assert stat_fields(f"/proc/{child.pid}/stat")[1][0] != "T"
        again.release(child)
        assert child.wait(20) == 0
        assert out.read() == "line 1\nline 2\nline 3\n"
    finally:
        tracer.close()
        if again is not None:
            again.close()
        child.kill()
        out.close()

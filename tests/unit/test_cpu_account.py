"""CPU accounting per stage on real processes (``harness/nemesis/cpu_account.py``): a busy child's CPU is
its own, a vanished one keeps its last figures, CUDA-named threads are apart, measured children and helper
threads are credited to the stage, and old runs read with the columns as NaN."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cutbench.harness.nemesis import cpu_account
from cutbench.harness.nemesis.cpu_account import ProcessReader, StageSampler, helper_thread, run_measured
from cutbench.harness.model.timeline import CPU_COLUMNS, Timeline
from cutbench.harness.store.rundir import RunDir
from cutbench.procs import spawn

BURN_S = 0.3

# Says "ready" once started, burns BURN_S of CPU on its main thread (or, with "thread", on a thread that names
# itself cuda-test as the CUDA driver's threads are named, and lives on) when a line arrives, says "done" and sleeps.
BUSY_CHILD = f"""
import ctypes, sys, threading, time

def burn():
    t = time.thread_time()
    while time.thread_time() - t < {BURN_S}:
        pass

burnt = threading.Event()

def named_burn():
    ctypes.CDLL(None).prctl(15, b"cuda-test", 0, 0, 0)  # PR_SET_NAME
    burn()
    burnt.set()
    time.sleep(60)  # alive at the next sample, as a driver thread is

print("ready", flush=True)
sys.stdin.readline()
if sys.argv[1] == "thread":
    threading.Thread(target=named_burn, daemon=True).start()
    burnt.wait()
else:
    burn()
print("done", flush=True)
time.sleep(60)
"""


def busy_child(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", BUSY_CHILD, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def go(proc: subprocess.Popen) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def test_a_busy_child_cpu_is_attributed_to_its_pid():
    proc = busy_child("main")
    other = busy_child("main")  # idle meanwhile: none of the child's CPU may land on it
    try:
        sampler = StageSampler(lambda: {"workload": [proc.pid], "receiver": [other.pid]})
        before = sampler.sample()
        go(proc)
        after = sampler.sample()
        cols = sampler.columns(before, after)
        assert tuple(cols) == CPU_COLUMNS
        assert BURN_S * 0.8 <= cols["cpu_workload_s"] <= BURN_S * 3
        assert cols["cpu_receiver_s"] < 0.05 and cols["cpu_cuda_threads_s"] == 0
        assert cols["cpu_user_s"] + cols["cpu_sys_s"] == pytest.approx(cols["cpu_s"])
        assert cols["cpu_s"] == pytest.approx(sum(cols[f"cpu_{r}_s"] for r in cpu_account.ROLES))
        [(key, sample)] = after.procs["workload"].items()
        assert key[0] == proc.pid == sample.pid and not sample.gone
        grew = sample.usage.cpu_s - before.procs["workload"][key].usage.cpu_s
        assert grew == pytest.approx(cols["cpu_workload_s"])
    finally:
        stop(proc)
        stop(other)


def test_the_receiver_cpu_of_trials_side_by_side_is_counted_once():
    proc = busy_child("main")  # the receiver both trials talk to
    try:
        one, two = (StageSampler(lambda: {"receiver": [proc.pid]}) for _ in range(2))
        before_one, before_two = one.sample(), two.sample()
        go(proc)
        first = one.columns(before_one, one.sample())
        second = two.columns(before_two, two.sample())
        assert first["cpu_receiver_s"] >= BURN_S * 0.8
        assert second["cpu_receiver_s"] <= cpu_account.TICK_S + 1e-9  # the first stage to end had it
    finally:
        stop(proc)


def test_a_vanished_pid_gives_its_last_read_and_never_raises():
    proc = busy_child("main")
    reader = ProcessReader()
    try:
        go(proc)
        last = reader.read(proc.pid)
        assert last is not None and last.usage.cpu_s >= BURN_S * 0.8 and not last.gone
    finally:
        stop(proc)
    gone = reader.read(proc.pid)
    assert gone.gone and gone.usage == last.usage and gone.key == last.key
    assert reader.tree(proc.pid) == [gone]
    assert reader.read(2**22 + 12345) is None  # never seen, never there: nothing, no error
    assert reader.thread_groups(proc.pid) == {}


def test_a_reaped_workload_ends_with_what_wait4_gave_and_a_killed_one_costs_its_stage_nothing():
    child = spawn([sys.executable, "-c", BUSY_CHILD, "main"], cwd="/")
    sampler = StageSampler(lambda: {"workload": [child]})
    first = sampler.sample()
    time.sleep(0.5)  # its start-up and its burn (its stdin is /dev/null: the line it waits for is EOF at once)
    second = sampler.sample()
    child.kill()
    assert child.rusage is not None and child.returncode is not None
    third = sampler.sample()
    assert sampler.columns(first, second)["cpu_workload_s"] > 0
    # The kill: whole clock ticks on both sides, so a process that spent nothing more costs nothing more.
    assert sampler.columns(second, third)["cpu_workload_s"] <= cpu_account.TICK_S + 1e-9
    [final] = third.procs["workload"].values()
    assert final.gone and final.key == next(iter(second.procs["workload"]))


def test_threads_named_cuda_are_counted_apart_from_the_workload():
    proc = busy_child("thread")
    try:
        sampler = StageSampler(lambda: {"workload": [proc.pid]})
        before = sampler.sample()
        go(proc)
        groups = sampler.reader.thread_groups(proc.pid)
        after = sampler.sample()
        cols = sampler.columns(before, after)
        assert groups["cuda_threads"] >= BURN_S * 0.8
        assert cols["cpu_cuda_threads_s"] >= BURN_S * 0.8
        assert cols["cpu_workload_s"] < 0.1  # the main thread slept
        [sample] = after.procs["workload"].values()
        assert len(sample.cuda) == 1
    finally:
        stop(proc)


# Starts BUSY_CHILD as its own child, says "ready" once that one is, and passes a line on as "go".
PARENT = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {BUSY_CHILD!r}, "main"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
sys.stdin.readline()
child.stdin.write("go\\n")
child.stdin.flush()
print(child.stdout.readline().strip(), flush=True)
child.wait()
"""


def test_descendants_of_the_workload_count_as_the_workload():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        sampler = StageSampler(lambda: {"workload": [proc.pid]})
        before = sampler.sample()
        assert len(before.procs["workload"]) == 2  # the root and the child it started
        go(proc)
        cols = sampler.columns(before, sampler.sample())
        assert cols["cpu_workload_s"] >= BURN_S * 0.8
    finally:
        for pid in ProcessReader.children(proc.pid):
            os.kill(pid, signal.SIGKILL)
        stop(proc)


def test_a_tight_sample_reads_cpu_times_only_of_the_processes_the_last_full_one_found():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        sampler = StageSampler(lambda: {"workload": [proc.pid], "receiver": [proc.pid]})
        full = sampler.sample()
        before = sampler.sample(tight=True)
        assert before.procs["workload"].keys() == full.procs["workload"].keys()  # the child, without its children file
        go(proc)
        after = sampler.sample(tight=True)
        cols = sampler.columns(before, after)
        assert cols["cpu_workload_s"] >= BURN_S * 0.8
        assert cols["cpu_receiver_s"] == 0 and cols["write_bytes"] == 0  # left for the next full sample
        assert sampler.columns(after, sampler.sample())["cpu_receiver_s"] >= 0
    finally:
        for pid in ProcessReader.children(proc.pid):
            os.kill(pid, signal.SIGKILL)
        stop(proc)


def test_stages_that_must_follow_closely_take_tight_samples():
    asked = []

    class Spy(StageSampler):
        def sample(self, extra_pids=(), *, tight=False):
            asked.append(tight)
            return super().sample(extra_pids, tight=tight)

    timeline = Timeline("t", cpu=Spy(dict))
    with timeline.stage("cuda_lock", marks=False):
        pass
    with timeline.stage("criu_dump"):
        pass
    assert asked == [True, True, False, False]
    assert all(timeline.rows()[0][c] is not None for c in CPU_COLUMNS)


BURN = f"import time\nt = time.process_time()\nwhile time.process_time() - t < {BURN_S}: pass\nprint('out')"


def test_a_measured_child_is_credited_to_the_stage_that_ran_it():
    timeline = Timeline("t", cpu=StageSampler(dict))
    with timeline.stage("criu_dump"):
        proc = run_measured([sys.executable, "-c", BURN + "\nimport sys; sys.exit(3)"], role="criu", timeout=30)
    with timeline.stage("other"):
        pass
    assert (proc.returncode, proc.stdout) == (3, "out\n")
    dump, other = timeline.rows()
    assert BURN_S * 0.8 <= dump["cpu_criu_s"] <= BURN_S * 3 and dump["cpu_harness_s"] < 0.1
    assert dump["minflt"] > 0 and dump["cpu_s"] >= dump["cpu_criu_s"]
    assert other["cpu_criu_s"] == 0
    with pytest.raises(subprocess.TimeoutExpired) as hung:
        run_measured([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], role="tool",
                     timeout=1.0)
    assert hung.value.output == "up\n"
    assert cpu_account.credited()["tool"].cpu_s > 0  # killed, reaped and still counted


def test_a_helper_thread_works_for_the_thread_that_started_it():
    owner = threading.get_ident()
    before = cpu_account.credited().get("harness", cpu_account.Usage()).cpu_s

    def work() -> None:
        with helper_thread(owner):
            t = time.thread_time()
            while time.thread_time() - t < 0.1:
                pass
            run_measured([sys.executable, "-c", "pass"], role="tool", timeout=30)

    tools = cpu_account.credited().get("tool", cpu_account.Usage()).cpu_s
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert cpu_account.credited()["harness"].cpu_s - before >= 0.08
    assert cpu_account.credited()["tool"].cpu_s > tools  # the child it ran, too


def test_a_process_a_stage_brings_into_being_counts_in_that_stage():
    timeline = Timeline("t", cpu=StageSampler(dict))
    with timeline.stage("criu_restore") as extra:
        proc = busy_child("main")
        go(proc)
        extra["pid"] = proc.pid
    stop(proc)
    assert timeline.rows()[0]["cpu_workload_s"] >= BURN_S * 0.8


class Broken:
    def sample(self, extra_pids=(), *, tight=False):
        raise RuntimeError("no /proc here")

    def columns(self, before, after):
        raise AssertionError("never reached")


def test_every_row_has_the_columns_and_accounting_never_breaks_a_stage():
    for cpu in (None, Broken()):
        timeline = Timeline("t", cpu=cpu)
        with timeline.stage("spawn"):
            pass
        timeline.event("note")
        for row in timeline.rows():
            assert all(row[c] is None for c in CPU_COLUMNS)
    sampled = Timeline("t", cpu=StageSampler(dict))
    with pytest.raises(ValueError):
        with sampled.stage("fails"):
            raise ValueError("the stage's own error")
    sampled.event("note")
    failed, event = sampled.rows()
    assert failed["result"] == "failed" and failed["cpu_harness_s"] is not None
    assert event["cpu_s"] is None


def test_an_old_run_reads_with_the_cpu_columns_as_nan(tmp_path: Path):
    run = RunDir.create(tmp_path, "old")
    run.write_meta({"run_id": run.run_id, "n_trials": 1})
    run.write_table("timeline", [{"trial_id": "t0001", "cut_index": 0, "stage": "criu_dump", "t_start": 0.0,
                                  "t_end": 1.0, "duration_s": 1.0, "result": "ok"}])
    table = RunDir.open(run.path).table("timeline")
    assert set(CPU_COLUMNS) <= set(table.columns) and table[list(CPU_COLUMNS)].isna().all().all()
    assert table.loc[0, "duration_s"] == 1.0


def test_the_sampler_is_cheap_enough_to_read_at_every_stage(monkeypatch):
    """A stage takes two samples; each is a few /proc reads of the trial's own processes, never a scan of /proc:
    counted file by file, so that the cost is a fact of the code, not a duration a loaded host stretches."""
    proc = busy_child("main")
    opened: list[str] = []
    listed: list[str] = []
    real_open, real_listdir = open, os.listdir

    def spy_open(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    def spy_listdir(path="."):
        listed.append(str(path))
        return real_listdir(path)

    real_stat_fields = cpu_account.stat_fields

    def spy_stat_fields(path):  # the stat files are read through cutbench.procs
        opened.append(str(path))
        return real_stat_fields(path)

    try:
        sampler = StageSampler(lambda: {"workload": [proc.pid], "receiver": [proc.pid]})
        sampler.sample()
        monkeypatch.setattr(cpu_account, "open", spy_open, raising=False)  # the module's open, not the builtin
        monkeypatch.setattr(cpu_account.os, "listdir", spy_listdir)
        monkeypatch.setattr(cpu_account, "stat_fields", spy_stat_fields)
        for _ in range(50):
            sampler.sample()
    finally:
        monkeypatch.undo()
        stop(proc)
    # The workload's stat, io and children files and the receiver's stat and io: five a sample, every one of them.
    assert len(opened) == 50 * 5, opened[:10]
    assert {p.split("/")[2] for p in opened} == {str(proc.pid)}  # /proc/<pid>/...: the given process only
    assert listed == []  # neither /proc nor a task list (a single-threaded process has no driver thread to find)

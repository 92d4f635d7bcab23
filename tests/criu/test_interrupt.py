"""Ctrl-C mid-run: no process left, a partial run directory that reads back (``criu``: must run in CI).

``cutbench run`` is started in its own process group and that whole group
gets SIGINT, as a terminal's Ctrl-C does (CRIU runs in a group of its own:
the harness lets it end its step, so that it leaves no network lock). Each case waits for a different moment of a trial: the workload
running toward its cut, CRIU dumping it, and CRIU restoring it after the
restored process already exists — the moment a restore handle does not yet
know the restored pid. With ``--jobs 2`` two trials are in flight at each of
those moments, each workload the init of a PID namespace of its own, and
every worker must clean up as a serial run does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutbench.harness.reports.summary import run_verdict
from cutbench.harness.store.analysis import reanalyze
from cutbench.harness.store.rundir import RunDir
from tests.conftest import REPO

pytestmark = pytest.mark.criu


def _descendants(root: int) -> list[int]:
    """``root``'s descendants now, through each task's ``children`` list (a walk of a dozen files, not of /proc)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                kids = [int(k) for k in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def _processes(root: int | None = None) -> list[tuple[int, str, str]]:
    """(pid, cmdline, cwd) of every live, non-zombie process we can read: ``root``'s descendants, or all of them.

    The moments below are watched every 2 ms through ``root``'s tree only: a walk of all /proc that often took a
    core from the tests beside it."""
    pids = _descendants(root) if root is not None else [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    out = []
    for pid in pids:
        proc = Path(f"/proc/{pid}")
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if state != "Z":
            out.append((pid, cmd, cwd))
    return out


def _criu(word: str, run_id: str, root: int) -> bool:
    """True while a CRIU ``word`` (dump|restore) of this run's trials is running (its image directory names the run)."""
    return any("criu" in cmd and f" {word} " in f" {cmd} " and f"cutbench-{run_id}-" in cmd for _, cmd, _ in _processes(root))


def _whence(pid: int) -> str:
    """Where a left process came from, for the failure's message: its parent, PID namespace and state."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        same = os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
        status = Path(f"/proc/{pid}/status").read_text()
        nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
    except OSError as exc:
        return f"gone ({exc})"
    return f"state {fields[0]}, parent {fields[1]}, {'this' if same else 'another'} PID namespace, NSpid {nspid}"


def _workload(tmp: Path, root: int) -> bool:
    return any("cutbench.workloads.launch" in cmd and str(tmp) in cmd for _, cmd, _ in _processes(root))


# Each is seen from the `cutbench run` process's tree (``root``): CRIU and the workload it restores are in it.
MOMENTS = {
    "workload_running": lambda tmp, rid, root: (_workload(tmp, root) and not _criu("dump", rid, root)
                                                and not _criu("restore", rid, root)),
    "criu_dump": lambda tmp, rid, root: _criu("dump", rid, root),
    "criu_restore_after_the_restored_task_exists": lambda tmp, rid, root: (_criu("restore", rid, root)
                                                                           and _workload(tmp, root)),
}


def _interrupt_at(argv: list[str], tmp: Path, out: Path, moment: str, signals: list[int]) -> tuple[subprocess.Popen, str, str, str]:
    """Start ``argv`` (a run into ``out``, its work directory under ``tmp``) in a process group of its own, let one
    trial finish, wait for ``moment`` and send ``signals`` to the whole group, 30 ms apart, as a terminal's
    Ctrl-C does; returns the finished process, the run id, its stdout and stderr."""
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        # Let one trial finish first, so the partial run has something in it.
        while time.monotonic() < deadline and not list(out.glob("*/trials/*.json")):
            time.sleep(0.01)
        run_id = next(p.name for p in out.iterdir() if p.name != "latest")
        while time.monotonic() < deadline and not MOMENTS[moment](tmp, run_id, proc.pid):
            time.sleep(0.002)
        assert time.monotonic() < deadline, f"never saw the moment {moment!r}"
        for k, sig in enumerate(signals):
            if k:
                time.sleep(0.03)
            os.killpg(proc.pid, sig)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc, run_id, stdout, stderr


def _assert_nothing_left(run_id: str, tmp: Path) -> None:
    """No process, work directory or image directory of run ``run_id`` (work directory under ``tmp``) is left."""
    time.sleep(0.2)  # let the kernel finish tearing down what was killed
    left = [(pid, cmd, _whence(pid)) for pid, cmd, cwd in _processes() if run_id in cmd or str(tmp) in cmd or cwd.startswith(str(tmp))]
    for pid, _, _ in left:  # do not leak them into the next test, but fail this one
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"
    assert not list(tmp.iterdir()), "the work directory was left behind"
    assert not list(Path("/dev/shm").glob(f"cutbench-{run_id}-*")), "an image directory was left behind"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("moment, presses, sig, jobs",
                         [(m, 1, signal.SIGINT, 1) for m in MOMENTS] + [("criu_dump", 3, signal.SIGINT, 1)]
                         + [("criu_dump", 1, signal.SIGTERM, 1), ("criu_restore_after_the_restored_task_exists", 1, signal.SIGHUP, 1)]
                         + [(m, 1, signal.SIGINT, 2) for m in MOMENTS] + [("criu_dump", 3, signal.SIGINT, 2)])
def test_sigint_leaves_no_process_and_a_partial_readable_run(criu, tmp_path: Path, moment: str, presses: int, sig: int,
                                                             jobs: int):
    """``presses`` > 1: an impatient user presses Ctrl-C again while the harness cleans up. SIGTERM and
    SIGHUP (a CI runner's cancel, ``timeout``) get the same cleanup and exit 128 + the signal. ``jobs`` 2:
    two workers, each with a trial in flight."""
    tmp = tmp_path / "tmp"  # the run's work directory lands here (TMPDIR), so its processes are recognisable
    tmp.mkdir()
    out = tmp_path / "results"
    proc, run_id, stdout, stderr = _interrupt_at(
        [sys.executable, "-m", "cutbench", "run", str(REPO / "scenarios" / "quick.toml"), "--out", str(out), "--json",
         "--jobs", str(jobs)], tmp, out, moment, [sig] + [signal.SIGINT] * (presses - 1))
    assert proc.returncode == 128 + sig, stderr[-3000:]
    _assert_nothing_left(run_id, tmp)
    run_dir = out / run_id

    # The partial run reads back: marked partial, tables, trial files and summary agree.
    result = json.loads(stdout)
    assert result["complete"] is False and result["exit_code"] == 128 + sig
    run = RunDir.open(run_dir)
    meta = run.meta()
    trials = run.table("trials")
    assert meta["status"] == "partial" and meta["jobs"] == jobs
    assert list(trials["trial_id"]) == sorted(trials["trial_id"])  # plan order, whichever worker finished first
    assert 1 <= meta["n_trials"] == len(trials) == len(run.trial_records()) < meta["n_trials_planned"]
    assert set(trials["outcome"]) <= {"valid", "invalid", "refused", "unknown"}
    assert "interrupted" in (run_dir / "summary.md").read_text()
    assert "partial run: interrupted" in (run_dir / "report.html").read_text()
    # Never shown green: without an invalid trial the verdict is "partial", naming the arms that never ran.
    verdict = run_verdict(trials, meta)
    assert verdict.label in ("partial", "invalid") and "all recoveries valid" not in (run_dir / "summary.md").read_text()
    if verdict.label == "partial":
        assert verdict.not_run and 'data-verdict="partial"' in (run_dir / "report.html").read_text()
    assert not reanalyze(run).differences
    assert (out / "latest").resolve() == run_dir


@pytest.mark.timeout(180)
def test_a_run_started_from_code_takes_ctrl_c_as_the_command_does(criu, tmp_path: Path):
    """``cutbench.run`` from a Python program with Python's own SIGINT handler: Ctrl-C while CRIU dumps, and
    again during the cleanup; the program sees ``KeyboardInterrupt`` naming the stored partial run (its message and
    its ``run_dir``), and nothing of the run is left (``cutbench.interrupts.from_code``)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "results"
    # Python's own SIGINT handler, whatever this test inherited: a shell starts a background job (`make test &`) with
    # SIGINT ignored, and a program started so keeps it ignored, as cutbench.run then does too.
    program = ("import cutbench, signal, sys\n"
               "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
               "try:\n"
               f"    cutbench.run({str(REPO / 'scenarios' / 'quick.toml')!r}, out={str(out)!r})\n"
               "except KeyboardInterrupt as exc:\n"
               "    print('interrupted:', exc, '| run_dir:', exc.run_dir)\n"
               "    sys.exit(42)\n")
    proc, run_id, stdout, stderr = _interrupt_at([sys.executable, "-c", program], tmp, out, "criu_dump",
                                                 [signal.SIGINT, signal.SIGINT])
    assert proc.returncode == 42, stderr[-3000:]
    run_dir = out / run_id
    assert f"the partial run is stored in {run_dir} | run_dir: {run_dir}" in stdout
    _assert_nothing_left(run_id, tmp)
    assert RunDir.open(run_dir).meta()["status"] == "partial"

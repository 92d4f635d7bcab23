"""SIGKILL the harness at N random moments of a CPU run, resume each, and compare verdicts plan by plan.

Two uninterrupted runs of the scenario are the reference; a plan whose verdict class (outcome and
finding kinds) differs between them depends on timing on this machine (a ``leave_running`` original
that got through more or fewer ops before its crash) and is listed, not compared. Then, N times: the
run is started and killed with SIGKILL after a random number of finished trials (0 to all but one)
and a random fraction of the next trial's time (the sweep, a trial mid-cut, the tables), resumed with
``cutbench run --resume``, and checked: the trials kept are stored as their files say, every other
plan's verdict class equals the references', the trial ids are the same, ``cutbench analyze``
re-judges the stored data as stored, and nothing of the killed harness (image directories, workloads
in its work directory) is left once the resume has started. Prints one line per kill and a summary;
exits 1 when any kill's resumed run differs.

    python benchmarks/resume_after_sigkill.py [--kills 20] [--seed 0] [--scenario scenarios/quick.toml]
        [--set pipeline.backends='["criu"]' ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from cutbench.api import open_run  # noqa: E402
from cutbench.procs import processes_in  # noqa: E402


def cutbench(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cutbench", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenario", default=str(REPO / "scenarios" / "quick.toml"))
    ap.add_argument("--set", dest="overrides", action="append", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    overrides = a.overrides if a.overrides is not None else ['pipeline.backends=["criu"]']
    sets = [x for o in overrides for x in ("--set", o)]
    out = Path(a.out or tempfile.mkdtemp(prefix="cutbench-resume-bench-"))
    rng = random.Random(a.seed)

    refs = []
    for n in (1, 2):
        t0 = time.monotonic()
        ref = cutbench("run", a.scenario, *sets, "--out", str(out / f"reference-{n}"))
        ref_s = time.monotonic() - t0
        if ref.returncode not in (0, 1):
            print(ref.stderr[-3000:])
            return 2
        refs.append(open_run((out / f"reference-{n}" / "latest").resolve()))
        print(f"reference {n}: {len(refs[-1])} trials in {ref_s:.1f} s")
    ref_trials = refs[0].trials
    first, second = refs[0].verdicts(), refs[1].verdicts()
    unstable = sorted(p for p in first if first[p] != second.get(p))
    want = {p: v for p, v in first.items() if p not in unstable}
    print(f"{len(unstable)} plans differ between the two references (timing decides them here): {unstable}")
    per_trial = ref_s / max(1, len(ref_trials))

    failures = 0
    rows = []
    for k in range(a.kills):
        after, delay = rng.randrange(0, len(ref_trials)), rng.uniform(0.0, per_trial)
        root = out / f"kill-{k:02d}"
        proc = subprocess.Popen([sys.executable, "-m", "cutbench", "run", a.scenario, *sets, "--out", str(root)], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None:
            runs = [p for p in root.glob("2*") if p.is_dir()]
            if runs and len(list((runs[0] / "trials").glob("*.json"))) >= after:
                break
            time.sleep(0.02)
        time.sleep(delay)
        ended_first = proc.poll() is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        runs = [p for p in root.glob("2*") if p.is_dir()]
        if not runs:  # killed before its run directory existed: nothing to resume, the next run starts anew
            rows.append((k, after, delay, 0, 0, "no run directory yet (killed during start-up)", True))
            continue
        run = runs[0]
        kept_files = {p.stem: json.loads(p.read_text())["verdict"]["outcome"] for p in (run / "trials").glob("*.json")}
        t1 = time.monotonic()
        res = cutbench("run", "--resume", str(run), "--json")
        resume_s = time.monotonic() - t1
        problems = []
        if ended_first:
            problems.append("(the run had ended before the kill)")
        got_run = None
        if res.returncode not in (0, 1) and not (res.returncode == 254 and "the run is complete" in res.stderr):
            problems.append(f"resume exit {res.returncode}: {res.stderr[-500:]}")
        else:
            got_run = open_run(run)
        if got_run is not None:
            got_trials = got_run.trials
            if list(got_trials["trial_id"]) != list(ref_trials["trial_id"]):
                problems.append("trial ids differ")
            stored = dict(zip(got_trials["trial_id"], got_trials["outcome"]))
            changed = [t for t, o in kept_files.items() if stored.get(t) != o]
            if changed:
                problems.append(f"kept trials changed: {changed[:3]}")
            got = got_run.verdicts()
            differ = [p for p in want if got.get(p) != want[p]]
            if differ:
                problems.append(f"{len(differ)} plans differ, first {differ[0]}: {got.get(differ[0])} vs {want[differ[0]]}")
            if cutbench("analyze", str(run)).returncode != 0:
                problems.append("analyze: stored verdicts differ")
        left = list(Path("/dev/shm").glob(f"cutbench-{run.name}-*")) + [
            p for p in Path("/tmp").glob(f"cutbench-{run.name}-*") if processes_in(p)]
        if left:
            problems.append(f"left behind: {left}")
        real = [p for p in problems if not p.startswith("(")]
        failures += bool(real)
        rows.append((k, after, delay, len(kept_files), resume_s, "; ".join(problems) or "same verdicts", not real))

    print(f"{'kill':>4} {'after':>5} {'+s':>5} {'kept':>5} {'resume_s':>8}  result")
    for k, after, delay, kept, resume_s, what, ok in rows:
        print(f"{k:>4} {after:>5} {delay:5.2f} {kept:>5} {resume_s:8.1f}  {'ok  ' if ok else 'FAIL'} {what}")
    print(json.dumps({"kills": a.kills, "reference_trials": len(ref_trials), "unstable_plans": len(unstable),
                      "failed": failures, "out": str(out)}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""What tracing a program's system calls costs it: the same program run uninterrupted, untraced and traced
(recording its counted calls, as a scenario with ``plan.phases = ["syscall"]`` records its ground truth),
alternated in one run; the ratio of the medians is the figure (goal <= 1.05). Traced twice: as a run traces
(the kernel's counters, a stop only after a call whose name counts) and with a stop at every call
(``--stops``, what a machine without the counters gets), each with the stops its threads made.

    python benchmarks/syscall_overhead.py examples/programs/ticker/ticker.toml [--repeat 5] [--json OUT]

The program is the scenario's (``[workload.params]``: command, files, env), started in a fresh directory each
time. Traced, it starts waiting on a fifo and the tracer (``python -m cutbench.harness.observer.tracer``, its
command-line interface) seizes it before it becomes the program, as a run does; the clock starts when the
program is let go, untraced or traced alike, and stops at its exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

WRAPPER = ("sh", "-c", 'read _ < "$0"; exec "$@"')


def program(scenario: Path) -> tuple[list[str], list[Path], dict[str, str]]:
    """The scenario's command, files (absolute) and environment."""
    params = tomllib.loads(scenario.read_text())["workload"]["params"]
    files = [(scenario.parent / f).resolve() for f in params.get("files", [])]
    return list(params["command"]), files, {**os.environ, **params.get("env", {})}


def once(command: list[str], files: list[Path], env: dict[str, str], *, traced: bool,
         stops: bool = False) -> tuple[float, int, dict]:
    """One uninterrupted run in a fresh directory: its wall time (from its release to its exit), the calls the
    tracer counted (0 untraced) and its last word (``ended``: the stops; ``{}`` untraced)."""
    work = Path(tempfile.mkdtemp(prefix="cutbench-overhead-"))
    try:
        for f in files:
            (shutil.copytree if f.is_dir() else shutil.copy2)(f, work / f.name)
        fifo = work / ".cutbench-start"
        os.mkfifo(fifo)
        child = subprocess.Popen([*WRAPPER, str(fifo), *command], cwd=work, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        tracer = None
        if traced:
            tracer = subprocess.Popen([sys.executable, "-m", "cutbench.harness.observer.tracer", "--pid", str(child.pid),
                                       "--dir", str(work), *(["--stops"] if stops else [])],  # every call by default
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert tracer.stdout is not None
            said = json.loads(tracer.stdout.readline())
            mode = said
            while "mode" in said:
                mode, said = said, json.loads(tracer.stdout.readline())
            if "seized" not in said:
                raise SystemExit(f"the tracer could not seize the program: {said}")
            # Its lines read as they come, as a run reads them: a full pipe would stop the tracer and the program.
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(tracer.stdout), daemon=True)
            reader.start()
        start = time.perf_counter()
        with open(fifo, "w") as go:  # the wrapper has it open to read: it becomes the program now
            go.write("\n")
        rc = child.wait()
        elapsed = time.perf_counter() - start
        counted, last = 0, {}
        if tracer is not None:
            tracer.wait()
            reader.join()
            counted = sum(1 for line in lines if '"n"' in line)
            last = {**(json.loads(lines[-1]) if lines else {}), "mode": mode.get("mode", ""), "why": mode.get("why", "")}
        if rc != 0:
            raise SystemExit(f"{' '.join(command)} exited {rc} in {work}")
        return elapsed, counted, last
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path, help="a program's scenario (its [workload.params] are run)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each, alternated")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    command, files, env = program(args.scenario)
    times: dict[str, list[float]] = {"untraced": [], "counters": [], "stops": []}
    stops: dict[str, list[int]] = {"counters": [], "stops": []}
    counted, modes = 0, set()
    for _ in range(args.repeat):
        times["untraced"].append(once(command, files, env, traced=False)[0])
        for arm in ("counters", "stops"):
            t, counted, last = once(command, files, env, traced=True, stops=arm == "stops")
            times[arm].append(t)
            stops[arm].append(int(last.get("stops", 0)))
            if arm == "counters":
                modes.add(f"{last['mode']}{': ' + last['why'] if last['why'] else ''}")
    median = {arm: statistics.median(ts) for arm, ts in times.items()}
    ratio = {arm: median[arm] / median["untraced"] for arm in ("counters", "stops")}
    figures = {"scenario": str(args.scenario), "repeat": args.repeat, "counted_calls": counted,
               **{f"{arm}_s": ts for arm, ts in times.items()}, **{f"median_{arm}_s": m for arm, m in median.items()},
               **{f"{arm}_stops": n for arm, n in stops.items()},
               "ratio": ratio["counters"], "ratio_stops": ratio["stops"], "counters_mode": sorted(modes)}
    print(f"{args.scenario}: {counted} counted calls; untraced median {median['untraced']:.3f} s; "
          f"traced with counters {median['counters']:.3f} s, ratio {ratio['counters']:.3f} "
          f"({statistics.median(stops['counters']):.0f} stops); with a stop at every call {median['stops']:.3f} s, "
          f"ratio {ratio['stops']:.3f} ({statistics.median(stops['stops']):.0f} stops); "
          f"{args.repeat} runs each, alternated; the counters' arm counted with {', '.join(sorted(modes))}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

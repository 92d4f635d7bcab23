"""What observing a program costs it: its throughput under cutbench's observer against the same program run natively.

An observer that slows the program changes what the cuts hit, so the goal is
at most 5 % slower. Each program runs ``--repeat`` times natively and
``--repeat`` times observed, alternating, in one run; the figure is the ratio
of the medians (observed / native wall time: 1.00 is free).

* ``ticker``: ``examples/programs/ticker/ticker.py`` printing ``--lines``
  lines as fast as it can (no sleep): natively into ``/dev/null``, observed
  through the pipe and the regular expression of its scenario.
* ``gromacs`` (when ``gmx`` is installed): ``examples/programs/gromacs``'s
  ``mdrun``: natively, and observed through its ``md.log`` tailed every 5 ms
  and parsed by ``gmx_log.py``. The system is built once, outside the timing.
* ``training`` (when PyTorch is installed; on the GPU machine): the
  training script of ``examples/programs/training`` for ``--steps`` steps
  with no pause between them and no loader workers: natively, and observed
  through its stdout (one metrics line per step).

    python benchmarks/program_observer.py [--repeat 5] [--lines 200000] [--steps 3000] [--only NAME,...] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cutbench.api import Observer  # noqa: E402
from cutbench.workloads import api  # noqa: E402
from cutbench.workloads.program import Program  # noqa: E402

PROGRAMS = REPO / "examples" / "programs"


def params_of(scenario: Path, **over: Any) -> dict[str, Any]:
    """The program parameters of ``scenario``, anchored at its folder, with ``over`` applied."""
    raw = tomllib.loads(scenario.read_text())["workload"]["params"]
    return Program.anchor(api.resolve_params(Program, {**raw, **over}), scenario.parent)


def native(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.monotonic()
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.monotonic() - start


def observed(params: dict[str, Any], cwd: Path) -> tuple[float, int]:
    obs = Observer(params, cwd)
    start = time.monotonic()
    child = obs.start(list(params["command"]))
    child.wait(3600)
    took = time.monotonic() - start
    obs.close()
    return took, len(obs.seen)


def clean(work: Path) -> None:
    """Remove what a run left (GROMACS's outputs: a log another run would append to), keeping its input."""
    for leftover in [*work.glob("md.*"), *work.glob("*.pt")]:
        if leftover.name != "md.tpr":
            leftover.unlink()


def measure(name: str, params: dict[str, Any], repeat: int, prepare: Any = None) -> dict[str, Any]:
    import os

    env = {**os.environ, **params["env"]}
    work = Path(tempfile.mkdtemp(prefix=f"observer-{name}-"))
    try:
        for f in params["files"]:
            shutil.copy2(f, work)
        if prepare:
            prepare(work, env)
        native_s, observed_s, effects = [], [], 0
        for _ in range(repeat):
            clean(work)
            native_s.append(native(list(params["command"]), work, env))
            clean(work)
            took, effects = observed(params, work)
            observed_s.append(took)
        ratio = statistics.median(observed_s) / statistics.median(native_s)
        return {"program": name, "native_s": native_s, "observed_s": observed_s, "effects": effects,
                "ratio": ratio, "slower_pct": (ratio - 1) * 100}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=3000, help="the training script's steps")
    parser.add_argument("--only", default="ticker,gromacs,training", help="the programs to measure (where present)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    rows = []
    if "ticker" in only:
        ticker = params_of(PROGRAMS / "ticker" / "ticker.toml",
                           command=["python3", "ticker.py", "--steps", str(args.lines), "--interval-ms", "0",
                                    "--save-every", str(args.lines)])
        rows.append(measure("ticker", ticker, args.repeat))
    if "training" in only and importlib.util.find_spec("torch") is not None:
        training = params_of(PROGRAMS / "training" / "training.toml",
                             command=["python3", "train.py", "--steps", str(args.steps), "--save-every",
                                      str(args.steps), "--workers", "0", "--step-ms", "0"])
        rows.append(measure("training", training, args.repeat))
    if "gromacs" in only and shutil.which("gmx"):
        gromacs = params_of(PROGRAMS / "gromacs" / "gromacs.toml")

        def build(work: Path, env: dict[str, str]) -> None:
            # run.sh builds md.tpr on its first start; a run with nsteps 0 builds it outside the timing.
            subprocess.run(["sh", "run.sh", "-nsteps", "0"], cwd=work, env=env, check=True, capture_output=True)
        rows.append(measure("gromacs", {**gromacs, "env": {**gromacs["env"], "GMX_MAXBACKUP": "-1"}}, args.repeat, build))
    for r in rows:
        print(f"{r['program']:8s} native {statistics.median(r['native_s']):.3f}s  observed "
              f"{statistics.median(r['observed_s']):.3f}s  ({r['effects']} effects)  ratio {r['ratio']:.3f} "
              f"({r['slower_pct']:+.1f}%)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

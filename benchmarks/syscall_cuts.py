"""Cuts at a program's system calls against cuts after its effects, on the SQLite job worker in both orders.

    python benchmarks/syscall_cuts.py [--out DIR] [--jobs-window 1 4] [--repeat 3] [--seeds 3] [--budget 12]

1. Every boundary of jobs 1..4 (``exhaustive``, phase ``syscall``), both orders, under its own ``--resume``
   (``app``) with an ``at_least_once`` and an ``idempotent`` consumer, and under ``criu``: which boundaries break
   each, by name.
2. The plans aimed at a breaking boundary, run ``--repeat`` times more: the fraction that catch it.
3. Cuts after the k-th effect of the same jobs with offsets of 0, 1, 2 and 5 ms (what a program's cut was
   before): the fraction of them that catch the defect, ``--repeat`` times.
4. The ``hypothesis`` source, phase ``syscall`` against phase ``effect``, ``--seeds`` seeds with a budget of
   ``--budget`` trials: the trials each needs to find the defect (``>budget`` when it did not).

Everything goes through ``cutbench.run`` (the public door); the figures are printed and written to
``syscall-cuts.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

import cutbench

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "programs" / "jobs" / "syscalls.toml"
ORDERS = ("announce-commit", "commit-announce")
SETUP_CALLS, CALLS_PER_JOB = 22, 5  # the worker's counted calls: opening its database, then each job's


def run(out: Path, *overrides: str, variant: str) -> Any:
    """One run of the worker's scenario, its ``variant`` only; the :class:`cutbench.api.Run`."""
    return cutbench.run(SCENARIO, out=out, overrides=list(overrides), variants=[variant])


def breaking(out: Path, first: int, last: int) -> dict[str, Any]:
    """Part 1: every boundary of the window, both orders, app and criu, both consumers."""
    found: dict[str, Any] = {}
    for order in ORDERS:
        t = run(out, f"plan.ops=[{first}, {last}]", variant=order).trials
        for (backend, mode), group in t.groupby(["backend", "receiver_mode"]):
            bad = group[group["outcome"] == "invalid"]
            found[f"{order} {backend} {mode}"] = {
                "boundaries": int(len(group)), "unknown": int((group["outcome"] == "unknown").sum()),
                "breaking": [{"op": int(r["cut_op"]), "boundary": r["boundary"],
                              "findings": sorted({f["kind"] for f in r["findings"]})} for r in bad.to_dict("records")]}
    return found


def caught(out: Path, ops: list[int], order: str, repeat: int) -> dict[str, Any]:
    """Part 2: the breaking boundaries of ``order`` under app/at_least_once, each run ``repeat`` times more."""
    hits = total = 0
    for _ in range(repeat):
        for op in ops:
            t = run(out, f"plan.ops=[{op}, {op}]", 'pipeline.backends=["app"]', 'receiver.modes=["at_least_once"]',
                    variant=order).trials
            total += len(t)
            hits += int((t["outcome"] == "invalid").sum())
    return {"plans": total, "caught": hits, "fraction": hits / total if total else float("nan")}


def effect_cuts(out: Path, jobs: tuple[int, int], order: str, repeat: int) -> dict[str, Any]:
    """Part 3: cuts after the k-th effect, k over the window's jobs, offsets 0, 1, 2, 5 ms, app/at_least_once."""
    hits = total = 0
    for _ in range(repeat):
        t = run(out, f"plan.ops=[{jobs[0]}, {jobs[1]}]", 'plan.phases=["effect"]', "plan.async_offset_ms=[0, 1, 2, 5]",
                'pipeline.backends=["app"]', 'receiver.modes=["at_least_once"]', variant=order).trials
        total += len(t)
        hits += int((t["outcome"] == "invalid").sum())
    return {"plans": total, "caught": hits, "fraction": hits / total if total else float("nan")}


def one_order(out: Path, order: str) -> Path:
    """The worker's scenario for ``order`` alone, without ``[[variants]]`` (the adaptive source runs no variants)."""
    data = tomllib.loads(SCENARIO.read_text())
    variant = next(v for v in data.pop("variants") if v["name"] == order)
    data["workload"]["params"].update(variant.get("workload", {}).get("params", {}))
    data["workload"]["params"]["files"] = [str(SCENARIO.parent / f) for f in data["workload"]["params"]["files"]]
    path = out / f"jobs-{order}.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def search(out: Path, phase: str, ops: tuple[int, int], order: str, seeds: int, budget: int) -> list[int | str]:
    """Part 4: trials the hypothesis source needs to find the defect, one figure per seed."""
    needed: list[int | str] = []
    for seed in range(1, seeds + 1):
        r = cutbench.run(one_order(out, order), out=out, overrides=[
            "plan.source=hypothesis", f"plan.trials={budget}", f"plan.seed={seed}",
            f"plan.ops=[{ops[0]}, {ops[1]}]", f'plan.phases=["{phase}"]', 'pipeline.backends=["app"]',
            'receiver.modes=["at_least_once"]', "plan.async_offset_ms=[0, 1, 2, 5]"])
        arms = (r.meta.get("search") or {}).get("arms") or [{}]
        first = arms[0].get("first_failure")
        needed.append(int(first) if first else f">{budget}")
    return needed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="cutbench-syscall-cuts-")))
    parser.add_argument("--jobs-window", type=int, nargs=2, default=(1, 4), metavar=("FIRST", "LAST"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=12)
    args = parser.parse_args()
    first_job, last_job = args.jobs_window
    first = SETUP_CALLS + CALLS_PER_JOB * (first_job - 1) + 1
    last = SETUP_CALLS + CALLS_PER_JOB * last_job
    figures: dict[str, Any] = {"window": {"jobs": [first_job, last_job], "boundaries": [first, last]}}
    figures["breaking"] = found = breaking(args.out, first, last)
    for key, value in found.items():
        print(f"{key}: {len(value['breaking'])} of {value['boundaries']} boundaries break it, {value['unknown']} unknown")
        for b in value["breaking"]:
            print(f"    {b['op']}: {', '.join(b['findings'])} — {b['boundary']}")
    figures["syscall_caught"] = {}
    figures["effect_caught"] = {}
    figures["hypothesis"] = {}
    for order in ORDERS:
        ops = [b["op"] for b in found[f"{order} app at_least_once"]["breaking"]]
        figures["syscall_caught"][order] = c = caught(args.out, ops, order, args.repeat)
        figures["effect_caught"][order] = e = effect_cuts(args.out, (first_job, last_job), order, args.repeat)
        print(f"{order}, app, at_least_once: syscall cuts aimed at a breaking boundary catch it {c['caught']}/{c['plans']}"
              f" ({100 * c['fraction']:.0f}%); effect cuts {e['caught']}/{e['plans']} ({100 * e['fraction']:.0f}%)")
        figures["hypothesis"][order] = h = {
            "syscall": search(args.out, "syscall", (first, last), order, args.seeds, args.budget),
            "effect": search(args.out, "effect", (first_job, last_job), order, args.seeds, args.budget)}
        print(f"{order}: hypothesis trials to find it, per seed: syscall {h['syscall']}, effect {h['effect']}")
    (args.out / "syscall-cuts.json").write_text(json.dumps(figures, indent=1, default=str))
    print(f"figures: {args.out / 'syscall-cuts.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

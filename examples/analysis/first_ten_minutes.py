"""A researcher's first ten minutes with a finished run, through ``cutbench.open_run``.

    python examples/analysis/first_ten_minutes.py results/latest

Prints what the run was, its headline, the invalid rate per arm with its
Wilson 95% interval, the first invalid trial's findings and what the
receiver recorded for it, and where the harness spent the time. Any run
directory works; ``results/reference/containers/quick`` is one in the checkout.
"""

from __future__ import annotations

import sys

import pandas as pd

import cutbench


def main(path: str) -> int:
    run = cutbench.open_run(path)  # checked as `cutbench analyze` checks it: a damaged file is named
    scenario = run.scenario
    print(f"run {run.run_id}: scenario {scenario.get('name')!r}, workload {scenario.get('workload')!r}, "
          f"{len(run.trials)} trials, {'complete' if run.complete else 'interrupted'}")
    print(f"headline: {run.verdict.text}; outcomes {run.counts}")

    # 1. Where recoveries went wrong: the invalid rate per arm, with its interval (a wide one: too few trials).
    rates = run.rates()
    print("\ninvalid rate per arm (Wilson 95%):")
    for r in rates.itertuples():
        print(f"  {r.arm:<45} {r.invalid:>3}/{r.valid + r.invalid:<3} {r.invalid_rate:6.1%} "
              f"[{r.rate_low:.1%}, {r.rate_high:.1%}]")

    # 2. One failing trial, told by its own data: the findings, the stages, the receiver's rows.
    failing = run.failing(limit=1)
    if failing.empty:
        print("\nno invalid or unknown trial")
    else:
        tid = failing["trial_id"].iloc[0]
        verdict = run.trial(tid)["verdict"]
        print(f"\n{tid} ({failing['arm'].iloc[0]}, cut at {failing['cut_op'].iloc[0]}/{failing['cut_phase'].iloc[0]}): "
              f"{verdict['outcome']}")
        for f in verdict["findings"]:
            print(f"  {f['kind']} op {f.get('op')}: {f['detail']}")
        stages = run.timeline_of(tid)[["stage", "t_start", "duration_s", "result"]]
        print(stages.to_string(index=False))
        fx = run.effects_of(tid)[["arrival_seq", "op_id", "epoch", "decision"]]
        print(fx.to_string(index=False))

    # 3. Where the time went: median seconds per pipeline stage and backend.
    stage_cols = [c for c in run.trials.columns if c.endswith("_s") and c != "duration_s" and run.trials[c].notna().any()]
    medians = run.trials.groupby("backend")[stage_cols].median().dropna(axis=1, how="all")
    with pd.option_context("display.float_format", "{:.3f}".format):
        print("\nmedian seconds per stage:\n" + medians.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "results/latest"))

"""Print the workload × finding-class table of a stored run (markdown), as README shows it.

    python scripts/finding_table.py results/latest

One row per variant (or per workload when the run has no variants). Control
arms are the arms with fault ``none``: the column says how many of their
trials were valid. Each finding column counts the adversarial trials (fault
``kill`` or ``leave_running``) that had at least one finding of that class.
Skipped arms are listed under the table with their reasons.
"""

from __future__ import annotations

import sys

import pandas as pd

from cutbench.errors import EXIT_BAD_ARGUMENTS, CutbenchError
from cutbench.api import FINDING_KINDS, open_run


def finding_table(trials: pd.DataFrame) -> pd.DataFrame:
    """Per variant: trials, control-arm validity, and per finding class the adversarial trials showing it."""
    key = "variant" if "variant" in trials and trials["variant"].astype(str).str.len().gt(0).any() else "workload"
    rows = []
    for name, group in trials.groupby(key, sort=False):
        control = group[group["fault"] == "none"]
        adversarial = group[group["fault"] != "none"]
        row = {key: name, "workload": group["workload"].iloc[0], "trials": len(group),
               "control arms valid": f"{int((control['outcome'] == 'valid').sum())}/{len(control)}"}
        for kind in FINDING_KINDS:
            hits = int((adversarial[kind] > 0).sum()) if kind in adversarial else 0
            row[kind] = f"{hits}/{len(adversarial)}" if hits else "–"
        row["unknown"] = int((group["outcome"] == "unknown").sum())
        rows.append(row)
    # Keyed by workload, the row's key is its workload column already (a table keyed by variant shows both).
    return pd.DataFrame(rows)


def main(argv: list[str]) -> int:
    """Print the table of the run directory ``argv[0]``; return the exit code."""
    if len(argv) != 1:
        print("usage: " + __doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    try:
        run = open_run(argv[0])
    except CutbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    print(finding_table(run.trials).to_markdown(index=False))
    reasons: dict[str, set[str]] = {}
    for skipped in run.meta.get("skipped_arms", []):
        variant, _, _arm = skipped["arm"].rpartition(" ")
        reasons.setdefault(variant or "(all)", set()).add(skipped["reason"])
    for variant, why in reasons.items():
        print(f"\nSkipped `{variant}`: {'; '.join(sorted(why))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

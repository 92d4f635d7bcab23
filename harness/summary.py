"""Pure summaries of a trials table: rates per group and the markdown summary."""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.oracle import FINDING_KINDS
from harness.stats import invalid_rate


def rates(trials: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group: trials, outcome counts, finding totals and invalid rate with Wilson 95% bounds."""
    if trials.empty:
        return pd.DataFrame()
    rows = []
    for key, g in trials.groupby(by, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        counts = g["outcome"].value_counts()
        valid, invalid = int(counts.get("valid", 0)), int(counts.get("invalid", 0))
        rate, lo, hi = invalid_rate(invalid, valid)
        row: dict[str, Any] = dict(zip(by, key))
        row.update(
            trials=len(g),
            valid=valid,
            invalid=invalid,
            refused=int(counts.get("refused", 0)),
            unknown=int(counts.get("unknown", 0)),
            invalid_rate=rate,
            rate_low=lo,
            rate_high=hi,
        )
        for kind in FINDING_KINDS:
            if kind in g:
                row[kind] = int(g[kind].sum())
        rows.append(row)
    return pd.DataFrame(rows)


def render(meta: dict[str, Any], trials: pd.DataFrame) -> str:
    """The ``summary.md`` text for a run."""
    scen = meta.get("scenario", {})
    lines = [f"# cutbench run {meta.get('run_id', '')}", ""]
    lines.append(f"- scenario: `{scen.get('name', '')}` ({scen.get('source_path', '')})")
    lines.append(f"- status: **{meta.get('status', '')}**, {len(trials)} of {meta.get('n_trials_planned', '?')} trials, {meta.get('duration_s', 0):.1f} s")
    crit = meta.get("environment", {}).get("criu", {})
    if crit:
        lines.append(f"- CRIU {crit.get('version')} ({crit.get('source')})")
    if trials.empty:
        lines += ["", "No trial finished."]
        return "\n".join(lines) + "\n"
    counts = trials["outcome"].value_counts()
    valid, invalid = int(counts.get("valid", 0)), int(counts.get("invalid", 0))
    rate, lo, hi = invalid_rate(invalid, valid)
    verdict = "INVALID recoveries found" if invalid else ("no verdict (unknown only)" if not valid else "all recoveries valid")
    lines += ["", f"**{verdict}** — invalid recovery rate {_pct(rate)} (95% CI {_pct(lo)}–{_pct(hi)}); "
              + ", ".join(f"{k} {int(counts.get(k, 0))}" for k in ("valid", "invalid", "refused", "unknown")), ""]
    table = rates(trials, ["arm"])
    lines += ["## By arm", "", table.to_markdown(index=False, floatfmt=".3f") if _has_tabulate() else table.to_string(index=False), ""]
    for skipped in meta.get("skipped_arms", []):
        lines.append(f"- skipped {skipped['arm']}: {skipped['reason']}")
    bad = trials[trials["outcome"].isin(["invalid", "unknown"])].head(20)
    if not bad.empty:
        lines += ["## First invalid or unknown trials", ""]
        for row in bad.itertuples():
            lines.append(f"- `{row.trial_id}` {row.arm} {row.plan}: **{row.outcome}** {row.error or ''} — replay: `cutbench replay {meta.get('run_dir', 'results/' + str(meta.get('run_id')))}/trials/{row.trial_id}.json`")
    return "\n".join(lines) + "\n"


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True

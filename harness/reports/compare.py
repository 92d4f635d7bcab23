"""Two runs side by side on the same plans: two tools, or one tool before and after a change.

Pure: two trials tables in, a :class:`Comparison` out. Trials are matched by
what was tested — workload, sweep variant, receiver mode and the exact cut
plan — not by backend, so run A on ``criu`` and run B on ``cuda+criu`` line
up plan by plan. When a run holds several trials of one plan (several
backends in one run) the backend joins the key, so each backend is compared
with itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from cutbench.errors import InvalidArgument
from cutbench.harness.reports.summary import rates
from cutbench.harness.store.tables import stored_stage_columns

BASE_KEY = ("workload", "variant", "receiver_mode", "plan_json")
# How an outcome moved from A to B, for a plan that both ran.
CHANGES = {
    ("valid", "invalid"): "regressed",
    ("invalid", "valid"): "fixed",
}


@dataclass
class Comparison:
    """The comparison of run B against run A on the plans both ran."""

    label_a: str
    label_b: str
    key: tuple[str, ...]
    plans: pd.DataFrame  # one row per matched plan: key, outcome_a, outcome_b, change, trial ids
    groups: pd.DataFrame  # rates of A and B per (variant ×) receiver mode × fault, on matched plans only
    timings: pd.DataFrame  # median seconds per stage, A and B, on matched plans
    only_a: int = 0
    only_b: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> pd.DataFrame:
        """Matched plans valid in A and invalid in B."""
        return self.plans[self.plans["change"] == "regressed"] if not self.plans.empty else self.plans

    def counts(self) -> dict[str, int]:
        """How many matched plans kept their outcome, regressed, were fixed, or changed otherwise."""
        out = {"matched": len(self.plans), "same": 0, "regressed": 0, "fixed": 0, "other": 0, "only_a": self.only_a, "only_b": self.only_b}
        if not self.plans.empty:
            for change, n in self.plans["change"].value_counts().items():
                out[str(change)] = int(n)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "a": self.label_a,
            "b": self.label_b,
            "key": list(self.key),
            "counts": self.counts(),
            "groups": _records(self.groups),
            "timings": _records(self.timings),
            "changed_plans": _records(self.plans[self.plans["change"] != "same"]) if not self.plans.empty else [],
            "notes": self.notes,
        }


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in frame.to_dict("records")]


def _prepare(trials: pd.DataFrame, name: str) -> pd.DataFrame:
    if trials.empty:
        raise InvalidArgument(f"run {name}: has no trials to compare")
    missing = [c for c in ("workload", "receiver_mode", "plan_json", "outcome", "trial_id", "backend") if c not in trials]
    if missing:
        raise InvalidArgument(f"run {name}: trials table lacks {', '.join(missing)}; is it a cutbench run?")
    out = trials.copy()
    if "variant" not in out:
        out["variant"] = ""
    out["variant"] = out["variant"].fillna("").astype(str)
    return out


def compare(a: pd.DataFrame, b: pd.DataFrame, label_a: str = "A", label_b: str = "B") -> Comparison:
    """Compare trials table ``b`` against ``a`` on the plans both ran; raise InvalidArgument when none match."""
    a, b = _prepare(a, label_a), _prepare(b, label_b)
    key = list(BASE_KEY)
    notes = []
    if a.duplicated(key).any() or b.duplicated(key).any():
        key.append("backend")
        notes.append("a run holds one plan several times (several backends); plans are matched within each backend")
    dup_a, dup_b = a.duplicated(key).sum(), b.duplicated(key).sum()
    if dup_a or dup_b:
        notes.append(f"{dup_a + dup_b} repeated trials of one plan and backend: only the first of each is compared")
        a, b = a.drop_duplicates(key), b.drop_duplicates(key)
    merged = a.merge(b, on=key, how="outer", suffixes=("_a", "_b"), indicator=True)
    both = merged[merged["_merge"] == "both"]
    if both.empty:
        raise InvalidArgument(f"runs {label_a} and {label_b} share no plan (matched on {', '.join(key)}): compare runs of one scenario")
    plans = pd.DataFrame({
        **{k: both[k] for k in key},
        "plan": both["plan_a"],
        "fault": both["fault_a"],
        "cut_phase": both["cut_phase_a"],
        "backend_a": both["backend_a"] if "backend_a" in both else both["backend"],
        "backend_b": both["backend_b"] if "backend_b" in both else both["backend"],
        "trial_a": both["trial_id_a"],
        "trial_b": both["trial_id_b"],
        "outcome_a": both["outcome_a"],
        "outcome_b": both["outcome_b"],
    }).reset_index(drop=True)
    plans["change"] = [
        "same" if oa == ob else CHANGES.get((oa, ob), "other") for oa, ob in zip(plans["outcome_a"], plans["outcome_b"])
    ]
    matched_a = a.merge(both[key], on=key)
    matched_b = b.merge(both[key], on=key)
    by = ["receiver_mode", "fault"]
    if plans["variant"].str.len().gt(0).any():
        by.insert(0, "variant")
    ra = rates(matched_a, by).set_index(by)
    rb = rates(matched_b, by).set_index(by)
    cols = ["trials", "invalid", "invalid_rate", "rate_low", "rate_high"]
    groups = ra[cols].merge(rb[cols], left_index=True, right_index=True, how="outer", suffixes=("_a", "_b")).reset_index()
    timings = pd.DataFrame([
        {"stage": c, "median_a": float(matched_a[c].dropna().median()) if c in matched_a and matched_a[c].notna().any() else None,
         "median_b": float(matched_b[c].dropna().median()) if c in matched_b and matched_b[c].notna().any() else None}
        for c in ("duration_s", *dict.fromkeys(stored_stage_columns(matched_a) + stored_stage_columns(matched_b)))
    ])
    timings = timings[timings["median_a"].notna() | timings["median_b"].notna()].reset_index(drop=True)
    return Comparison(
        label_a=label_a,
        label_b=label_b,
        key=tuple(key),
        plans=plans,
        groups=groups,
        timings=timings,
        only_a=int((merged["_merge"] == "left_only").sum()),
        only_b=int((merged["_merge"] == "right_only").sum()),
        notes=notes,
    )


def render(cmp: Comparison) -> str:
    """A markdown rendering of the comparison (rates side by side, timings, changed plans)."""
    from cutbench.harness.reports.summary import pct

    c = cmp.counts()
    lines = ["# cutbench compare", "", f"- A: {cmp.label_a}", f"- B: {cmp.label_b}",
             f"- {c['matched']} plans in both (matched on {', '.join(cmp.key)}); {c['only_a']} only in A, {c['only_b']} only in B",
             f"- outcome same {c['same']}, regressed (valid → invalid) {c['regressed']}, fixed (invalid → valid) {c['fixed']}, other changes {c['other']}"]
    lines += [f"- note: {n}" for n in cmp.notes]
    g = cmp.groups.copy()
    table = pd.DataFrame({
        **{k: g[k] for k in ("variant", "receiver_mode", "fault") if k in g},
        "trials": g["trials_a"],
        "A invalid rate (95% CI)": [f"{pct(r)} ({pct(lo)}–{pct(hi)})" for r, lo, hi in zip(g["invalid_rate_a"], g["rate_low_a"], g["rate_high_a"])],
        "B invalid rate (95% CI)": [f"{pct(r)} ({pct(lo)}–{pct(hi)})" for r, lo, hi in zip(g["invalid_rate_b"], g["rate_low_b"], g["rate_high_b"])],
    })
    lines += ["", "## Invalid recovery rate on the same plans", "", table.to_markdown(index=False)]
    if not cmp.timings.empty:
        lines += ["", "## Median seconds per stage", "", cmp.timings.to_markdown(index=False, floatfmt=".4f")]
    changed = cmp.plans[cmp.plans["change"] != "same"]
    if not changed.empty:
        lines += ["", "## Plans whose outcome changed", ""]
        for r in changed.itertuples():
            lines.append(f"- {r.receiver_mode} {r.plan}: {r.outcome_a} ({r.trial_a}) → **{r.outcome_b}** ({r.trial_b}) [{r.change}]")
    return "\n".join(lines) + "\n"

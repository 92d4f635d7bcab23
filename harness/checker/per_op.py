"""The effect finders written plainly, one op at a time: the specification the oracle's are held to.

:mod:`oracle` judges the receiver's effects table with whole-column
operations so that a trial of a million effects is judged in about a second.
These are the same three definitions as direct loops over ops and rows —
short enough to read against the docstrings in :mod:`oracle` — and nothing
judges a trial with them: the property tests compare the two on random
effect tables, and ``benchmarks/oracle_speed.py`` times both.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from cutbench.harness.checker import oracle
from cutbench.harness.model.trial import Finding


def find_duplicates(effects: pd.DataFrame | None) -> list[Finding]:
    """``duplicate`` as :func:`oracle.find_duplicates` defines it, one group of rows per op."""
    rows = oracle.visible(effects)
    out = []
    for op, group in rows.groupby("op_id", sort=True):
        if len(group) > 1:
            epochs = sorted({int(e) for e in group["epoch"]}) if "epoch" in group else []
            out.append(Finding("duplicate", int(op), f"applied {len(group)} times (epochs {epochs})"))
    return out


def find_missing(effects: pd.DataFrame | None, committed: int) -> list[Finding]:
    """``missing`` as :func:`oracle.find_missing` defines it, one look-up per committed op."""
    counts = oracle.applied_counts(effects)
    return [Finding("missing", op, "committed by the workload, never applied") for op in range(1, committed + 1) if counts.get(op, 0) == 0]


def payload_mismatches(effects: pd.DataFrame | None, reference: Any) -> list[Finding]:
    """The effect half of ``mixed_epoch`` as :func:`oracle.payload_mismatches` defines it, one (op, payload) pair at a time."""
    out: list[Finding] = []
    rows = oracle.visible(effects)
    if not rows.empty:
        for op, digest in rows[["op_id", "digest"]].drop_duplicates().itertuples(index=False):
            expected = reference.payload(int(op))
            if digest != expected:
                out.append(Finding("mixed_epoch", int(op), f"payload {str(digest)[:12]}… ≠ reference {expected[:12]}…"))
    return out


def find_mixed_epoch(effects: pd.DataFrame | None, report: dict[str, Any] | None, reference: Any) -> list[Finding]:
    """``mixed_epoch`` with the effect half done one pair at a time (the report half is the oracle's own)."""
    return payload_mismatches(effects, reference) + oracle.state_mismatches(report, reference)


# The oracle's finders with the three effect finders swapped for these: ``oracle.judge(..., finders=FINDERS)``.
_PLAIN: dict[str, oracle.Finder] = {
    "duplicate": lambda rec, effects, ref: find_duplicates(effects),
    "missing": lambda rec, effects, ref: find_missing(effects, rec.committed_op),
    "mixed_epoch": lambda rec, effects, ref: find_mixed_epoch(effects, rec.report, ref),
}
FINDERS: tuple[tuple[str, oracle.Finder], ...] = tuple((name, _PLAIN.get(name, finder)) for name, finder in oracle.FINDERS)

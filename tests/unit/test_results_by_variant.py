"""Results keep variants apart and say what a failing workload said last (pure renderers, no run needed)."""

from __future__ import annotations

import json

import pandas as pd

from cutbench.harness.reports import html as report
from cutbench.harness.reports import summary
from cutbench.harness.store.tables import last_words


def _trials() -> pd.DataFrame:
    rows = []
    for i, (variant, phase, outcome) in enumerate([("correct", "publish", "valid"), ("correct", "ack", "valid"),
                                                    ("correct", "commit", "valid"), ("buggy", "publish", "invalid"),
                                                    ("buggy", "ack", "invalid"), ("buggy", "commit", "unknown")], 1):
        missing = outcome == "invalid"
        rows.append({"trial_id": f"t{i:04d}", "variant": variant, "workload": "counter", "arm": "criu/idempotent/kill",
                     "backend": "criu", "receiver_mode": "idempotent", "fault": "kill", "plan": f"2/{phase} kill",
                     "cut_phase": phase, "outcome": outcome, "status": "completed",
                     "findings": json.dumps([{"kind": "missing", "op": 2, "detail": "never applied"}] if missing else []),
                     "error": "workload exit 1" if outcome == "unknown" else "", "n_findings": int(missing),
                     "missing": int(missing),
                     "last_words": "Traceback (most recent call last):\nKeyError: 'book'" if outcome == "unknown" else ""})
    return pd.DataFrame(rows)


def test_phases_are_grouped_in_lifecycle_order_not_alphabetically():
    table = summary.rates(_trials(), ["cut_phase"])
    assert list(table["cut_phase"]) == ["publish", "ack", "commit"]
    by_variant = summary.rates(_trials(), ["variant", "cut_phase"])
    assert list(zip(by_variant["variant"], by_variant["cut_phase"])) == [
        ("buggy", "publish"), ("buggy", "ack"), ("buggy", "commit"),
        ("correct", "publish"), ("correct", "ack"), ("correct", "commit")]


def test_a_variant_is_never_pooled_with_its_twin():
    trials = _trials()
    assert summary.series_keys(trials) == ["variant", "backend", "receiver_mode"]
    assert summary.series_keys(trials.assign(variant="")) == ["backend", "receiver_mode"]
    meta = {"run_id": "r", "status": "complete", "scenario": {"name": "book", "variants": [
        {"variant": "correct", "workload": "book:Book"}, {"variant": "buggy", "workload": "book:Buggy"}]}}
    text = summary.render(meta, trials)
    assert "`t0004` buggy: criu/idempotent/kill 2/publish kill: **invalid**" in text
    page = report.render_html(meta, trials, pd.DataFrame(), pd.DataFrame(), {})
    assert "workload of buggy" in page and "book:Buggy" in page and "book:Book" in page
    phase_table = page[page.index('id="rates-by-phase"'):].split("</table>")[0]
    assert phase_table.count("<tr") == 7  # the header and three phases of each variant
    failing = page[page.index('id="failing-trials"'):].split("</table>")[0]
    assert "<th>variant</th>" in failing and "KeyError" in failing


def test_a_failing_trial_shows_the_workload_s_last_words():
    text = summary.render({"run_id": "r", "status": "complete", "scenario": {}}, _trials())
    assert "The workload's last words:" in text and "KeyError: 'book'" in text
    log = "1.0 pid=7 epoch=0 start counter\n\n1.2 pid=7 epoch=0 failed:\nTraceback (most recent call last):\n  File x\nKeyError: 'a'\n"
    assert last_words(log) == "failed:\nTraceback (most recent call last):\n  File x\nKeyError: 'a'"
    assert last_words("") == ""

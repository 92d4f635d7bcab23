"""Small statistics used by the oracle's summaries and the reports."""

from __future__ import annotations

import math
from typing import Any


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval (default 95%) for ``successes`` out of ``n``; (0, 1) when n == 0."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0/n and n/n the bound is exactly 0 (or 1); computed, it can miss by a rounding error.
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    high = 1.0 if successes >= n else min(1.0, centre + half)
    return (low, high)


def invalid_rate(invalid: int, valid: int) -> tuple[float, float, float]:
    """Invalid recovery rate = invalid / (valid + invalid) with its Wilson 95% interval.

    Returns ``(rate, low, high)``; rate is NaN when no trial had a verdict.
    """
    n = invalid + valid
    lo, hi = wilson_interval(invalid, n)
    return (invalid / n if n else float("nan"), lo, hi)


def certificate_matrix(trials: Any) -> dict[str, Any]:
    """The certificates' claims against the oracle's verdicts over a trials frame.

    Counts the trials whose restore decision was certified (``cert_eligible``
    not null): eligible/ineligible × valid/invalid (plus refused, where
    ``enforce`` declined). Returns the counts, the **soundness** figure
    (invalid among eligible: must be 0) and the **over-refusal** figure
    (ineligible among those that were valid: only ``audit`` restores those)
    as ``(rate, low, high)`` with Wilson 95% intervals, and the invalid
    trials among restores ``enforce`` accepted.
    """
    if trials is None or trials.empty or "cert_eligible" not in trials:
        return {"certified": 0}
    cert = trials[trials["cert_eligible"].notna()]
    if cert.empty:
        return {"certified": 0}
    eligible = cert["cert_eligible"].astype(bool)
    out: dict[str, Any] = {"certified": int(len(cert))}
    for name, mask in (("eligible", eligible), ("ineligible", ~eligible)):
        for outcome in ("valid", "invalid", "refused", "unknown"):
            out[f"{name}_{outcome}"] = int(((cert["outcome"] == outcome) & mask).sum())
    # Soundness: invalid among eligible; over-refusal: ineligible among valid (both rates of the same form).
    out["soundness"] = invalid_rate(out["eligible_invalid"], out["eligible_valid"])
    out["over_refusal"] = invalid_rate(out["ineligible_valid"], out["eligible_valid"])
    # An ineligible certificate under enforce accepted nothing: its restore was refused, or started over (a
    # requeued program that reads the decision, which counts a restore stage all the same).
    enforced = (cert[(cert["certify"] == "enforce") & (cert["restores"] > 0) & eligible] if "certify" in cert
                else cert.iloc[0:0])
    out["enforce_accepted"] = int(len(enforced))
    out["enforce_accepted_invalid"] = int((enforced["outcome"] == "invalid").sum())
    return out

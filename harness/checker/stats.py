"""Small statistics used by the oracle's summaries and the reports."""

from __future__ import annotations

import math


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

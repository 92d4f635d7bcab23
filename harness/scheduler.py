"""The generator: draws cut plans. Pure: scenario and arm in, plans out.

``exhaustive`` enumerates every phase of a small op range (bounded black-box
testing, as CrashMonkey does); ``random`` draws seeded plans. The
``hypothesis`` source searches adaptively and so needs trial results; it
lives in :mod:`harness.search` and uses :func:`cut_from_position` from here.
"""

from __future__ import annotations

import random
import zlib

from harness.errors import InvalidArgument
from harness.plan import Cut, CutPlan
from harness.scenario import Arm, Scenario


def positions(scenario: Scenario) -> list[tuple[int, str]]:
    """Every cut point ``(op, phase)`` the scenario allows, in execution order."""
    lo, hi = scenario.plan_ops
    return [(op, phase) for op in range(lo, hi + 1) for phase in scenario.plan_phases]


def cut_from_position(arm: Arm, op: int, phase: str, *, mode: str = "precise", async_offset_ms: float = 0.0) -> Cut:
    """The cut at ``(op, phase)`` shaped by ``arm`` (fault, crash delay, split window)."""
    return Cut(
        op=op,
        phase=phase,
        mode=mode,
        async_offset_ms=async_offset_ms,
        split_window_ms=arm.split_window_ms,
        fault=arm.fault,
        crash_after_ms=arm.crash_after_ms,
    )


def plans(scenario: Scenario, arm: Arm) -> list[CutPlan]:
    """The plans to run for ``arm`` under the scenario's static plan source.

    Raises :class:`InvalidArgument` for the ``hypothesis`` source, which is
    adaptive (see :mod:`harness.search`).
    """
    if scenario.plan_source == "exhaustive":
        return exhaustive(scenario, arm)
    if scenario.plan_source == "random":
        return random_plans(scenario, arm)
    raise InvalidArgument(f"plan.source = {scenario.plan_source!r} is adaptive; use harness.search")


def exhaustive(scenario: Scenario, arm: Arm) -> list[CutPlan]:
    """One single-cut plan per allowed position (× async offsets in async mode)."""
    out = []
    for op, phase in positions(scenario):
        for mode, offset in _modes(scenario):
            out.append(CutPlan((cut_from_position(arm, op, phase, mode=mode, async_offset_ms=offset),)))
    return out


def random_plans(scenario: Scenario, arm: Arm) -> list[CutPlan]:
    """``scenario.trials`` seeded plans of ``cuts_per_trial`` cuts at increasing positions.

    The seed mixes the scenario seed with the arm label, so each arm gets its
    own reproducible stream and adding an arm does not change the others.
    """
    rng = random.Random(zlib.crc32(f"{scenario.seed}:{arm.label()}".encode()))
    allowed = positions(scenario)
    modes = _modes(scenario)
    k = min(scenario.cuts_per_trial, len(allowed))
    out = []
    for _ in range(scenario.trials):
        picks = sorted(rng.sample(range(len(allowed)), k))
        cuts = []
        for idx in picks:
            mode, offset = rng.choice(modes)
            op, phase = allowed[idx]
            cuts.append(cut_from_position(arm, op, phase, mode=mode, async_offset_ms=offset))
        out.append(CutPlan(tuple(cuts)))
    return out


def _modes(scenario: Scenario) -> list[tuple[str, float]]:
    precise = [("precise", 0.0)]
    asynchronous = [("async", off) for off in scenario.async_offset_ms]
    if scenario.cut_mode == "precise":
        return precise
    if scenario.cut_mode == "async":
        return asynchronous
    return precise + asynchronous

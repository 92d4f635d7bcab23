"""The generator: draws cut plans. Pure: scenario and arm in, plans out.

``exhaustive`` enumerates every phase of a small op range (bounded black-box
testing, as CrashMonkey does); ``random`` draws seeded plans. The
``hypothesis`` source searches adaptively and so needs trial results; it
lives in :mod:`cutbench.harness.generator.search` and uses :func:`cut_from_position` from here.
"""

from __future__ import annotations

import itertools
import math
import random
import zlib

from cutbench.errors import InvalidArgument
from cutbench.harness.model.plan import Cut, CutPlan
from cutbench.harness.model.scenario import LIMITS, Arm, Scenario
from cutbench.harness.model.trial import TrialSpec, spec_for


def positions(scenario: Scenario) -> list[tuple[int, str]]:
    """Every cut point ``(op, phase)`` the scenario allows, in execution order."""
    lo, hi = scenario.plan_ops
    order = scenario.workload_class().phases
    phases = sorted(scenario.plan_phases, key=order.index)
    return [(op, phase) for op in range(lo, hi + 1) for phase in phases]


def cut_from_position(
    arm: Arm,
    op: int,
    phase: str,
    *,
    mode: str = "precise",
    async_offset_ms: float = 0.0,
    crash_after_ms: float | None = None,
    split_window_ms: float | None = None,
) -> Cut:
    """The cut at ``(op, phase)`` shaped by ``arm`` (fault, crash delay, split window).

    ``crash_after_ms``/``split_window_ms`` override the arm's values (the
    ``hypothesis`` source draws them per cut).
    """
    return Cut(
        op=op,
        phase=phase,
        mode=mode,
        async_offset_ms=async_offset_ms,
        split_window_ms=arm.split_window_ms if split_window_ms is None else split_window_ms,
        fault=arm.fault,
        crash_after_ms=arm.crash_after_ms if crash_after_ms is None else crash_after_ms,
        restore_target=arm.restore_target,
        rank_skew_ms=arm.rank_skew_ms,
    )


def plans(scenario: Scenario, arm: Arm) -> list[CutPlan]:
    """The plans to run for ``arm`` under the scenario's static plan source.

    Raises :class:`InvalidArgument` for the ``hypothesis`` source, which is
    adaptive (see :mod:`cutbench.harness.generator.search`).
    """
    if scenario.plan_source == "exhaustive":
        return exhaustive(scenario, arm)
    if scenario.plan_source == "random":
        return random_plans(scenario, arm)
    if scenario.plan_source == "periodic":
        return periodic(scenario, arm)
    raise InvalidArgument(f"plan.source = {scenario.plan_source!r} is adaptive; use cutbench.harness.generator.search")


def exhaustive(scenario: Scenario, arm: Arm) -> list[CutPlan]:
    """Every plan of 1 to ``cuts_per_trial`` cuts over the allowed positions, in a fixed order.

    Single-cut plans come first (position order, × async offsets in async
    mode), then every pair of positions, and so on: bounded black-box
    enumeration, as CrashMonkey enumerates small workloads. The count grows
    as ``positions ** cuts_per_trial``; keep the op range small.
    """
    allowed = positions(scenario)
    mode_choices = modes(scenario)
    earlier = precise_modes(mode_choices)  # only the last cut may be asynchronous (CutPlan.validate_for)
    sizes = range(1, min(scenario.cuts_per_trial, len(allowed)) + 1)
    count = sum(math.comb(len(allowed), k) * len(earlier) ** (k - 1) * len(mode_choices) for k in sizes)
    if count > LIMITS["plan.exhaustive_plans"]:
        raise InvalidArgument(f"plan: the exhaustive source would enumerate {count:,} plans per arm (more than "
                              f"{LIMITS['plan.exhaustive_plans']:,}): narrow plan.ops or plan.phases, lower "
                              "plan.cuts_per_trial, or use plan.source = \"random\"")
    out = []
    for size in sizes:
        for combo in itertools.combinations(allowed, size):
            for shape in itertools.product(*[earlier] * (size - 1), mode_choices):
                out.append(CutPlan(tuple(cut_from_position(arm, op, phase, mode=m, async_offset_ms=off)
                                         for (op, phase), (m, off) in zip(combo, shape))))
    return out


def random_plans(scenario: Scenario, arm: Arm) -> list[CutPlan]:
    """Return ``scenario.trials`` seeded plans of 1 to ``cuts_per_trial`` cuts at increasing positions.

    The seed mixes the scenario seed with the arm label (:func:`arm_seed`), so
    each arm gets its own reproducible stream and adding an arm does not
    change the others.
    """
    rng = random.Random(arm_seed(scenario, arm))
    allowed = positions(scenario)
    mode_choices = modes(scenario)
    k_max = min(scenario.cuts_per_trial, len(allowed))
    out = []
    for _ in range(scenario.trials):
        size = rng.randint(1, k_max) if k_max > 1 else 1
        picks = sorted(rng.sample(range(len(allowed)), size))
        cuts = []
        for n, idx in enumerate(picks):
            # Only the last cut may be asynchronous (see CutPlan.validate_for).
            mode, offset = rng.choice(mode_choices if n == len(picks) - 1 else precise_modes(mode_choices))
            op, phase = allowed[idx]
            cuts.append(cut_from_position(arm, op, phase, mode=mode, async_offset_ms=offset))
        out.append(CutPlan(tuple(cuts)))
    return out


def periodic(scenario: Scenario, arm: Arm) -> list[CutPlan]:
    """Return ``scenario.trials`` copies of one plan: a cut every ``plan.interval_ops`` ops over ``plan.ops``.

    Periodic checkpoints, as a job's checkpointer takes them, for the
    steady-state overhead of a tool: each cut is precise, at the first of
    ``plan.phases`` (in execution order), at ops ``lo, lo + N, lo + 2N, … ≤ hi``.
    ``interval_ops = 0`` gives plans with no cut at all: the same run with no
    checkpointer, the native throughput the others are compared with. The
    copies are repeats (for a confidence interval), not different plans.
    """
    phase = positions(scenario)[0][1]
    lo, hi = scenario.plan_ops
    n = scenario.interval_ops
    ops = range(lo, hi + 1, n) if n else range(0)
    if len(ops) > LIMITS["plan.periodic_cuts"]:  # before building them
        raise InvalidArgument(f"plan: the periodic source would place {len(ops):,} cuts in one trial (more than "
                              f"{LIMITS['plan.periodic_cuts']:,}): raise plan.interval_ops or narrow plan.ops")
    cuts = tuple(cut_from_position(arm, op, phase) for op in ops)
    return [CutPlan(cuts) for _ in range(scenario.trials)]


def arm_seed(scenario: Scenario, arm: Arm) -> int:
    """The seed of ``arm``'s plan stream: a hash of the scenario seed and the arm label."""
    return zlib.crc32(f"{scenario.seed}:{arm.label()}".encode())


def modes(scenario: Scenario) -> list[tuple[str, float]]:
    """The ``(mode, async_offset_ms)`` choices ``plan.cut_mode`` allows for one cut."""
    precise = [("precise", 0.0)]
    asynchronous = [("async", off) for off in scenario.async_offset_ms]
    if scenario.cut_mode == "precise":
        return precise
    if scenario.cut_mode == "async":
        return asynchronous
    return precise + asynchronous


def precise_modes(mode_choices: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """The precise choices of ``mode_choices``; a cut that other cuts follow must be one (precise if none is listed)."""
    return [c for c in mode_choices if c[0] == "precise"] or [("precise", 0.0)]


def build_specs(scenario: Scenario, arms: list[Arm], *, start_index: int = 0) -> list[TrialSpec]:
    """One :class:`TrialSpec` per (arm, plan) of the scenario's static plan source."""
    specs = []
    i = start_index
    for arm in arms:
        for plan in plans(scenario, arm):
            i += 1
            specs.append(spec_for(scenario, arm, plan, i))
    return specs

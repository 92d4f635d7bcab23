"""Lifecycle sequences for ``cutbench hunt``: a Hypothesis state machine, and a random walk to measure it against.

The machine (:func:`search`) walks a tool's documented lifecycle
(:mod:`cutbench.harness.hunt.model`) on a live probe. Each step is drawn
by one of two rules: ``advance`` takes a lifecycle step the documentation
says succeeds here (lock, checkpoint, restore, a CRIU dump…), ``detour`` any
other step open here (a signal, a fork, a second thread's call, work on the
probe, or misuse the documentation refuses). After every step the checker's
invariants are asserted; a deviation not seen before fails the example and
Hypothesis shrinks it to the shortest sequence that still shows it. A
deviation already found ends its sequence quietly, so the search goes on to
the next one.

The probe and the tool are reached only through ``open_session`` (the
nemesis's :class:`~cutbench.harness.nemesis.lifecycle_kit.Session`): this
module decides what to do, never how.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.errors import Flaky
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from cutbench.harness.hunt.checker import Deviation, judge, judge_close
from cutbench.harness.hunt.model import World, Step, advance, expect, moves, probes, safe


class LifecycleSession(Protocol):
    """What the search needs of a live probe under a tool (the nemesis's ``Session``)."""

    def observe(self, action: str, **args: Any) -> dict[str, Any]:
        """Run one step; what was seen (answer, state, detail, continues)."""

    def close(self) -> list[str]:
        """End the probe; what was left behind."""


@dataclass
class Found:
    """One deviation: the shortest sequence seen to show it, and when the search first met it."""

    deviation: Deviation
    sequence: list[Step]
    observations: list[dict[str, Any]]
    first_at: int  # sequences tried (this search's) when it was first seen
    first_s: float  # seconds into the search
    probe: str = "buffers"  # the probe the sequence started


@dataclass
class HuntLog:
    """What a search did: sequences and steps tried, the deviations found (by signature), in how long."""

    tool: str
    length: int
    overrides: dict[str, str] = field(default_factory=dict)
    sequences: int = 0
    steps: int = 0
    found: dict[str, Found] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    hard_deadline: float = float("inf")  # no sequence starts after this (set by the search from its budget)
    max_sequences: int | None = None  # nor once this many ran
    harness_errors: list[str] = field(default_factory=list)
    # How often each step was taken in each state, and what it answered: "lock(timeout_ms=1)@running->ok".
    transitions: Counter[str] = field(default_factory=Counter)
    probes: Counter[str] = field(default_factory=Counter)  # sequences started on each probe
    gpus: int = 1  # the GPUs here: a step that needs two is taken only where there are two

    def exhausted(self) -> bool:
        """Whether the budget is spent: past the hard deadline, or as many sequences run as allowed."""
        return time.monotonic() > self.hard_deadline or (
            self.max_sequences is not None and self.sequences >= self.max_sequences)

    def record(self, devs: list[Deviation], trace: list[tuple[Step, dict[str, Any]]],
               probe: str = "buffers") -> list[Deviation]:
        """Keep each deviation's shortest sequence (and its probe); returns ``devs`` (a caller tells new from known)."""
        for dev in devs:
            seq = [s for s, _ in trace]
            old = self.found.get(dev.signature)
            if old is None:
                self.found[dev.signature] = Found(dev, seq, [o for _, o in trace], self.sequences,
                                                  round(time.monotonic() - self.started, 1), probe)
            elif len(seq) < len(old.sequence):
                self.found[dev.signature] = Found(dev, seq, [o for _, o in trace], old.first_at, old.first_s, probe)
        return devs


class _DeviationFound(AssertionError):
    """A step broke an invariant in a way the search had not seen (Hypothesis shrinks the example)."""


class Walker:
    """One sequence on one probe: take steps, judge each, and stop quietly after a known deviation."""

    def __init__(self, tool: str, open_session: Callable[[str], LifecycleSession], log: HuntLog,
                 probe: str = "buffers") -> None:
        self.tool, self.log, self.probe = tool, log, probe
        self.world = World()
        self.trace: list[tuple[Step, dict[str, Any]]] = []
        # Past the budget (a shrink running long) a sequence takes no step and starts no probe.
        self.spent = log.exhausted()
        self.session = None if self.spent else open_session(probe)
        log.sequences += not self.spent
        log.probes[probe] += not self.spent

    def take(self, step: Step) -> list[Deviation]:
        """Run ``step``, judge it, move the world on; returns the deviations it showed."""
        assert self.session is not None
        expected = expect(self.tool, self.world, step, self.log.overrides)
        observed = self.session.observe(step.action, **dict(step.args))
        self.log.steps += 1
        self.log.transitions[f"{step}@{self.world.state}->{observed.get('answer')}"] += 1
        self.trace.append((step, observed))
        if observed.get("answer") == "harness":
            self.log.harness_errors.append(f"{step}: {observed.get('detail')}")
            self.spent = True
            return []
        devs = judge(self.world, step, expected, observed)
        self.world = advance(self.tool, self.world, step, observed.get("answer", ""), observed.get("state", ""))
        if devs:
            self.spent = True  # the probe is off the documented path: its next steps say nothing new
        return self.log.record(devs, self.trace, self.probe)

    def finish(self) -> list[Deviation]:
        """End the probe; the deviations its leftovers show."""
        if self.session is None:
            return []
        left = self.session.close()
        devs = judge_close(self.world, left)
        if devs:
            self.trace.append((devs[0].step, devs[0].observed))
        return self.log.record(devs, self.trace, self.probe)


def machine(tool: str, open_session: Callable[[str], LifecycleSession], log: HuntLog,
            first_probe: int = 0) -> type[RuleBasedStateMachine]:
    """A ``RuleBasedStateMachine`` over ``tool``'s lifecycle on fresh probes from ``open_session``.

    Each sequence first draws its probe (:func:`~cutbench.harness.hunt.model.probes`, starting at index
    ``first_probe``): Hypothesis draws the first choice most often early in a run and shrinks towards it, so
    the search turns the list a step each round and no probe is only met by chance."""
    choices = probes(tool)
    choices = choices[first_probe % len(choices):] + choices[:first_probe % len(choices)]

    # Deviations found in earlier rounds end a sequence quietly; one found in this round fails every
    # example that shows it, so that Hypothesis can shrink it.
    quiet = set(log.found)

    def fail_on(devs: list[Deviation]) -> None:
        new = [d for d in devs if d.signature not in quiet]
        if new:
            raise _DeviationFound(new[0].summary)

    class Lifecycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.walker: Walker | None = None

        @initialize(probe=st.sampled_from(choices))
        def start(self, probe: str) -> None:
            self.walker = Walker(tool, open_session, log, probe)

        def _take(self, step: Step) -> None:
            assert self.walker is not None
            fail_on(self.walker.take(step))

        def _open(self, kind: str) -> tuple[Step, ...]:
            w = self.walker
            return () if w is None or w.spent else moves(tool, w.world, log.overrides, log.gpus)[kind]

        @precondition(lambda self: bool(self._open("advance")))
        @rule(data=st.data())
        def advance(self, data: st.DataObject) -> None:
            self._take(data.draw(st.sampled_from(self._open("advance")), label="advance"))

        @precondition(lambda self: bool(self._open("detour")))
        @rule(data=st.data())
        def detour(self, data: st.DataObject) -> None:
            self._take(data.draw(st.sampled_from(self._open("detour")), label="detour"))

        @precondition(lambda self: not (self._open("advance") or self._open("detour")))
        @rule()
        def idle(self) -> None:
            """Nothing: what is left of a sequence after a known deviation (a machine needs one open rule)."""

        def teardown(self) -> None:
            if self.walker is not None:
                fail_on(self.walker.finish())

    Lifecycle.__name__ = f"Lifecycle[{tool}]"
    return Lifecycle


def search(tool: str, open_session: Callable[[str], LifecycleSession], log: HuntLog, budget_s: float,
           examples_per_round: int = 10, max_sequences: int | None = None, seed: int | None = None) -> HuntLog:
    """Run the state machine in rounds until ``budget_s`` is spent; returns ``log`` with what was found.

    ``max_sequences``: also stop once that many sequences ran, shrinking's
    included (a budget in effort, not time: the same on a slow host as on a
    fast one).
    ``seed``: draw the same sequences on every run (each round seeded
    ``seed + round``), so a search is repeatable as long as the tool answers
    the same way.

    Each round is one Hypothesis run of up to ``examples_per_round``
    sequences of at most ``log.length`` steps. A round that finds a new
    deviation shrinks it (the log keeps the shortest sequence of each kind,
    whatever Hypothesis ends with), and the next round starts afresh.
    Shrinking stops at half the budget past it: what was shortest by then
    is kept (:func:`tighten` finishes the job).
    """
    deadline = log.started + budget_s
    log.hard_deadline = deadline + budget_s / 2
    rounds = 0
    log.max_sequences = max_sequences
    while time.monotonic() < deadline and not log.exhausted():
        cls = machine(tool, open_session, log, first_probe=rounds)
        if seed is not None:
            cls._hypothesis_internal_use_seed = seed + rounds  # type: ignore[attr-defined]  # what @seed sets
        rounds += 1
        # Rounds no longer than what is left of the budget, at the pace seen so far (shrinking may run over).
        pace = (time.monotonic() - log.started) / max(log.sequences, 1)
        left = int((deadline - time.monotonic()) / pace) if log.sequences else examples_per_round
        if max_sequences is not None:
            left = min(left, max_sequences - log.sequences)
        cfg = settings(max_examples=max(1, min(examples_per_round, left)), stateful_step_count=log.length, deadline=None,
                       database=None, suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink),
                       report_multiple_bugs=False, print_blob=False, verbosity=Verbosity.quiet)
        try:
            run_state_machine_as_test(cls, settings=cfg)
        except (_DeviationFound, Flaky):
            # Flaky: a real tool answered one sequence two ways, or a replay crossed the hard deadline.
            # The log holds the shortest sequence seen for each deviation either way.
            pass
    return log


def random_walk(tool: str, open_session: Callable[[str], LifecycleSession], log: HuntLog, budget_s: float,
                seed: int = 0) -> HuntLog:
    """The baseline: sequences of ``log.length`` steps drawn uniformly from every safe step, each on a probe drawn
    uniformly; returns ``log``."""
    rng = random.Random(seed)
    deadline = log.started + budget_s
    while time.monotonic() < deadline:
        walker = Walker(tool, open_session, log, rng.choice(probes(tool)))
        try:
            for _ in range(log.length):
                if walker.spent:
                    break
                walker.take(rng.choice(safe(tool, walker.world, log.gpus)))
        finally:
            walker.finish()
    return log


def tighten(tool: str, open_session: Callable[[str], LifecycleSession], log: HuntLog, found: Found) -> Found:
    """Return ``found`` with every step removed that the deviation does not need; returns the shortest that still shows it.

    Hypothesis's shrink stops at the search's hard deadline; this pass
    finishes the job one step at a time: drop a step, replay the rest on a
    fresh probe, and keep the drop when the last step still shows the same
    deviation. It replays at most one sequence per step of ``found``, on its probe.
    """
    steps = [s for s in found.sequence if s.action != "close"]
    closing = found.deviation.step.action == "close"
    i = 0
    while i < len(steps) - (0 if closing else 1):
        trial = steps[:i] + steps[i + 1:]
        shown = _replay(tool, open_session, log, trial, found.deviation.signature, closing, found.probe)
        if shown is not None:
            steps, found = trial, replace(shown, first_at=found.first_at, first_s=found.first_s)
        else:
            i += 1
    return found


def _replay(tool: str, open_session: Callable[[str], LifecycleSession], log: HuntLog, steps: list[Step],
            signature: str, closing: bool, probe: str) -> Found | None:
    """Replay ``steps`` on ``probe``; the deviation with ``signature`` as found when the sequence ends showing it,
    else None."""
    scratch = HuntLog(tool, len(steps), log.overrides, gpus=log.gpus)
    walker = Walker(tool, open_session, scratch, probe)
    try:
        for n, step in enumerate(steps):
            if walker.spent:
                return None  # it went off the documented path before the end: not the same sequence
            walker.take(step)
            if scratch.found and n < len(steps) - 1:
                return None
    finally:
        walker.finish()
    return scratch.found.get(signature)

"""The hunt's invariants: one observed step against what the tool documents. Pure: data in, deviations out.

Five invariants, checked after every step:

- ``documented_transition``: the answer is one the documentation allows, and a
  success leaves the state it promises;
- ``bounded_failure``: a refusal leaves the process alive, in the state it was in;
- ``continues_identically``: a process that runs again holds what it held
  (buffers, their addresses, its second threads' results);
- ``bounded_time``: no step takes longer than its bound;
- ``nothing_left``: once a sequence ends, no process, GPU memory or image remains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cutbench.harness.hunt.model import Expect, Step, World


@dataclass(frozen=True)
class Deviation:
    """One broken invariant: where it happened, what was promised, what was seen."""

    invariant: str
    step: Step
    before: str
    promised: str
    source: str
    observed: dict[str, Any] = field(hash=False, compare=False)

    @property
    def signature(self) -> str:
        """The deviation's kind, for telling one defect from another: invariant, step, state, answer and words.

        The tool's words lose their numbers (pids, sizes), so one defect seen
        twice has one signature; what a session left behind is one defect
        whatever state the probe ended in.
        """
        words = re.sub(r"\d+", "N", str(self.observed.get("detail", "")))[:80] if self.observed.get(
            "answer") == "refused" else ""
        after = self.observed.get("state", "")
        before = "" if self.invariant == "nothing_left" else self.before
        return f"{self.invariant}:{self.step.action}@{before}->{self.observed.get('answer')}/{after}:{words}"

    @property
    def summary(self) -> str:
        """One sentence: the step, the state it was taken in, the promise, and what happened."""
        seen = self.observed
        what = {
            "documented_transition": f"answered {seen.get('answer')} and left it {seen.get('state')}",
            "bounded_failure": f"was refused and left it {seen.get('state')}",
            "continues_identically": f"and the process did not continue identically: {seen.get('continues_detail')}",
            "bounded_time": f"did not return within its bound ({seen.get('detail')})",
            "nothing_left": f"left behind: {seen.get('detail')}",
        }[self.invariant]
        return f"{self.step} in {self.before}: documented {self.promised}; it {what}"

    def to_json(self) -> dict[str, Any]:
        """The deviation as stored in ``hunt.json`` and embedded in its reproducer."""
        return {"invariant": self.invariant, "action": self.step.action, "args": dict(self.step.args),
                "before": self.before, "promised": self.promised, "source": self.source,
                "observed": {k: self.observed.get(k) for k in ("answer", "state", "detail", "continues",
                                                               "continues_detail", "seconds")},
                "signature": self.signature, "summary": self.summary}


def judge(world: World, step: Step, expected: Expect, observed: dict[str, Any]) -> list[Deviation]:
    """The invariants ``observed`` breaks, given the step was taken in ``world`` under ``expected``.

    ``observed`` is the session's record of the step: ``answer`` (ok, refused,
    hang, gone), ``state`` after it, ``detail`` (the tool's words), and
    ``continues`` (False with ``continues_detail`` when the probe's digest
    did not hold). An empty list: the step kept every promise.
    """
    def dev(invariant: str) -> Deviation:
        return Deviation(invariant, step, world.state, expected.describe(), expected.source, observed)

    answer, state = observed.get("answer"), observed.get("state")
    if answer == "hang":
        return [dev("bounded_time")]
    out = []
    if answer not in expected.answers:
        out.append(dev("documented_transition"))
    elif answer == "ok" and state != expected.after_ok:
        out.append(dev("documented_transition"))
    elif answer == "refused" and state != expected.after_refused:
        out.append(dev("bounded_failure"))
    if observed.get("continues") is False:
        out.append(dev("continues_identically"))
    return out


def judge_close(world: World, leftovers: list[str]) -> list[Deviation]:
    """Return ``nothing_left``: what the sequence's end found still there (empty when nothing was)."""
    if not leftovers:
        return []
    observed = {"answer": "refused", "state": "gone", "detail": "; ".join(leftovers)}
    return [Deviation("nothing_left", Step("close"), world.state, "nothing left",
                      "the tools free a killed process's memory and files", observed)]

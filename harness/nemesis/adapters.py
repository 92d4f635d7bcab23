"""Semantic adapters, harness side: the coordinator's two phases, over the control file.

A workload that registered adapters (:mod:`cutbench.workloads.adapters`; the
control slot ``adapters`` says how many) has each of them join every cut:

1. ``prepare`` (stage ``prepare``), before anything is captured: every adapter
   answers ready, with its domain's state at the cut, within the deadline
   (``run.prepare_timeout_s``), or the cut is called off: ``abort`` is posted
   (stage ``abort``, timed), the workload is released, and the trial is
   ``refused`` at ``prepare`` with each adapter's own words;
2. ``commit`` once the image exists, or ``abort`` when a later stage refuses or fails;
3. after a restore, before the restored process runs: ``restored`` (bring the
   domain back to the cut) and ``classify`` of the effects in flight, which
   the certificate uses.

An adapter that answers garbage, raises, or does not answer in time is a
refusal, never a hang: every wait here is bounded. The workload answers
one request at a time, the newest: a request posted while an older one is
still unanswered supersedes it, so nothing here relies on an answer it did
not get (a ``restored`` that was not answered is a failed restore, and no
``classify`` follows it).

Joining is only as good as the moment it holds for. A domain counts as
joined (:attr:`Joined.states`) when the workload stays parked at the cut
until its image is taken (a precise cut without a split window or a rank
skew), or when its adapter *holds* the domain there by itself until commit
(``holds = True``: the persistent kernel's drain); otherwise its state is
recorded and nothing more. The restore decision waits for a classification
only when the restored process is parked too.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from cutbench.errors import NoAnswer, StageRefused
from cutbench.harness.nemesis.base import CutContext
from cutbench.workloads.adapters import CLASSES, MAX_CLASSIFY, VERBS
from cutbench.workloads.control import REPLY_OFFSET

POLL_S = 0.0005
# How long the harness waits for an abort's acknowledgement: the abort is bounded by the prepare deadline plus
# this. A workload still inside a late prepare answers the abort once that returns (the newest request).
ABORT_WAIT_S = 0.5
# How much earlier than the harness's wait the adapters' deadline falls (at most a tenth of the wait).
REPLY_MARGIN_S = 0.1


@dataclass
class Joined:
    """What ``prepare`` established: each domain's state at the cut, and the domains that joined it for this
    capture (all of them when the workload stays parked through it, else only those whose adapter holds)."""

    states: dict[str, str] = field(default_factory=dict)
    said: dict[str, str] = field(default_factory=dict)  # every adapter's state, joined or not (for the evidence)


def parked_through(ctx: CutContext) -> bool:
    """Whether the workload stays parked at the cut until its image is taken and is parked when restored:
    a precise cut without a split window or a rank skew."""
    cut = ctx.cut
    return cut.mode == "precise" and not cut.split_window_ms and not cut.rank_skew_ms


def registered(ctx: CutContext) -> bool:
    """Whether the cut's workload registered any adapter and its backend joins them to the cut."""
    return ctx.semantic_adapters and ctx.control is not None and ctx.control.get("adapters") > 0


def epoch_of(ctx: CutContext) -> int:
    """The cut's epoch as the adapters see it: the cut's number within its trial, counted from 1."""
    return ctx.cut_index + 1


def request(ctx: CutContext, verb: str, wait_s: float, *, lo: int = 0, hi: int = 0) -> dict[str, dict[str, Any]]:
    """Post ``verb`` for this cut and wait up to ``wait_s`` for the reply; return each domain's answer.

    Raises :class:`NoAnswer` when no reply came in time or the reply is not the adapters' JSON."""
    c = ctx.control
    c.set("adapt_verb", VERBS.index(verb))
    c.set("adapt_epoch", epoch_of(ctx))
    # The adapters' deadline comes a little before the harness's own: one that waits to the last moment for
    # its subsystem still has its answer read in time.
    c.set("adapt_deadline_ns", time.time_ns() + int((wait_s - min(REPLY_MARGIN_S, wait_s / 10)) * 1e9))
    c.set("adapt_lo", lo)
    c.set("adapt_hi", hi)
    seq = c.get("adapt_seq") + 1
    c.set("adapt_seq", seq)  # written last: the workload reads it first
    deadline = time.monotonic() + wait_s
    while c.get("adapted_seq") < seq:
        if time.monotonic() > deadline:
            raise NoAnswer(f"no answer to {verb} within {wait_s:g}s")
        time.sleep(POLL_S)
    text = c.get_text(area=REPLY_OFFSET)
    try:
        reply = json.loads(text)
    except ValueError:
        raise NoAnswer(f"the reply to {verb} is not JSON: {text[:80]!r}") from None
    if not isinstance(reply, dict) or reply.get("seq") != seq:
        raise NoAnswer(f"the reply to {verb} is not the answer to request {seq}: {text[:80]!r}")
    if "error" in reply:
        raise NoAnswer(f"{verb}: {reply['error']}")
    answers = reply.get("answers")
    if not isinstance(answers, dict) or not all(isinstance(a, dict) for a in answers.values()):
        raise NoAnswer(f"the reply to {verb} has no answers per domain: {text[:80]!r}")
    return answers


def prepare(ctx: CutContext, timeout_s: float) -> Joined:
    """Stage ``prepare``: every adapter joins the cut; return what they said (empty without adapters).

    Raises :class:`StageRefused` at ``prepare`` naming each adapter that refused, erred or did not answer,
    after :func:`abort` (the caller releases the workload)."""
    if not registered(ctx):
        return Joined()
    ctx.adapters_open = True
    with ctx.timeline.stage("prepare", ctx.cut_index) as extra:
        try:
            answers = request(ctx, "prepare", timeout_s)
            refusals = [f"{d}: {_words(a)}" for d, a in sorted(answers.items()) if a.get("ready") is not True
                        or not isinstance(a.get("state"), str)]
        except NoAnswer as exc:
            answers, refusals = {}, [str(exc)]
        extra["detail"] = "; ".join(refusals) if refusals else ", ".join(f"{d}={a['state']}" for d, a in sorted(answers.items()))
    if refusals:
        abort(ctx)
        raise StageRefused("prepare", "adapters: " + "; ".join(refusals))
    said = {d: a["state"] for d, a in answers.items()}
    parked = parked_through(ctx)
    return Joined(states={d: st for d, st in said.items() if parked or answers[d].get("holds") is True}, said=said)


def _words(answer: dict[str, Any]) -> str:
    """What an adapter that did not say ready said instead."""
    if "error" in answer:
        return str(answer["error"])
    if answer.get("ready") is False:
        return f"not ready: {answer.get('reason', '(no reason given)')}"
    return f"answered garbage: {json.dumps(answer)[:80]}"


def abort(ctx: CutContext) -> None:
    """Stage ``abort``: call the cut off at every adapter (bounded by :data:`ABORT_WAIT_S`; never raises)."""
    if not registered(ctx):
        return
    ctx.adapters_open = False
    with ctx.timeline.stage("abort", ctx.cut_index) as extra:
        try:
            request(ctx, "abort", ABORT_WAIT_S)
            extra["detail"] = "aborted"
        except NoAnswer as exc:
            extra["detail"] = f"posted; {exc} (answered when the workload gets back to it)"


def commit(ctx: CutContext, timeout_s: float) -> None:
    """Stage ``commit``: the image exists; every adapter goes on. Never raises: a commit the workload does
    not acknowledge is noted in the timeline (the image is already good)."""
    ctx.adapters_open = False
    _post(ctx, "commit", timeout_s)


@dataclass
class Restored:
    """What a restored process's adapters did: ``failed`` says why ``restored`` did not happen ("" when it
    did: every joined domain is back at the cut); ``classes`` is op → class, or why there is none."""

    failed: str = ""
    classes: dict[int, str] | str = field(default_factory=dict)


def restored(ctx: CutContext, timeout_s: float, in_flight: list[int]) -> Restored:
    """After a restore, before the restored process runs: ``restored``, then (when it was done) ``classify`` of
    the effect ids ``in_flight``."""
    if not registered(ctx):
        return Restored()
    ctx.adapters_open = False
    failed = _post(ctx, "restored", timeout_s)
    if failed:
        return Restored(failed=failed, classes=f"restored failed: {failed}")
    return Restored(classes=_classify(ctx, timeout_s, in_flight) if in_flight else {})


def _classify(ctx: CutContext, timeout_s: float, in_flight: list[int]) -> dict[int, str] | str:
    """Stage ``classify`` of ``in_flight``: op → class (the weakest over the domains), or why there is none."""
    lo, hi = min(in_flight), max(in_flight)
    if hi - lo + 1 > MAX_CLASSIFY:
        return f"{hi - lo + 1} effects in flight: more than one classify request holds ({MAX_CLASSIFY})"
    with ctx.timeline.stage("classify", ctx.cut_index) as extra:
        try:
            answers = request(ctx, "classify", timeout_s, lo=lo, hi=hi)
        except NoAnswer as exc:
            extra["detail"] = str(exc)
            return str(exc)
        merged: dict[int, str] = {}
        for domain, answer in sorted(answers.items()):
            classes = answer.get("classes")
            if not isinstance(classes, dict):
                extra["detail"] = f"{domain}: {_words(answer)}"
                return extra["detail"]
            for key, cls in classes.items():
                if cls not in CLASSES or not str(key).isdigit():
                    extra["detail"] = f"{domain}: classified {key!r} as {cls!r}"
                    return extra["detail"]
                op = int(key)
                if op in in_flight:
                    merged[op] = _weakest(merged.get(op), cls)
        extra["detail"] = ", ".join(f"{op}={c}" for op, c in sorted(merged.items()))
    return merged


def _weakest(a: str | None, b: str) -> str:
    """Two domains' classes of one effect: ``replay`` (it will be sent) wins over ``committed`` and ``discard``,
    because any one subsystem that sends it again makes it a second delivery."""
    return b if a is None or b == "replay" else a


def _post(ctx: CutContext, verb: str, timeout_s: float) -> str:
    """Stage ``verb``: post it and wait for the answers; return what went wrong ("" when every adapter did it)."""
    if not registered(ctx):
        return ""
    with ctx.timeline.stage(verb, ctx.cut_index) as extra:
        try:
            answers = request(ctx, verb, timeout_s)
            errors = [f"{d}: {a['error']}" for d, a in sorted(answers.items()) if "error" in a]
            extra["detail"] = "; ".join(errors) if errors else "ok"
        except NoAnswer as exc:
            extra["detail"] = str(exc)
        return "" if extra["detail"] == "ok" else extra["detail"]

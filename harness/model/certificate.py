"""Recovery-cut certificates: which logical cut a checkpoint's bytes belong to, and whether a restore of it is safe.

A checkpoint tool reports that bytes were saved. A certificate adds the
statement a scheduler needs: at which logical moment (epoch) each state
domain the workload uses was captured, what happened to the external effects
around the cut, and, from that, whether a restore is **eligible**. It is a
claim built from evidence; the oracle is the ground truth, and an eligible
restore the oracle finds invalid is a bug in the certificate
(``certificate_unsound``).

Everything here is pure: :class:`Evidence` in, :class:`Certificate` out, so
the rule is unit-tested on recorded evidence and a stored run can be
re-certified without a GPU.

**Epochs.** A position is ``(op, phase)``: the cut point after that phase of
that op. Each capture stage records the workload's position when it captured
its domain (``cuda_lock`` for the GPU, ``criu_freeze`` for the CPU image,
``app_save`` for an application save). Two positions are *compatible* when
no device phase (one that changes GPU state: ``launch``, ``device_done``,
``collective``, ``allreduce``) completed between them: host-only progress
inside a split window (``record``, ``publish``) leaves the GPU state of the
earlier position valid for the later one.

**The rule.** A restore is eligible when

1. every domain the workload uses is covered by the backend's image or is
   the external receiver (``unknown`` is empty),
2. the covered domains were captured at compatible epochs,
3. the external effects are handled: ``fenced`` commits through the cut's
   fence and aborts what a rolled-back process prepared after it;
   ``idempotent`` deduplicates a replayed op; ``at_least_once`` is safe only
   when no effect of an op past the cut became visible before the restore
   (such an effect would be sent again),
4. no file of the workload's ``disk`` domain was written after the image was
   taken (``written_after``: a program's checkpoint file dates its image), and
5. every CUDA feature the workload declares (``features``) is *continued
   identically* by this tool, under this fault, on this driver, as the measured
   support matrix says (``cutbench matrix``); a feature the matrix marks
   otherwise, or did not measure here, is unknown (``feature:<name>``).

**Semantic adapters.** A domain whose adapter joined the cut (it answered
ready at ``prepare``) counts as covered, at the state it named
(``request_log: committed_through(4)@3/publish``). An effect in flight that the
restored process's own adapters classify ``committed`` (their log says it is
out: it will not be sent again) or ``discard`` (it will never be sent) is
handled, not ``escaped``, whatever the receiver mode; one classified
``replay`` is sent again and is handled only by an idempotent or fenced
receiver.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

CERTIFY_OFF = "off"  # the default: no certificate, no decision
CERTIFY_MODES: tuple[str, ...] = (CERTIFY_OFF, "audit", "enforce")
# Phases whose completion changes GPU state (see the module docstring).
DEVICE_PHASES: frozenset[str] = frozenset({"launch", "device_done", "collective", "allreduce"})
# The one external domain: no checkpoint holds it; effects are judged by the receiver mode.
EXTERNAL = "receiver"
# Which capture stage vouches for a covered domain; the image stage (the last capture) for the rest.
DOMAIN_STAGE: dict[str, str] = {"cuda": "cuda_lock", "uvm": "cuda_lock"}


@dataclass(frozen=True)
class Position:
    """Where the workload stood: after ``phase`` of ``op`` (``phase`` "" before any point)."""

    op: int
    phase: str

    def label(self) -> str:
        """Return the position as text: ``3/publish``."""
        return f"{self.op}/{self.phase}" if self.phase else f"{self.op}/-"


@dataclass
class Evidence:
    """What the coordinator gathered for one cut (see the runner's coordinator)."""

    checkpoint: int  # the cut's index in its trial
    phases: tuple[str, ...]  # the workload's phases, in order
    workload_domains: tuple[str, ...]
    covers: tuple[str, ...]  # the backend's declared coverage
    receiver_mode: str
    # Capture stage -> the workload's position when it captured (in stage order).
    positions: dict[str, Position] = field(default_factory=dict)
    # The highest effect id the checkpointed process had sent, and had seen acknowledged, when its image was taken.
    sent_through: int = 0
    acked_through: int = 0
    # The restored process reconnects to the receiver (its TCP connection is closed on restore) and so
    # resends what it had sent without an acknowledgement.
    reconnects: bool = False
    # Restore-time evidence: ops whose effect is visible at the receiver when the restore is decided.
    visible: tuple[int, ...] = ()
    # Ops a rolled-back process prepared after the cut (fenced), aborted before the restore.
    aborted: tuple[int, ...] = ()
    restore_decided: bool = False  # False: the certificate was made before any restore decision (fault none)
    # Suspend/resume in place (fault none): the process never leaves memory, so what the
    # image does not hold is still live in it, not lost.
    in_place: bool = False
    # The CUDA features the workload declares, and the support matrix's word on each for this tool, fault and
    # driver: feature -> (cell, where it was measured or why not). A feature absent from ``support`` is unmeasured.
    features: tuple[str, ...] = ()
    support: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Semantic adapters: domain -> the state its adapter named at prepare (the domain joined the cut), and
    # effect id -> the restored process's classification of it (committed, replay, discard).
    adapters: dict[str, str] = field(default_factory=dict)
    classified: dict[int, str] = field(default_factory=dict)
    # A program's files it wrote after its image was taken (its checkpoint file dates the image): the disk is
    # ahead of the process the image holds.
    written_after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Certificate:
    """The claim for one checkpoint: the fields of docs/certificates.md."""

    checkpoint: int
    application_epoch: str  # the position the image resumes from
    domains: dict[str, str]  # domain -> "state@epoch" (or "unknown")
    external_effect_fence: str  # "committed_through(F)", "deduplicated", "none"
    in_flight: dict[int, str]  # op -> commit | replay | discard | escaped
    coverage: tuple[str, ...]
    unknown: tuple[str, ...]
    eligible: bool
    reason: str  # why not eligible ("" when eligible)
    features: dict[str, str] = field(default_factory=dict)  # feature -> the support matrix's cell and where

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``in_flight`` keys as strings)."""
        out = asdict(self)
        out["in_flight"] = {str(k): v for k, v in self.in_flight.items()}
        out["coverage"], out["unknown"] = list(self.coverage), list(self.unknown)
        return out


def compatible(a: Position, b: Position, phases: tuple[str, ...]) -> bool:
    """Whether no device phase completed between positions ``a`` and ``b`` (either order)."""
    index = {p: i for i, p in enumerate(phases)}
    lo, hi = sorted([(a.op, index.get(a.phase, -1)), (b.op, index.get(b.phase, -1))])
    op, i = lo
    while (op, i) < hi:
        i += 1
        if i >= len(phases):
            op, i = op + 1, 0
        if phases[i] in DEVICE_PHASES:
            return False
    return True


def certify(ev: Evidence) -> Certificate:
    """The certificate of one cut from its evidence (rule in the module docstring)."""
    reasons: list[str] = []
    covers = set(ev.covers) | set(ev.adapters)
    used = [d for d in ev.workload_domains if d != EXTERNAL]
    unknown = () if ev.in_place else tuple(sorted(d for d in used if d not in covers))
    if unknown:
        reasons.append(f"no checkpoint holds {', '.join(unknown)}")
    features, unsupported = _features(ev)
    if unsupported:
        unknown = unknown + tuple(f"feature:{f}" for f in unsupported)
        reasons += [f"feature {f}: {features[f]}" for f in unsupported]
    image_stage = next(reversed(ev.positions), "") if ev.positions else ""
    image_pos = ev.positions.get(image_stage)
    domains: dict[str, str] = {}
    captured: list[tuple[str, Position]] = []
    for d in used:
        if d in unknown:
            domains[d] = "unknown"
            continue
        if ev.in_place and d not in covers:
            domains[d] = "live"  # never left the running process
            continue
        if not ev.positions:  # decided before any capture (a precheck): nothing was taken
            domains[d] = "not captured"
            continue
        if d in ev.adapters and d not in ev.covers:  # joined by its adapter at the cut, not by an image
            domains[d] = f"{ev.adapters[d]}@{image_pos.label() if image_pos else '-'}"
            continue
        stage = DOMAIN_STAGE.get(d, image_stage)
        pos = ev.positions.get(stage, image_pos)
        state = {"cuda_lock": "checkpointed", "criu_freeze": "frozen", "app_save": "saved"}.get(stage, "captured")
        domains[d] = f"{state}@{pos.label()}" if pos else "unknown"
        if pos is not None:
            captured.append((d, pos))
        else:
            reasons.append(f"no capture stage reported the position of {d}")
    for (d1, p1), (d2, p2) in zip(captured, captured[1:]):
        if not compatible(p1, p2, ev.phases):
            reasons.append(f"{d1}@{p1.label()} and {d2}@{p2.label()} are at incompatible epochs (device work in between)")
    if ev.written_after and "disk" in used:
        shown = ", ".join(ev.written_after[:3]) + (f" and {len(ev.written_after) - 3} more" if len(ev.written_after) > 3
                                                  else "")
        domains["disk"] = f"ahead of the image ({shown})"
        reasons.append(f"disk: {shown} written after the image was taken, which holds the process from before them "
                       "(restored, it would meet files from its future)")
    fence, in_flight = _effects(ev, reasons)
    if EXTERNAL in ev.workload_domains:
        domains[EXTERNAL] = fence
    return Certificate(
        checkpoint=ev.checkpoint,
        application_epoch=image_pos.label() if image_pos else "",
        domains=domains,
        external_effect_fence=fence,
        in_flight=in_flight,
        coverage=tuple(sorted(ev.covers)),
        unknown=unknown,
        eligible=not reasons,
        reason="; ".join(reasons),
        features=features,
    )


NO_MATRIX = "not measured: no support matrix was given (pipeline.support_matrix; cutbench matrix measures one)"


def _features(ev: Evidence) -> tuple[dict[str, str], list[str]]:
    """Each declared feature's support-matrix verdict as text, and those not continued identically."""
    out, unsupported = {}, []
    for f in ev.features:
        cell, where = ev.support.get(f, ("not_measured", NO_MATRIX))
        out[f] = f"{cell} ({where})" if cell == "identical" else (
            f"the support matrix says {cell} ({where})" if cell != "not_measured" else where)
        if cell != "identical":
            unsupported.append(f)
    return out, unsupported


def _effects(ev: Evidence, reasons: list[str]) -> tuple[str, dict[int, str]]:
    """The external-effect fence and the classification of in-flight ops.

    In flight are the ops the restored process will send although their
    effect may already be out: those past the cut that a process running on
    after the cut made visible, and (when the restored process reconnects)
    those it had sent without an acknowledgement.
    """
    visible = set(ev.visible)
    after_cut = sorted(op for op in visible if op > ev.sent_through)
    unacked = range(ev.acked_through + 1, ev.sent_through + 1) if ev.reconnects else range(0)
    resent = sorted(op for op in unacked if op in visible)
    in_flight: dict[int, str] = {}
    # What the restored process's own subsystems will not send again is handled in any receiver mode.
    held = {op: {"committed": "commit", "discard": "discard"}[ev.classified[op]]
            for op in after_cut + resent if ev.classified.get(op) in ("committed", "discard")}
    after_cut = [op for op in after_cut if op not in held]
    resent = [op for op in resent if op not in held]
    in_flight.update(held)
    if ev.receiver_mode == "fenced":
        for op in resent:
            in_flight[op] = "commit"  # committed through the fence; a resend is suppressed
        for op in ev.aborted:
            in_flight[op] = "discard"  # prepared by the rolled-back process; the restored one prepares it again
        return f"committed_through({ev.sent_through})", in_flight
    if ev.receiver_mode == "idempotent":
        for op in after_cut + resent:
            in_flight[op] = "replay"  # the receiver suppresses the second delivery of the op
        return "deduplicated", in_flight
    for op in after_cut + resent:
        in_flight[op] = "escaped"
    if after_cut or resent:
        ops = ", ".join(map(str, sorted(after_cut + resent)))
        reasons.append(f"receiver: effects of ops {ops} are already visible and the restored process sends them again "
                       "(at_least_once has no fence)")
    return "none", in_flight


def in_flight_candidates(ev: Evidence) -> list[int]:
    """The effect ids a restored process could send although their effect may be out (the ops
    :func:`certify` classifies in ``in_flight``): visible past the cut, or sent unacknowledged before a
    reconnecting restore."""
    visible = set(ev.visible)
    unacked = set(range(ev.acked_through + 1, ev.sent_through + 1)) if ev.reconnects else set()
    return sorted(op for op in visible if op > ev.sent_through or op in unacked)


def epoch_steps(positions: list[Position], phases: tuple[str, ...]) -> int:
    """How many cut points apart the earliest and the latest of ``positions`` are (0 for one or none)."""
    index = {p: i for i, p in enumerate(phases)}
    steps = [p.op * len(phases) + index.get(p.phase, -1) for p in positions]
    return max(steps) - min(steps) if steps else 0

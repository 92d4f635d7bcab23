"""The nemesis: one cut through a backend, then the fault, then the restore.

``execute_cut`` is the only place that knows the order
``prepare → (precheck) → checkpoint → (checkpointed) → commit → fault → (before_restore) → (before_resume) →
restore → restored + classify → (after_restore) → release`` and what each
failure means for the trial: a refusal releases the workload and lets it go
on (its adapters aborted); a failure brings the workload back where possible
and is reported with the stage and error. It never leaves an image directory
behind unless asked. The adapter steps (:mod:`cutbench.harness.nemesis.adapters`)
run only for a workload that registered adapters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cutbench.harness.nemesis import adapters
from cutbench.harness.nemesis.base import Checkpointer, CutContext, remove_tree
from cutbench import storage
from cutbench.errors import HarnessFault, StageFailed, StageRefused
from cutbench.interrupts import interruptible, shielded
from cutbench.procs import Child


@dataclass
class CutOutcome:
    """What happened to one cut.

    ``status``: ``restored`` (fault then restore), ``resumed`` (fault ``none``),
    ``refused`` (a stage declined; the workload went on), ``failed`` (a stage
    of the tool failed and took the application with it) or ``error`` (the
    harness could not carry a stage out).
    """

    status: str
    stage: str = ""
    error: str = ""


def execute_cut(
    backend: Checkpointer,
    target: Child,
    ctx: CutContext,
    *,
    release: Callable[[], None],
    before_resume: Callable[[], None],
    keep_images: bool = False,
    discard: Callable[[Path], None] = remove_tree,
) -> CutOutcome:
    """Run one cut on ``target`` (parked, or running for async cuts); return its outcome.

    ``release`` lets a parked workload continue; ``before_resume`` runs after
    the fault and before the restored process can run (the runner bumps the
    epoch and arms the next cut there). ``target`` is re-pointed at the
    restored pid on success. ``discard`` removes the cut's image directory
    afterwards (unless ``keep_images``); a runner may hand it to a background
    remover that it waits for before it ends.
    """
    ctx.release = release
    ctx.semantic_adapters = backend.capabilities.semantic_adapters
    # The shield before the try: no instant between the body's end and the cleanup's start takes a Ctrl-C.
    with shielded():
        try:
            with interruptible():
                return _stages(backend, target, ctx, release, before_resume)
        finally:  # whole, whatever stopped the body: the tool's leftovers and the images go
            if ctx.adapters_open:  # an unexpected failure between prepare and commit: nothing may stay held
                adapters.abort(ctx)
            backend.cleanup(ctx)
            if not keep_images:
                discard(ctx.images_dir)


def _stages(backend: Checkpointer, target: Child, ctx: CutContext, release: Callable[[], None],
            before_resume: Callable[[], None]) -> CutOutcome:
    """The cut's stages in their one order: prepare (adapters, certificate's precheck), checkpoint, then resume
    in place (fault ``none``) or fault and restore; return the outcome of the first that ends the cut."""
    cut, certifier = ctx.cut, ctx.certifier
    ended = _prepare(ctx, release)
    if ended is None:
        ended = _checkpoint(backend, target, ctx, release)
    if ended is not None:
        return ended
    if certifier is not None:
        certifier.checkpointed()
    if cut.fault != "kill":  # the process goes on from here; under kill only its restored image does (restored)
        adapters.commit(ctx, ctx.prepare_timeout_s)
    if cut.fault == "none":
        release()
        try:
            backend.resume_in_place(target, ctx)
        except (StageFailed, StageRefused) as exc:
            return _failed(exc)
        return CutOutcome("resumed")
    if cut.fault == "leave_running":
        release()
        with ctx.timeline.stage("run_until_crash", ctx.cut_index):
            time.sleep(cut.crash_after_ms / 1000.0)
    with ctx.timeline.stage("fault_" + cut.fault, ctx.cut_index) as extra:
        rc = target.kill()
        extra["detail"] = f"pid {target.pid} exit {rc}"
    refusal = certifier.before_restore() if certifier is not None else None
    if refusal:
        # The restore is declined: the crashed workload stays down (a
        # restart from scratch is the safe alternative), nothing is restored.
        return CutOutcome("refused", "certify_restore", refusal)
    before_resume()
    return _restore(backend, target, ctx, release)


def _prepare(ctx: CutContext, release: Callable[[], None]) -> CutOutcome | None:
    """The semantic adapters' prepare and the certificate's precheck; a refusal (the workload released, nothing
    captured), or None to go on."""
    certifier = ctx.certifier
    try:
        joined = adapters.prepare(ctx, ctx.prepare_timeout_s)
    except StageRefused as exc:
        release()  # bounded failure: the adapters were aborted, nothing was captured
        return CutOutcome("refused", exc.stage, exc.reason)
    if certifier is not None:
        certifier.joined(joined, parked=adapters.parked_through(ctx))
    refusal = certifier.precheck() if certifier is not None else None
    if refusal:
        adapters.abort(ctx)
        release()  # bounded failure: nothing was touched, the workload goes on
        return CutOutcome("refused", "certify", refusal)
    return None


def _checkpoint(backend: Checkpointer, target: Child, ctx: CutContext, release: Callable[[], None]) -> CutOutcome | None:
    """The tool's checkpoint of ``target``'s tree; its refusal or failure (the workload released), or None."""
    # The tree the tool is about to image, children in sessions of their own included: the fault takes
    # each of them down with the target, so that no pid the restore needs is still held.
    target.track()
    try:
        if ctx.freeze is not None and not backend.capabilities.drives_cuda:
            ctx.freeze()  # a program held at a system call: stopped whole for the tool, the tracer gone
        backend.checkpoint(target, ctx)
    except (StageRefused, StageFailed) as exc:
        adapters.abort(ctx)
        release()
        own = _own_storage(exc, ctx)
        if own is None and not isinstance(exc, StageFailed):
            return CutOutcome("refused", exc.stage, exc.reason)
        return _failed(own or exc)
    return None


def _restore(backend: Checkpointer, target: Child, ctx: CutContext, release: Callable[[], None]) -> CutOutcome:
    """The tool's restore, ``target`` re-pointed at the restored process, its adapters and the certificate asked
    before it runs a step; return the cut's outcome."""
    certifier = ctx.certifier
    # The restore runs to its end, and the handle learns the restored pid, before a Ctrl-C goes on:
    # a process restored and not known would outlive the trial.
    with shielded():
        try:
            pid = backend.restore(ctx)
        except (StageRefused, StageFailed) as exc:
            # A declined restore option (e.g. a GPU remap the driver rejected)
            # after which the backend brought the workload back as it was: safe.
            resumed = getattr(exc, "resumed_pid", None)
            if resumed is None and (own := _own_storage(exc, ctx)) is not None:
                return _failed(own)
            if isinstance(exc, StageFailed):
                return _failed(exc)
            if resumed is None:
                return CutOutcome("failed", exc.stage, exc.reason)
            target.replaced_by(resumed)
            # It is the restored image, on its own GPU: its adapters bring their domains back to the cut.
            back = adapters.restored(ctx, ctx.prepare_timeout_s, [])
            release()
            return CutOutcome("refused", exc.stage, exc.reason + (f"; adapters: restored failed: {back.failed}" if back.failed else ""))
        target.replaced_by(pid)
        ctx.restored = True
    # The restored process is still parked at the cut: its adapters bring their domains back to the cut
    # and classify the effects in flight before it runs a step.
    in_flight = certifier.in_flight() if certifier is not None else []
    back = adapters.restored(ctx, ctx.prepare_timeout_s, in_flight)
    refusal = certifier.after_restore(back) if certifier is not None else None
    if refusal:
        # Declined after all: the restored process never ran past its park; it goes down as the crash left it.
        target.kill()
        return CutOutcome("refused", "certify_restore",
                          f"{refusal} (declined once the restored process's adapters had classified the effects "
                          "in flight: it was stopped at its park before it ran)")
    release()
    return CutOutcome("restored")


def _own_storage(exc: StageFailed | StageRefused, ctx: CutContext) -> HarnessFault | None:
    """The harness's own fault when a stage failed because the images directory it gave the tool is full or
    unwritable (:func:`cutbench.storage.exhausted`), checked before the cut's files are removed; else None."""
    if isinstance(exc, HarnessFault):
        return None
    why = storage.exhausted(ctx.images_dir, exc.reason)
    if why is None:
        return None
    return HarnessFault(exc.stage, f"the images directory (pipeline.images_dir) {why}: the harness's own storage, "
                                   f"no claim about the tool; {exc.stage} said: {exc.reason}")


def _failed(exc: StageFailed | StageRefused) -> CutOutcome:
    """The outcome of a failed stage: the tool's (``failed``) or the harness's own (``error``).

    A resume the tool refuses after its checkpoint counts as failed: the workload was stopped for the checkpoint."""
    return CutOutcome("error" if isinstance(exc, HarnessFault) else "failed", exc.stage, exc.reason)

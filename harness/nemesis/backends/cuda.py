"""``cuda``: the CUDA stages every CUDA backend runs, and the ``cuda`` backend (the driver's checkpoint calls, in place).

The harness process drives ``cuCheckpointProcess{GetState,Lock,Checkpoint,
Restore,Unlock}`` on the workload's CUDA processes: every process of the
workload's tree that the driver knows (one per rank for multi-GPU workloads).
On its own this backend suspends and resumes in place (fault ``none``): after
``Checkpoint`` the process holds no GPU memory, after ``Restore`` + ``Unlock``
it runs on. ``cuda+criu`` (``cuda_criu.py``) and ``cuda-checkpoint`` reuse the
stages defined here.

This module owns the stages (:class:`CudaStages`: ``cuda_discover``,
``cuda_lock``, ``cuda_checkpoint``, ``cuda_restore``, ``cuda_unlock``, each
driver call timed and bounded by the stage timeout), what a failed call means
for the cut (:func:`classify`, :class:`RemapRefused`) and the ``cuda`` backend
(:class:`CudaCheckpointer`). It must not call cuda-python or hold a copy of
the driver's error table: every call goes through a
:class:`~cutbench.harness.nemesis.backends.cuda_driver.DriverApi`
(``cuda_driver.py``: the binding and its error table), and what there is to
cut is :mod:`~cutbench.harness.nemesis.backends.cuda_discovery`'s to find.

Failure semantics (issue "the real GPU pipeline"):

* ``Lock`` failing while every process is verified RUNNING (e.g.
  ``CUDA_ERROR_NOT_READY`` after ``timeoutMs`` on a kernel that never ends) is
  a clean refusal: :class:`StageRefused`.
* any later stage failing brings the processes back (``Restore`` what is
  CHECKPOINTED, ``Unlock`` what is LOCKED) and raises :class:`StageFailed`
  naming the stage and the driver's error; no process stays LOCKED or
  CHECKPOINTED.
* a GPU remap on restore (``CUcheckpointGpuPair``) that the driver rejects is
  retried without the remap; the workload comes back on its own GPU and the
  cut is ``refused`` with the driver's reason (:class:`RemapRefused`).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cutbench.errors import CudaCallError, HarnessFault, RemapRefused, StageFailed, StageRefused, hung_reason
from cutbench.harness.environment import gpu_mem
from cutbench.harness.nemesis.cpu_account import helper_thread
from cutbench.harness.model.plan import SAME_GPU
from cutbench.harness.nemesis.backends.cuda_discovery import CudaProcs, bindings_unavailable_reason, find_cuda_processes
from cutbench.harness.nemesis.backends.cuda_driver import CudaDriver, DriverApi
from cutbench.harness.nemesis.base import Capabilities, CutContext
from cutbench.procs import Child


# A lock waits for in-flight device work; a kernel that never finishes makes it
# time out. Bounded so that such a cut is refused quickly, not after the whole
# stage timeout.
LOCK_TIMEOUT_S = 5.0
# Head-room a remap target must have beyond the bytes moving onto it.
REMAP_MARGIN = 256 << 20

# The stages this module times (their names are the timeline rows and the `<stage>_s` columns).
CUDA_STAGES = ("cuda_lock", "cuda_checkpoint", "cuda_restore", "cuda_unlock")


def classify(stage: str, error: CudaCallError, states_after: Sequence[str]) -> StageRefused | StageFailed:
    """The stage outcome of a failed call: refused when the application went on, else failed.

    ``states_after`` are the processes' states once the harness brought back
    what it could. A failure on the way *to* the image (lock, checkpoint) or
    while resuming the original after a ``leave_running`` dump, after which
    every process is RUNNING again, is the tool declining: the workload goes
    on (``refused``). Anything else — a process gone, left LOCKED or
    CHECKPOINTED, or a restore of the image that failed — lost the
    application (``failed``: the trial is ``lost``, finding ``process_lost``).
    """
    went_on = states_after and all(s == "running" for s in states_after)
    if went_on and (stage in ("cuda_lock", "cuda_checkpoint") or stage.endswith("_original")):
        return StageRefused(stage, f"{error} (process {'left' if stage == 'cuda_lock' else 'brought back'} RUNNING)")
    return StageFailed(stage, f"{error}; states after recovery: {', '.join(states_after) or 'none'}")


# -- the stages ---------------------------------------------------------------


class CudaStages:
    """The CUDA half of a cut, shared by the CUDA backends: discover, lock, checkpoint, restore, unlock.

    Holds the processes of the cut in progress so that :meth:`bring_back` (and
    the backend's ``cleanup``) can always leave them RUNNING.
    """

    def __init__(self, driver: DriverApi):
        self.driver = driver
        self.procs: CudaProcs | None = None
        # What the harness had to do to bring processes back (a tool that left one LOCKED or CHECKPOINTED):
        # the cut's ``harness_action`` fact, so a verdict never credits the tool with the harness's repair.
        self.actions: list[str] = []
        # Processes a driver call never returned for: nothing more is asked of the driver about them (a second
        # call would wait behind the first), and every call on the way back is bounded as well.
        self.hung: set[int] = set()
        self.timeout_s = 60.0

    def take_actions(self) -> str:
        """What :meth:`bring_back` and the backend did since the last call, as one line ("" for nothing)."""
        text, self.actions = "; ".join(dict.fromkeys(self.actions)), []
        return text

    # -- discovery ---------------------------------------------------------
    def discover(self, root: int, ctx: CutContext) -> CudaProcs:
        """The CUDA processes of ``root``'s tree, with their GPU memory (NVML) recorded as facts.

        Raises :class:`StageRefused` when none of them is a CUDA process (the
        workload does not use the GPU: nothing for this backend to cut), and
        :class:`HarnessFault` when one is not RUNNING before the cut
        (:func:`~cutbench.harness.nemesis.backends.cuda_discovery.find_cuda_processes`).
        """
        with ctx.timeline.stage("cuda_discover", ctx.cut_index) as extra:
            procs = find_cuda_processes(root, self.driver)
            extra["bytes"] = procs.gpu_bytes
            extra["detail"] = " ".join(f"pid {p}:{','.join(procs.gpus[p]) or '?'}" for p in procs.pids)
        ctx.facts["gpu_bytes"] = procs.gpu_bytes
        ctx.facts["cuda_processes"] = len(procs.pids)
        self.procs = procs
        return procs

    def remap_pairs(self, procs: CudaProcs, target: str) -> dict[int, list[list[tuple[str, str]]]]:
        """Per pid, candidate lists of (old, new) GPU UUID pairs for ``target``, tried in order.

        ``same``: none. ``other_gpu``: every GPU moves to the next one in device
        order (a rotation: two ranks on two GPUs swap places). Raises
        :class:`StageRefused` before anything is locked when a remap cannot
        even be asked for (one GPU, unknown usage, no remap support, too little
        free memory on a target GPU).
        """
        if target == SAME_GPU:
            return {}
        if not self.driver.supports_remap:
            raise StageRefused("cuda_restore", "this driver interface cannot remap GPUs on restore")
        visible = self.driver.gpu_uuids()
        if len(visible) < 2:
            raise StageRefused("cuda_restore", f"restore onto another GPU needs 2 GPUs; {len(visible)} visible")
        def nxt(u: str) -> str:
            return visible[(visible.index(u) + 1) % len(visible)]

        out = {}
        for pid in procs.pids:
            used = procs.gpus.get(pid) or []
            if not used:
                raise StageRefused("cuda_restore", f"cannot tell which GPU pid {pid} uses (NVML/nvidia-smi unavailable)")
            # Every GPU the process can see, not only those it allocated on: a
            # list of the used GPUs alone is CUDA_ERROR_INVALID_VALUE (driver 580).
            out[pid] = [[(u, nxt(u)) for u in visible]]
        self._check_room(procs, nxt)
        return out

    def _check_room(self, procs: CudaProcs, nxt: Callable[[str], str]) -> None:
        """Refuse a remap whose target GPUs lack the memory (NVML), before anything is locked.

        A remap the driver rejects with CUDA_ERROR_OUT_OF_MEMORY was seen to
        leave the process unrestorable while the target stays full, so the
        harness does not ask for one that cannot fit.
        """
        free = gpu_mem.free_bytes()
        if not free:
            return
        need: dict[str, int] = {}
        room = dict(free)
        for usage in procs.usage.values():
            for uuid, used in usage.items():
                need[nxt(uuid)] = need.get(nxt(uuid), 0) + used
                room[uuid] = room.get(uuid, 0) + used  # the checkpoint frees it
        short = {g: (n, room.get(g, 0)) for g, n in need.items() if n + REMAP_MARGIN > room.get(g, 0)}
        if short:
            raise StageRefused("cuda_restore", "remap refused before the cut: " + "; ".join(
                f"{g} would have {r >> 20} MiB free, needs {n >> 20} MiB (+{REMAP_MARGIN >> 20})" for g, (n, r) in short.items()))

    # -- the cut -----------------------------------------------------------
    def cut(self, procs: CudaProcs, ctx: CutContext) -> None:
        """Lock and checkpoint every process: all locks first (coordinated), or one
        process at a time ``rank_skew_ms`` apart with the workload released in between."""
        skew = ctx.cut.rank_skew_ms / 1000.0
        timeout_ms = int(1000 * min(LOCK_TIMEOUT_S, ctx.stage_timeout_s))
        if skew <= 0:
            for i, pid in enumerate(procs.pids):
                self._call("cuda_lock", i, pid, ctx, functools.partial(self.driver.lock, pid, timeout_ms))
            ctx.mark("cuda_lock")  # every process locked: the GPU state is fixed at this position
            for i, pid in enumerate(procs.pids):
                self._call("cuda_checkpoint", i, pid, ctx, functools.partial(self.driver.checkpoint, pid))
            return
        for i, pid in enumerate(procs.pids):
            if i:
                if ctx.release is not None:
                    ctx.release()
                with ctx.timeline.stage("rank_skew", ctx.cut_index):
                    time.sleep(skew)
            self._call("cuda_lock", i, pid, ctx, functools.partial(self.driver.lock, pid, timeout_ms))
            self._call("cuda_checkpoint", i, pid, ctx, functools.partial(self.driver.checkpoint, pid))
        ctx.mark("cuda_lock")  # skewed: the last process locked (each rank at its own position)

    def resume(self, pids: Sequence[int], ctx: CutContext, *, pairs: dict[int, list[list[tuple[str, str]]]] | None = None,
               suffix: str = "") -> None:
        """Restore then unlock every process in ``pids`` (same order as the cut; skewed likewise).

        ``suffix`` names the stages (``cuda_restore_original`` when the
        process that was dumped with ``--leave-running`` is resumed).
        """
        pairs = pairs or {}
        skew = ctx.cut.rank_skew_ms / 1000.0
        for i, pid in enumerate(pids):
            if i and skew > 0:
                with ctx.timeline.stage("rank_skew", ctx.cut_index):
                    time.sleep(skew)
            self._call("cuda_restore" + suffix, i, pid, ctx, functools.partial(self._restore, pid, pairs.get(pid, [])))
            if skew > 0:
                self._call("cuda_unlock" + suffix, i, pid, ctx, functools.partial(self.driver.unlock, pid))
        if skew <= 0:
            for i, pid in enumerate(pids):
                self._call("cuda_unlock" + suffix, i, pid, ctx, functools.partial(self.driver.unlock, pid))

    def _restore(self, pid: int, candidates: list[list[tuple[str, str]]]) -> str:
        """Restore ``pid``, trying each remap candidate while the process stays CHECKPOINTED; return what worked."""
        if not candidates:
            self.driver.restore(pid)
            return ""
        errors = []
        for pairs in candidates:
            try:
                self.driver.restore(pid, pairs)
                return "remap " + ", ".join(f"{o[:12]}->{n[:12]}" for o, n in pairs)
            except CudaCallError as exc:
                errors.append(exc)
                if self._state(pid) != "checkpointed":
                    break
        raise errors[-1] if len(errors) == 1 else CudaCallError(
            errors[-1].call, pid, errors[-1].code, errors[-1].name, errors[-1].meaning,
            "; ".join(f"with {len(c)} pair(s): {e.name} {e.text}" for c, e in zip(candidates, errors)))

    def _call(self, stage: str, rank: int, pid: int, ctx: CutContext, fn: Callable[[], Any]) -> None:
        """Run one driver call as a timed stage; on error bring every process back and raise the stage outcome.

        A call still running after ``ctx.stage_timeout_s`` is a hung stage: :class:`StageFailed` with
        :func:`~cutbench.errors.hung_reason` (nothing is brought back: the driver is inside a call for
        this process, and a second one would wait behind it).
        """
        self.timeout_s = ctx.stage_timeout_s
        error: CudaCallError | None = None
        # No receiver round trips between one rank's call and the next: they would widen a coordinated cut.
        with ctx.timeline.stage(stage, ctx.cut_index, marks=False) as extra:
            extra["detail"] = f"rank {rank} pid {pid}"
            try:
                note = _bounded(fn, ctx.stage_timeout_s)
                if note:
                    extra["detail"] += f": {note}"
            except CudaCallError as exc:
                error = exc
                extra["detail"] += f": {exc}"
            except _StillRunning:
                extra["detail"] += ": hung"
                self.hung.add(pid)
                self.actions.append(f"leave pid {pid} inside its hung {stage} call (nothing more asked of the driver for it)")
                raise StageFailed(stage, hung_reason(f"the {stage} call for pid {pid}", ctx.stage_timeout_s)) from None
        if error is not None:
            states = self.bring_back()
            raise classify(stage, error, states)

    def bring_back(self, pids: Sequence[int] | None = None) -> list[str]:
        """Best effort: restore every CHECKPOINTED process and unlock every LOCKED one; return the states after.

        Never raises and never waits for long: a process that no longer exists, or one a driver call hung
        for, is skipped, and each call here is bounded like a stage's.
        """
        if pids is None:
            pids = self.procs.pids if self.procs else []
        states = []
        for pid in pids:
            if pid in self.hung:
                continue
            state = self._state(pid)
            if state == "checkpointed":
                self._quiet(lambda: self.driver.restore(pid))
                state = self._state(pid)
                self.actions.append(f"restore pid {pid}, which the tool left CHECKPOINTED (now {state or 'gone'})")
            if state == "locked":
                self._quiet(lambda: self.driver.unlock(pid))
                state = self._state(pid)
                self.actions.append(f"unlock pid {pid}, which the tool left LOCKED (now {state or 'gone'})")
            if state is not None:
                states.append(state)
        return states

    def _state(self, pid: int) -> str | None:
        if not os.path.exists(f"/proc/{pid}") or pid in self.hung:
            return None
        try:
            return _bounded(lambda: self.driver.get_state(pid), self.timeout_s)
        except CudaCallError:
            return None
        except _StillRunning:
            self.hung.add(pid)
            return None

    def _quiet(self, fn: Callable[[], None]) -> None:
        try:
            _bounded(fn, self.timeout_s)
        except (CudaCallError, _StillRunning):
            pass


# -- the in-place backend ----------------------------------------------------


class CudaCheckpointer:
    """The ``cuda`` backend: lock → checkpoint → (GPU released) → restore → unlock, in place."""

    name = "cuda"
    capabilities = Capabilities(
        faults=frozenset({"none"}),  # no CPU image: after a kill there is nothing to restore
        drives_cuda=True,
        stages=CUDA_STAGES,
        covers=frozenset({"cuda"}),
    )

    def __init__(self, driver: DriverApi | None = None):
        self._driver = driver
        self._stages: CudaStages | None = None

    @property
    def stages(self) -> CudaStages:
        """The stage runner over this backend's driver (created on first use)."""
        if self._stages is None:
            self._stages = CudaStages(self._driver if self._driver is not None else self.make_driver())
        return self._stages

    def make_driver(self) -> DriverApi:
        """The driver interface this backend uses (the cuda-python bindings)."""
        return CudaDriver()

    def unavailable_reason(self) -> str | None:
        """Why the driver checkpoint API is unusable here (with the fix), or None."""
        if self._driver is not None:
            return None
        return bindings_unavailable_reason()

    def cuda_cut(self, target: Child, ctx: CutContext) -> CudaProcs:
        """Discover, check the remap is possible, then lock and checkpoint every CUDA process (device work that
        never ends was drained before, by the workload's adapter at ``prepare``); returns the processes cut."""
        procs = self.stages.discover(target.pid, ctx)
        procs.pairs = self.stages.remap_pairs(procs, ctx.cut.restore_target)  # refuse an impossible ask before locking
        self.stages.cut(procs, ctx)
        return procs

    def checkpoint(self, target: Child, ctx: CutContext) -> None:
        """Suspend/resume in place: ``cuda_lock``, ``cuda_checkpoint`` (the GPU is released),
        then ``cuda_restore`` (onto another GPU when asked) and ``cuda_unlock``.

        The resume happens here, before the pipeline releases a parked
        workload: a workload that makes a CUDA call while CHECKPOINTED was
        seen to die (driver 580), so it must not be let go in between.
        """
        self.cuda_cut(target, ctx)
        self.resume_cuda(target.pid, ctx)

    def resume_cuda(self, pid: int, ctx: CutContext) -> None:
        """Run ``cuda_restore`` (+ remap) and ``cuda_unlock`` of the cut's processes."""
        procs = self.stages.procs
        if procs is None:
            raise HarnessFault("cuda_restore", "no checkpointed processes to resume")
        self.restore_cuda(procs.pids, ctx, procs.pairs, resumed_pid=pid)

    def resume_in_place(self, target: Child, ctx: CutContext) -> None:
        """Nothing left to undo: :meth:`checkpoint` already restored and unlocked."""

    def restore_cuda(self, pids: Sequence[int], ctx: CutContext, pairs: dict[int, list[list[tuple[str, str]]]],
                     *, resumed_pid: int) -> None:
        """Restore + unlock ``pids``; a remap the driver rejects is retried in place and reported as refused."""
        try:
            self.stages.resume(pids, ctx, pairs=pairs)
            if pairs:
                # Where the device memory is now, as NVML sees it: the move itself, checked.
                after = gpu_mem.process_gpu_memory(pids)
                ctx.facts["gpus_after_remap"] = " ".join(f"pid {p}:{','.join(sorted(after.get(p, {}))) or '?'}" for p in pids)
                ctx.timeline.event("remap_check", ctx.cut_index, ctx.facts["gpus_after_remap"])
        except StageFailed as exc:
            if not pairs or exc.stage != "cuda_restore" or not all(s == "running" for s in self.stages.bring_back(pids)):
                raise
            # bring_back restored without the remap: the workload runs on its own GPU.
            raise RemapRefused(f"GPU remap {_describe_pairs(pairs)} rejected: {exc.reason}", resumed_pid) from exc

    def restore(self, ctx: CutContext) -> int:
        """Not reachable: this backend only supports fault ``none`` (see ``faults``)."""
        raise HarnessFault("cuda_restore", "the cuda backend has no CPU image; use cuda+criu for kill/leave_running")

    def cleanup(self, ctx: CutContext) -> None:
        """Leave no process LOCKED or CHECKPOINTED; never raises.

        What the harness had to do for that is the cut's ``harness_action`` fact.
        """
        try:
            if self._stages is not None:
                self._stages.bring_back()
                self._stages.procs = None
                action = self._stages.take_actions()
                if action:
                    ctx.facts["harness_action"] = action
        except Exception:
            pass


class _StillRunning(Exception):
    """A call did not return within its time limit."""


def _bounded(fn: Callable[[], Any], timeout_s: float) -> Any:
    """``fn()`` on a thread of its own, waited for ``timeout_s``; :class:`_StillRunning` when it is not back.

    A driver call that never returns (a restore stuck in the driver) would otherwise stop the
    trial, and the run, for good; the thread is left to the driver (a daemon: it ends with the process).
    """
    box: dict[str, Any] = {}
    owner = threading.get_ident()

    def call() -> None:
        try:
            # The call's CPU (and any tool it runs) is the calling trial's: credited to its thread's stage.
            with helper_thread(owner):
                box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread as it is
            box["error"] = exc

    worker = threading.Thread(target=call, name="cutbench-driver-call", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise _StillRunning()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _describe_pairs(pairs: dict[int, list[list[tuple[str, str]]]]) -> str:
    return "; ".join(f"pid {pid}: " + ", ".join(f"{o}->{n}" for o, n in cands[-1]) for pid, cands in pairs.items())

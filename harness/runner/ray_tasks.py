"""What runs in a Ray run's tasks, and the driver's side of them (:mod:`~cutbench.harness.runner.ray_executor`
connects the cluster and places the tasks).

:class:`RayTrials` keeps at most ``window`` trials in flight as Ray tasks, in plan order, and cancels and
waits for them on Ctrl-C; :func:`run_task` is the task itself (one trial in a fresh process of its own,
``trial_worker``, with the GPUs Ray gave it); :func:`decode` reads its answer back.
"""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.procs import package_env

if TYPE_CHECKING:
    from cutbench.harness.model.trial import TrialResult, TrialSpec
    from cutbench.harness.runner.shared import ReceiverWatch

WORKER_MODULE = "cutbench.harness.runner.trial_worker"
# After Ctrl-C: how long the driver waits for the trials in flight to clean up before it leaves them to Ray.
CANCEL_GRACE_S = 60.0
POLL_S = 0.2


def gpu_ids(visible: str | None, count: int) -> list[str]:
    """The GPUs a node offers, as Ray names them: the entries of ``CUDA_VISIBLE_DEVICES`` when it is set
    (``visible``), else ``0 .. count-1``."""
    if visible is None:
        return [str(i) for i in range(count)]
    return [v.strip() for v in visible.split(",") if v.strip()]


def trial_visible_devices(gpus: list[str], assigned: list[str], original: str | None) -> str | None:
    """Return ``CUDA_VISIBLE_DEVICES`` for a trial's process (None: leave it unset).

    ``gpus`` are every GPU of the node, ``assigned`` those Ray gave the task,
    ``original`` the driver's own value. A task without a GPU gets the
    driver's value back; a GPU task sees every GPU, its assigned ones first
    (its default device), the others in their order.
    """
    if not assigned:
        return original
    rest = [g for g in gpus if g not in assigned]
    return ",".join([*assigned, *rest])


@dataclass
class RayTrials:
    """The trials of one run as Ray tasks, taken in plan order, at most ``window`` in flight.

    :meth:`run` calls ``on_result(plan position, result)`` as each finishes.
    On Ctrl-C (or any error) it cancels what is queued and interrupts what
    runs (a KeyboardInterrupt in the task, which passes SIGINT on to the
    trial's process: it cleans up as a serial trial does and gives no
    result), waits for those to end, and re-raises; trials that finished
    meanwhile are in :attr:`late`, as with worker threads.
    """

    ray: Any
    submit: "Callable[[int, int], Any]"  # (plan position, attempt) -> the task's reference
    specs: "list[TrialSpec]"
    window: int
    late: "dict[int, TrialResult]" = field(default_factory=dict)
    watch: "ReceiverWatch | None" = None  # the driver's receiver: a trial it died during runs again

    def run(self, on_result: "Callable[[int, TrialResult], None]") -> None:
        """Run every spec; raise what a trial's process could not get past (this host cannot run the trial), and
        the watch's ``ReceiverLost`` when the run's receiver cannot come back."""
        from cutbench.harness.runner.shared import RECEIVER_RERUNS  # here: a Ray task that imports this module does not need it

        todo = deque(range(len(self.specs)))
        pending: dict[Any, int] = {}
        attempts: dict[Any, tuple[int, int]] = {}  # reference -> (attempt, the receiver's deaths when submitted)
        try:
            while todo or pending:
                while todo and len(pending) < self.window:
                    index = todo.popleft()
                    ref = self.submit(index, 0)
                    pending[ref], attempts[ref] = index, (0, self._deaths())
                ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=POLL_S)  # Ctrl-C is seen here
                for ref in ready:
                    index, (attempt, before) = pending.pop(ref), attempts.pop(ref)
                    result = self._result(ref, index)
                    if result is not None and self.watch is not None and self._deaths() != before:
                        if attempt < RECEIVER_RERUNS:  # the receiver died while it ran: its verdict is not judged
                            self.watch.rerun(self.specs[index].trial_id)
                            again = self.submit(index, attempt + 1)
                            pending[again], attempts[again] = index, (attempt + 1, self._deaths())
                            continue
                        result = self.watch.spoiled(result)
                    if result is not None:
                        on_result(index, result)
                self._deaths()  # a receiver gone for good stops the run here, between results
        except BaseException:
            self._cancel(pending)
            raise

    def _deaths(self) -> int:
        """How often the run's receiver died so far (0 without a watch); raises ``ReceiverLost`` when it is gone."""
        return self.watch.check() if self.watch is not None else 0

    def _result(self, ref: Any, index: int) -> "TrialResult | None":
        try:
            payload = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            raise RuntimeError(f"Ray lost trial {self.specs[index].trial_id}: {type(exc).__name__}: {exc}") from None
        return decode(payload, self.specs[index].trial_id)

    def _cancel(self, pending: dict[Any, int]) -> None:
        """Cancel ``pending`` and wait (at most :data:`CANCEL_GRACE_S`) until their processes have cleaned up."""
        # Only what has not finished is cancelled: a cancel that crosses a task's reply has been seen to
        # abort Ray's driver (a failed check in its TaskManager::CompletePendingTask), so the finished ones are
        # collected first, and the window for that crossing is the time between this wait and the cancels.
        try:
            done, _ = self.ray.wait(list(pending), num_returns=len(pending), timeout=0) if pending else ([], [])
        except KeyboardInterrupt:
            done = []
        finished = set(done)
        for ref in pending:
            if ref not in finished:
                self.ray.cancel(ref)  # queued: dropped; running: KeyboardInterrupt in the task
        deadline = time.monotonic() + CANCEL_GRACE_S
        while pending and time.monotonic() < deadline:
            try:
                ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            except KeyboardInterrupt:
                continue  # pressed again: the trials are cleaning up; keep waiting, as worker threads do
            for ref in ready:
                index = pending.pop(ref)
                try:
                    result = decode(self.ray.get(ref), self.specs[index].trial_id)
                except (Exception, KeyboardInterrupt):
                    continue  # cancelled before it ran, or interrupted: no verdict
                if result is not None:
                    self.late[index] = result


def decode(payload: Any, trial_id: str) -> "TrialResult | None":
    """The result a trial's process wrote (None: it was interrupted); raise the error it reported.

    ``Unavailable`` and ``InvalidArgument`` come back as themselves (this
    host cannot run the trial: the CLI's exit 254); anything else as a
    RuntimeError with the worker's traceback.
    """
    data = pickle.loads(payload) if isinstance(payload, bytes) else payload
    if "result" in data:
        return data["result"]
    if data.get("interrupted") or data.get("checked"):
        return None
    name, message = data["error"]
    kind = {"Unavailable": Unavailable, "InvalidArgument": InvalidArgument}.get(name)
    if kind is not None:
        raise kind(message)
    raise RuntimeError(f"trial {trial_id}: the trial's process failed: {name}: {message}")


def run_task(request: dict[str, Any], node_gpus: dict[str, int], driver_node: str, visible: str | None) -> bytes:
    """The Ray task: run one trial in a fresh child process (``trial_worker``); return what it wrote, pickled.

    Runs in a Ray worker. ``node_gpus`` are the GPU counts of the nodes
    that run trials,
    ``driver_node`` the driver's node and ``visible`` its
    ``CUDA_VISIBLE_DEVICES``, which names the GPUs of that node only (see
    :func:`trial_visible_devices`). A KeyboardInterrupt (``ray.cancel``) is
    passed on to the child as SIGINT, and the task waits for the child's
    cleanup.
    """
    import ray

    env = package_env()  # the child must import this very cutbench, whatever the Ray worker's cwd and path are
    node = ray.get_runtime_context().get_node_id()
    request = {**request, "node": node[:12] if len(node_gpus) > 1 else None}
    if node != driver_node:
        request["workdir"] = None  # the driver's work directory is a path on its machine
    original = visible if node == driver_node else None
    gpus = gpu_ids(original, int(node_gpus.get(node, 0)))
    devices = trial_visible_devices(gpus, [str(g) for g in ray.get_gpu_ids()], original)
    if devices is None:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return run_worker(request, env)


def run_worker(request: dict[str, Any], env: dict[str, str] | None = None) -> bytes:
    """Run ``request`` in a ``trial_worker`` child process; return the pickled payload it wrote.

    A child that wrote nothing (it was killed) yields an error payload with
    the tail of its output.
    """
    import json

    with tempfile.TemporaryDirectory(prefix="cutbench-trial-") as tmp:
        req, out, log_path = Path(tmp) / "request.json", Path(tmp) / "result.pickle", Path(tmp) / "worker.log"
        req.write_text(json.dumps(request))
        with open(log_path, "wb") as log:
            # Its own session: a terminal's Ctrl-C reaches the driver, which cancels; exactly one SIGINT comes here.
            proc = subprocess.Popen([sys.executable, "-m", WORKER_MODULE, str(req), str(out)], cwd=tmp, env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
            interrupted = False
            while True:
                try:
                    # Polled, not waited for: Ray's cancel is an exception raised between bytecodes.
                    if proc.poll() is not None:
                        break
                    time.sleep(0.05)
                except KeyboardInterrupt:
                    if not interrupted:
                        interrupted = True
                        proc.send_signal(signal.SIGINT)
        if out.exists():
            return out.read_bytes()
        tail = log_path.read_bytes()[-2000:].decode(errors="replace")
        if interrupted:
            return pickle.dumps({"interrupted": True})
        return pickle.dumps({"error": ("RuntimeError", f"the trial worker exited {proc.returncode} without a result:\n{tail}")})

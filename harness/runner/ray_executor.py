"""Trials as Ray tasks: ``run.executor = "ray"``, ``cutbench run --executor ray [--ray-address ADDR]``.

The driver (the ``cutbench run`` process) builds the plans, runs the run's
one receiver and alone writes the run directory, as with worker threads;
each trial is a Ray task that starts a fresh child process,
``python -m cutbench.harness.runner.trial_worker`` (see there why a Ray
worker cannot run a trial itself). Results come back as they finish
(``ray.wait``) and the runner writes each as it comes.

Resources: one CPU per trial, or on a GPU host ``1 / run.trials_per_gpu`` of
a GPU (Ray packs at most ``trials_per_gpu`` trials on one GPU). Ray hides the
other GPUs from a GPU task (``CUDA_VISIBLE_DEVICES``), but a CUDA restore's
GPU pair list must name every GPU the process sees, and the harness and the
workload must see the same ones: the trial's process sees every GPU the
driver saw (its ``CUDA_VISIBLE_DEVICES``, recorded before Ray starts), the
one Ray assigned first, so the workload's default device is that GPU.

Without an address ``ray.init()`` starts a local Ray (or joins the one
``RAY_ADDRESS`` names), and the run stops it again; with one it connects and
only disconnects.

Where trials run: on a Ray of one node, on that node, and the receiver
listens on its loopback as in any run. On a cluster of several nodes
(:attr:`RayCluster.spread`), on every node that has a CPU to give (Ray's
``SPREAD`` strategy): the run's receiver then listens on the driver node's
address (Ray's own, which every node reaches) and asks every client, the
trial's process and its workload alike, for a secret made for the run;
each trial records the node that ran it (fact ``ray_node``), and gets no
work directory of the driver's on another node. Each node that can hold a
trial is checked once per backend before the trials start (root, the
backend, PID namespaces), within :data:`CHECK_TIMEOUT_S`:
a node that cannot run them stops the run with its reason.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
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

INSTALL = "pip install 'cutbench[ray]' (in a checkout: .venv/bin/pip install -e '.[ray]')"
WORKER_MODULE = "cutbench.harness.runner.trial_worker"
# After Ctrl-C: how long the driver waits for the trials in flight to clean up before it leaves them to Ray.
CANCEL_GRACE_S = 60.0
POLL_S = 0.2
CHECK_TIMEOUT_S = 120.0  # one node's check: a fresh process, the backend's probes, a PID namespace
RESOURCE_UNITS = 10_000  # Ray counts a resource in 1/10000 units


def import_ray() -> Any:
    """The ``ray`` module; raise :class:`Unavailable` with the install command when Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise Unavailable(f"run.executor = \"ray\" needs Ray, an optional extra: {INSTALL}; "
                          "or run with --executor threads") from None
    return ray


def gpu_ids(visible: str | None, count: int) -> list[str]:
    """The GPUs a node offers, as Ray names them: the entries of ``CUDA_VISIBLE_DEVICES`` when it is set
    (``visible``), else ``0 .. count-1``."""
    if visible is None:
        return [str(i) for i in range(count)]
    return [v.strip() for v in visible.split(",") if v.strip()]


def trial_visible_devices(gpus: list[str], assigned: list[str], original: str | None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a trial's process (None: leave it unset).

    ``gpus`` are every GPU of the node, ``assigned`` those Ray gave the task,
    ``original`` the driver's own value. A task without a GPU gets the
    driver's value back; a GPU task sees every GPU, its assigned ones first
    (its default device), the others in their order.
    """
    if not assigned:
        return original
    rest = [g for g in gpus if g not in assigned]
    return ",".join([*assigned, *rest])


def gpu_share(trials_per_gpu: int) -> float:
    """The fraction of a GPU one trial asks Ray for: 1/``trials_per_gpu`` rounded down to Ray's resource
    unit (1/10000), so that ``trials_per_gpu`` trials fit on one GPU and one more never does (up to 99)."""
    return math.floor(RESOURCE_UNITS / trials_per_gpu) / RESOURCE_UNITS


@dataclass
class RayCluster:
    """The Ray this run uses: whether the run started it, and what its trials may use (the driver's node, or
    every node of a cluster of several)."""

    ray: Any
    started: bool  # this run called ray.init (and shuts Ray down at the end)
    address: str  # what was asked for ("" for a local Ray)
    node_id: str  # the driver's node
    cpus: float  # what the trials may use: the driver's node, or every node's when spread
    gpus: float
    nodes: int
    visible_devices: str | None  # the driver's CUDA_VISIBLE_DEVICES before Ray ran
    startup_s: float
    node_ip: str = "127.0.0.1"  # the driver node's address, as Ray reaches it
    # The nodes that may run trials (every alive one of a cluster, else the driver's), each with its Ray resources.
    node_resources: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def spread(self) -> bool:
        """Trials may run on other machines than the driver's: the cluster has more than one node."""
        return self.nodes > 1

    @classmethod
    def connect(cls, address: str = "") -> "RayCluster":
        """Start a local Ray (``address`` empty) or connect to ``address``; return the :class:`RayCluster`.

        Raises :class:`Unavailable` without Ray, when Ray cannot start or
        connect, or when no node that may run trials offers a CPU.
        """
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        t0 = time.monotonic()
        ray = import_ray()
        started = not ray.is_initialized()
        if started:
            # ray.init replaces SIGTERM's handler with sys.exit; the CLI's (clean up, exit 143) must stay.
            main = threading.current_thread() is threading.main_thread()
            sigterm = signal.getsignal(signal.SIGTERM) if main else None
            try:
                ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                         logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = f"connect to Ray at {address!r}" if address else "start a local Ray"
                raise Unavailable(f"run.executor = \"ray\": cannot {where}: {exc}") from None
            finally:
                if main and sigterm is not None:
                    signal.signal(signal.SIGTERM, sigterm)
        node_id = ray.get_runtime_context().get_node_id()
        alive = [n for n in ray.nodes() if n.get("Alive")]
        # One node: the trials run on the driver's. Several: on any, so count what they all offer.
        used = {n["NodeID"]: n.get("Resources", {}) for n in alive if len(alive) > 1 or n["NodeID"] == node_id}
        cpus = sum(float(r.get("CPU", 0)) for r in used.values())
        gpus = sum(float(r.get("GPU", 0)) for r in used.values())
        cluster = cls(ray, started, address, node_id, cpus, gpus, len(alive), visible, time.monotonic() - t0,
                      node_ip=ray.util.get_node_ip_address(), node_resources=used)
        if cluster.cpus < 1:
            cluster.close()
            where = "no node of the cluster offers" if cluster.spread else f"the driver's Ray node ({node_id[:12]}) offers"
            raise Unavailable(f"run.executor = \"ray\": {where} no CPU for a trial: start a node with --num-cpus N, "
                              "or run cutbench on a node that has CPUs")
        return cluster

    def receiver_exposure(self) -> tuple[str, str | None]:
        """Where the run's receiver listens and the secret its clients present: the driver's loopback and none on
        one node; the driver node's address and a fresh secret when trials may run on other machines."""
        if not self.spread:
            return "127.0.0.1:0", None
        import secrets

        return f"{self.node_ip}:0", secrets.token_hex(16)

    def capacity(self, trials_per_gpu: int) -> int:
        """How many trials the nodes that run them hold at once: GPUs × ``trials_per_gpu``, or their CPUs."""
        if self.gpus >= 1:
            return max(1, int(self.gpus) * trials_per_gpu)
        return max(1, int(self.cpus))

    def task_resources(self, trials_per_gpu: int) -> dict[str, float]:
        """A trial task's Ray resources: one CPU, and on a GPU host 1/``trials_per_gpu`` of a GPU."""
        if self.gpus >= 1:
            return {"num_cpus": 1, "num_gpus": gpu_share(trials_per_gpu)}
        return {"num_cpus": 1}

    def describe(self, trials_per_gpu: int) -> dict[str, Any]:
        """What ``run.toml`` records of this Ray (the ``ray`` table)."""
        return {"address": self.address or "local", "started_here": self.started, "nodes": self.nodes,
                "spread": self.spread, "node_id": self.node_id, "cpus": self.cpus, "gpus": self.gpus,
                "task_resources": self.task_resources(trials_per_gpu), "startup_s": round(self.startup_s, 3),
                "cuda_visible_devices": self.visible_devices}

    def close(self) -> None:
        """Shut Ray down when this run started it (its raylet and GCS stop); otherwise leave it as found."""
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()

    def trials(self, specs: "list[TrialSpec]", window: int, *, run_id: str, receiver: str, store: str,
               workdir: str | Path | None, trials_per_gpu: int, token: str | None = None,
               recordings: dict[str, Any] | None = None,
               supports: dict[str, Any] | None = None) -> "RayTrials":
        """A pool running ``specs`` as Ray tasks, at most ``window`` at once (see :class:`RayTrials`), once every
        node that may run them passed :meth:`check_nodes`. ``token``: the receiver's secret (a spread run);
        ``recordings``: the run's recorded references by key, sent along to the trials they judge;
        ``supports``: per backend, what the run's support matrix says (the certificates' features)."""
        from cutbench.workloads import api as workload_api

        base = {"run_id": run_id, "receiver": receiver, "token": token, "store": store,
                "workdir": str(workdir) if workdir else None, "pid_namespace": window > 1, "node": None}

        def request(spec: "TrialSpec") -> dict[str, Any]:
            cls = workload_api.load(spec.workload)
            support = (supports or {}).get(spec.backend)
            extra = {"support": {spec.backend: support}} if support and workload_api.declared_features(cls) else {}  # any params
            if not workload_api.records_reference(cls):
                return {**base, "spec": spec.to_dict(), **extra}
            key = workload_api.reference_key(cls.name, spec.params, workload_api.resolve_array(cls, spec.array))
            known = (recordings or {}).get(key)
            return {**base, "spec": spec.to_dict(), **extra, **({"references": {key: known.to_dict()}} if known else {})}

        requests = [request(s) for s in specs]
        options = {**self.task_resources(trials_per_gpu), "max_retries": 0,  # a retried trial would publish twice
                   "scheduling_strategy": self._placement()}
        self.check_nodes(requests, options)
        task = self.ray.remote(run_task).options(**options)
        gpus = self.node_gpus()
        return RayTrials(self.ray, lambda i, attempt: task.remote({**requests[i], "attempt": attempt}, gpus, self.node_id,
                                                                  self.visible_devices), specs, window)

    def node_gpus(self) -> dict[str, int]:
        """The GPUs of each node that may run trials, by node id (what a task needs to see its node's GPUs)."""
        return {node: int(r.get("GPU", 0)) for node, r in self.node_resources.items()}

    def _placement(self, node_id: str | None = None) -> Any:
        """The scheduling strategy of a task: pinned to ``node_id`` (default: the driver's, on one node), or
        Ray's SPREAD over the cluster's nodes."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if node_id is None and self.spread:
            return "SPREAD"
        return NodeAffinitySchedulingStrategy(node_id=node_id or self.node_id, soft=False)

    def check_nodes(self, requests: list[dict[str, Any]], options: dict[str, Any]) -> None:
        """Check every node that may run trials (one that has the CPU and GPU share a trial asks for), once per
        backend of ``requests``: root, the backend's tools, a PID namespace where trials run side by side.
        Raise :class:`Unavailable` (or :class:`InvalidArgument`) with the first failing node's reason, or when
        no node can hold a trial or a check does not finish within :data:`CHECK_TIMEOUT_S`."""
        cpu, gpu = options.get("num_cpus", 1), options.get("num_gpus", 0)
        nodes = [n for n, r in self.node_resources.items() if r.get("CPU", 0) >= cpu and r.get("GPU", 0) >= gpu]
        if not nodes:
            where = "no node of the cluster has" if self.spread else "the driver's node has not"
            raise Unavailable(f"run.executor = \"ray\": {where} what a trial asks for ({cpu} CPU"
                              + (f", {gpu:g} of a GPU" if gpu else "") + "): start a node that does")
        probes = list({r["spec"]["backend"]: {**r, "check_only": True, "token": None} for r in requests}.values())
        probe, gpus = self.ray.remote(run_task), self.node_gpus()
        refs = {probe.options(**{**options, "scheduling_strategy": self._placement(node)}).remote(
                    req, gpus, self.node_id, self.visible_devices): node for node in nodes for req in probes}
        try:
            for ref, node in refs.items():
                try:
                    payload = self.ray.get(ref, timeout=CHECK_TIMEOUT_S)
                except self.ray.exceptions.GetTimeoutError:
                    raise Unavailable(f"run.executor = \"ray\": the check of node {node[:12]} did not finish within "
                                      f"{CHECK_TIMEOUT_S:g}s (does it hold a trial's resources? is cutbench installed "
                                      "there?)") from None
                except self.ray.exceptions.RayError as exc:
                    raise Unavailable(f"run.executor = \"ray\": the check of node {node[:12]} failed: "
                                      f"{type(exc).__name__}: {exc}") from None
                decode(payload, f"(check of node {node[:12]})")
        except BaseException:
            for ref in refs:
                self.ray.cancel(ref)
            raise


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

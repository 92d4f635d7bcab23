"""Trials as Ray tasks: ``run.executor = "ray"``, ``cutbench run --executor ray [--ray-address ADDR]``.

The driver (the ``cutbench run`` process) builds the plans, runs the run's
one receiver and alone writes the run directory, as with worker threads;
each trial is a Ray task that starts a fresh child process,
``python -m cutbench.harness.runner.trial_worker`` (see there why a Ray
worker cannot run a trial itself). Results come back as they finish
(``ray.wait``) and the runner writes each as it comes. This module connects
the cluster and places the tasks (:class:`RayCluster`); the tasks and their
window are :mod:`~cutbench.harness.runner.ray_tasks`'s.

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
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cutbench.errors import Unavailable
from cutbench.harness.runner.ray_tasks import RayTrials, decode, run_task

if TYPE_CHECKING:
    from cutbench.harness.model.trial import TrialSpec

INSTALL = "pip install 'cutbench[ray]' (in a checkout: .venv/bin/pip install -e '.[ray]')"
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
        from cutbench.harness.runner.trial_worker import requests_for

        base = {"run_id": run_id, "receiver": receiver, "token": token, "store": store,
                "workdir": str(workdir) if workdir else None, "pid_namespace": window > 1, "node": None}
        requests = requests_for(specs, base, recordings, supports)
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

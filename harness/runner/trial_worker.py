"""One trial in a process of its own: ``python -m cutbench.harness.runner.trial_worker REQUEST.json RESULT.pickle``.

The Ray executor (:mod:`cutbench.harness.runner.ray_executor`) runs each
trial through this entry point, in a fresh child of the Ray task, because a
Ray worker is neither a place CRIU's restores can come back to nor the run's
session: a restored workload is re-parented to the nearest child subreaper,
so every trial needs a subreaper of its own that waits for nothing else
(this process), and a long-lived Ray worker must not collect other tasks'
orphans.

``REQUEST.json`` holds the trial's spec and what it needs of the run: the run
id, the address of the run's one receiver (the driver's), a work directory
and whether the workload tree starts in a PID namespace of its own; ``attempt``
numbers a trial the driver runs again because its receiver died meanwhile
(the receiver key is that attempt's). The
process writes ``RESULT.pickle`` once, by rename: ``{"result": TrialResult}``,
``{"interrupted": True}`` after SIGINT or SIGTERM (the trial cleaned up as a
serial trial does on Ctrl-C), or ``{"error": (type name, message)}`` when it
could not run the trial. The exit status is 0, 130 and 1 respectively.

A request with ``check_only`` runs no trial: it checks that this host can run
the spec's trials (root, the backend, a PID namespace; :func:`check_host`),
``{"checked": True}`` or the error. The Ray executor sends one per node and
backend before the trials, so a trial itself checks nothing.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from cutbench import interrupts
from cutbench.errors import EXIT_INTERRUPTED, CutbenchError, InvalidArgument, Unavailable
from cutbench.files import atomic_write
from cutbench.harness.nemesis import Backends
from cutbench.harness.model.trial import TrialResult, TrialSpec
from cutbench.harness.runner.session import Session
from cutbench.procs import become_subreaper, kill_namespace_inits, pid_namespace_error
from cutbench.workloads import api as workload_api

PR_SET_PDEATHSIG = 1
REQUEST_KEYS = frozenset({"spec", "run_id", "receiver", "token", "store", "workdir", "pid_namespace", "node"})
OPTIONAL_KEYS = frozenset({"attempt", "check_only", "references", "support"})


class _Receiver:
    """The run's receiver as a worker sees it: an address it does not own (the driver stops it)."""

    def __init__(self, address: str):
        self.address = address

    def stop(self) -> None:
        """Nothing to stop: the receiver is the driver's."""


class WorkerSession(Session):
    """A :class:`Session` for one trial of a run whose receiver runs elsewhere (the driver's).

    It becomes the child subreaper and owns a work directory as a run's
    session does, but starts no receiver: it talks to the one at
    ``receiver``, and reads the trial's effects through it (the store may be
    a file on another host).
    """

    def __init__(self, run_id: str, receiver: str, store: str = "sqlite", workdir: str | Path | None = None, *,
                 pid_namespace: bool = False, token: str | None = None, backends: Backends | None = None):
        super().__init__(run_id, store, workdir, pid_namespace=pid_namespace, token=token, backends=backends)
        self._receiver_address = receiver

    workdir_tag = "worker-"

    def _open_receiver(self) -> "_Receiver":
        """The driver's receiver, which this session only talks to."""
        self.store_url = self.store_spec
        return _Receiver(self._receiver_address)

    def _watch_receiver(self) -> None:
        """None: the receiver is the driver's, which the driver's session watches."""
        return None

    def effects(self, receiver_trial: str) -> Any:
        """The receiver's stored rows for one trial, exported by the receiver from its store."""
        return self.control_client.export(trial=receiver_trial)


def needs_root(backend: str, backends: Backends | None = None) -> bool:
    """Whether ``backend``'s stages need root: it drives CRIU or the CUDA driver's checkpoint calls."""
    caps = (backends or Backends()).capabilities(backend)
    return caps.drives_cuda or "criu_dump" in caps.stages


def check_host(spec: TrialSpec, *, pid_namespace: bool, euid: int | None = None,
               backends: Backends | None = None) -> None:
    """Raise :class:`Unavailable` when this host cannot run ``spec``'s trial (root, the backend, a PID namespace)."""
    backends = backends or Backends()
    host = socket.gethostname()
    euid = os.geteuid() if euid is None else euid
    if euid != 0 and needs_root(spec.backend, backends):
        raise Unavailable(f"trial worker on {host} runs as uid {euid}, and backend {spec.backend!r} needs root "
                          "(CRIU and the CUDA checkpoint calls do): start the Ray node as root "
                          "(sudo ray start ...), or run with --executor threads as root")
    reason = backends.new(spec.backend).unavailable_reason()
    if reason:
        raise Unavailable(f"backend {spec.backend!r} cannot run on {host} (a Ray worker node): {reason}")
    if pid_namespace and backends.declares(spec.backend, "pid_namespace"):
        error = pid_namespace_error()
        if error:
            raise Unavailable(f"trial worker on {host}: trials that run at once each need a PID namespace of their "
                              f"own (CRIU restores the pids a tree had), and none can be made here ({error}): start "
                              "the Ray node as root, or run with --jobs 1")


def requests_for(specs: list[TrialSpec], base: dict[str, Any], recordings: dict[str, Any] | None = None,
                 supports: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One request per spec for a trial's process elsewhere (a Ray task, a Slurm array task): ``base`` (the run's
    keys: run id, receiver, token, store, work directory, PID namespace, node) with the spec, the run's recorded
    reference the trial is judged by (``recordings``, by key) and its backend's support matrix answers
    (``supports``, by backend) where the workload declares features."""
    out = []
    for spec in specs:
        cls = spec.workload_class()
        support = (supports or {}).get(spec.backend)
        extra = {"support": {spec.backend: support}} if support and workload_api.declared_features(cls) else {}
        if workload_api.records_reference(cls):
            key = spec.reference_key()
            known = (recordings or {}).get(key)
            extra.update({"references": {key: known.to_dict()}} if known else {})
        out.append({**base, "spec": spec.to_dict(), **extra})
    return out


def read_request(path: str | Path) -> dict[str, Any]:
    """The request in ``path``, its keys checked; raise :class:`InvalidArgument` otherwise."""
    request = json.loads(Path(path).read_text())
    if not isinstance(request, dict) or not REQUEST_KEYS <= set(request) <= REQUEST_KEYS | OPTIONAL_KEYS:
        raise InvalidArgument(f"trial worker request {path}: expected the keys {', '.join(sorted(REQUEST_KEYS))} "
                              f"(and optionally {', '.join(sorted(OPTIONAL_KEYS))})")
    return request


def run_request(request: dict[str, Any]) -> TrialResult | None:
    """Run the trial of ``request`` (see the module docstring) and return its :class:`TrialResult`; with
    ``check_only``, only check that this host can run it (None, or :class:`Unavailable` saying why not)."""
    spec = TrialSpec.from_dict(request["spec"])
    become_subreaper()  # first: the namespace probe's init, like every workload, is re-parented to us
    backends = Backends()  # this process's trial: its backend resolved once, for the check and the session
    if request.get("check_only"):
        check_host(spec, pid_namespace=bool(request["pid_namespace"]), backends=backends)
        return None
    try:
        with WorkerSession(request["run_id"], request["receiver"], request["store"], request["workdir"],
                           pid_namespace=bool(request["pid_namespace"]), token=request["token"],
                           backends=backends) as session:
            # The driver recorded the ground truth of a recorded-reference workload; the verdict is judged here.
            for key, data in (request.get("references") or {}).items():
                session.references.recordings[key] = workload_api.RecordedReference.from_dict(data)
            for backend, by_fault in (request.get("support") or {}).items():  # JSON made the (cell, where) pairs lists
                session.support.known[backend] = {fault: {f: tuple(v) for f, v in cells.items()} for fault, cells in by_fault.items()}
            result = session.run_trial(spec, int(request.get("attempt", 0)))
    finally:
        if request["pid_namespace"]:
            # A tree that an interrupted restore left has no handle: it is this process's child.
            kill_namespace_inits()
    if request["node"]:
        result.record.facts["ray_node"] = request["node"]  # which machine of the cluster ran it
    return result


def _interrupt_once() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt once, so the trial cleans up; later ones wait for it."""

    handler = interrupts.first_raises(again=lambda _signum: None)  # held while the trial cleans up

    # Ray starts its processes with SIGINT blocked; the mask is inherited, and the task forwards SIGINT.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def _die_with_parent() -> None:
    """SIGTERM this process when the Ray task that started it dies (the trial then cleans up)."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the call
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    """Run one trial as the module docstring says; return the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m cutbench.harness.runner.trial_worker REQUEST.json RESULT.pickle", file=sys.stderr)
        return 2
    request_path, result_path = args
    _interrupt_once()
    _die_with_parent()
    code = 0
    try:
        result = run_request(read_request(request_path))
        payload: dict[str, Any] = {"checked": True} if result is None else {"result": result}
    except KeyboardInterrupt:
        payload, code = {"interrupted": True}, EXIT_INTERRUPTED
    except CutbenchError as exc:
        payload, code = {"error": (type(exc).__name__, str(exc))}, 1
    except Exception as exc:
        payload, code = {"error": (type(exc).__name__, f"{exc}\n{traceback.format_exc()}")}, 1
    atomic_write(result_path, pickle.dumps(payload))
    return code


if __name__ == "__main__":
    sys.exit(main())

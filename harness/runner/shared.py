"""What the trials of one run share, one concern per class; a :class:`~cutbench.harness.runner.trial.Session` holds
one of each and owns their lifetime.

- :class:`ImageDiscards`: finished cuts' image directories, removed in the background.
- :class:`ThreadResources`: each trial thread's own receiver client and backend instances.
- :class:`References`: the ground truth trials are judged by, built per parameter set and thread, or
  recorded by uninterrupted control runs.
- :class:`SupportLookup`: what the measured support matrix says of a backend on this machine.
- :class:`ReceiverWatch`: the run's receiver, started again on its store the moment it dies.

Nothing here starts a workload or writes the run directory: recording a
reference takes the session's way of observing an uncut run as a callback.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from cutbench import interrupts
from cutbench.errors import HarnessFault, ReceiverLost, Unavailable
from cutbench.harness.model import boundaries
from cutbench.harness.nemesis import Backends
from cutbench.harness.model.trial import TrialRecord, TrialResult, TrialSpec, Verdict
from cutbench.harness.nemesis.base import remove_tree
from cutbench.workloads import api as workload_api

# Runs one spec uninterrupted and returns what was observed (record and the receiver's rows), unjudged.
Observe = Callable[[TrialSpec], "tuple[TrialRecord, pd.DataFrame]"]


class ImageDiscards:
    """Removes finished cuts' image directories in the background, at most two per worker at once.

    Freeing a GiB-sized image (tmpfs pages) takes a tenth of a second or
    more (0.3–0.4 s at 16 trials at once on the H200), and nothing of the
    trial waits for it: the next cut has a directory of its own. Before it
    writes one, a worker waits for all but its latest removal
    (:meth:`settle`), so it holds at most two images at once: the one it
    writes and the one being freed. The session waits for every removal
    before it ends (:meth:`drain`): no image directory outlives the run.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[int, threading.Thread]] = []  # (worker thread, its removal)
        self._lock = threading.Lock()

    def discard(self, path: Path) -> None:
        """Start removing ``path`` in the background; returns None at once."""
        worker = threading.Thread(target=remove_tree, args=(path,), name=f"discard {path.name}")
        with self._lock:  # started under the lock: a thread in the list has always started
            try:
                worker.start()
            except RuntimeError:  # no thread to be had: remove it here and now
                remove_tree(path)
                return
            self._pending = [(o, t) for o, t in self._pending if t.is_alive()] + [(threading.get_ident(), worker)]

    def settle(self, keep: int = 1) -> None:
        """Wait until at most ``keep`` of the directories this thread discarded are still being removed (the
        latest ones), none with ``keep = 0``; returns None."""
        me = threading.get_ident()
        with self._lock:
            # In the order discarded, finished ones too: the latest ``keep`` are the newest discards, whether or not
            # their removal is done (an older removal still running while a newer one has finished is waited for).
            mine = [t for o, t in self._pending if o == me]
        for worker in mine[:max(0, len(mine) - keep)]:
            worker.join()

    def drain(self) -> None:
        """Wait until every discarded directory is gone, whichever thread discarded it; returns None."""
        with self._lock:
            pending, self._pending = self._pending, []
        for _, worker in pending:
            worker.join()


class ThreadResources:
    """Each trial thread's own receiver client and backend instances.

    Several threads may run trials of one session at once (``run.jobs``): the
    receiver client is single-threaded by design, and a backend keeps a cut's
    state on itself, so neither is shared, except a backend instance handed to
    :meth:`share` (a test's configured stand-in).
    """

    def __init__(self, backends: Backends) -> None:
        self.backends = backends  # the run's, resolved once: each thread's instances are made from it
        self._shared: dict[str, Any] = {}  # instances put here by name serve every thread as they are
        self._local = threading.local()
        self._clients: list[Any] = []  # every thread's client, closed by close()
        self._clients_lock = threading.Lock()

    def client(self, address: str, token: str | None) -> Any:
        """Return this thread's client of the receiver at ``address`` (made on first use)."""
        from cutbench.receivers.client import ReceiverClient

        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = ReceiverClient(address, token=token)
            with self._clients_lock:
                self._clients.append(client)
        return client

    def backend(self, name: str) -> Any:
        """Return this thread's (cached) backend instance for ``name``, or the shared one put there by :meth:`share`."""
        if name in self._shared:
            return self._shared[name]
        if not hasattr(self._local, "backends"):
            self._local.backends = {}
        backends = self._local.backends
        if name not in backends:
            backends[name] = self.backends.new(name)
        return backends[name]

    def share(self, name: str, instance: Any) -> None:
        """Serve every thread with ``instance`` for backend ``name``; returns None."""
        self._shared[name] = instance

    def give_up(self, reason: str) -> None:
        """Make every thread's receiver client stop waiting for the receiver: it is gone (``reason``)."""
        with self._clients_lock:
            for client in self._clients:
                client.give_up(reason)

    def close(self) -> None:
        """Close every thread's receiver client (one that fails to close is left); returns None."""
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            try:
                client.close()
            except Exception:
                pass


@dataclass
class References:
    """The ground truth a run's trials are judged by.

    A model reference (``cls.reference(params)``) is built once per parameter
    set and thread; a recorded one (``ground_truth = "recorded"``) comes from
    :meth:`record`, or from a stored run (:attr:`recordings`, by
    :func:`~cutbench.workloads.api.reference_key`).
    """

    recordings: dict[str, workload_api.RecordedReference] = field(default_factory=dict)
    # A program's artefacts compared by a callable: the first control run's copies, by reference key, kept under
    # artefacts_root (the run directory's references/, set by the run; a work directory otherwise).
    artefacts_root: Path | None = None
    artefact_dirs: dict[str, Path] = field(default_factory=dict)
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def get(self, cls: type[workload_api.Workload], params: dict[str, Any], array: str = "auto") -> Any:
        """Return ``cls.reference(params)``, built once per parameter set and thread, and kept for the run's trials.

        A reference is ground truth for its parameters alone and caches its
        answers: a sweep's trials (same parameters) ask it again and again, so
        one copy answers them instead of each trial recomputing it. One per
        thread, because a reference may advance a model as it is asked
        (``ReplayReference``) and the protocol does not ask it to be
        thread-safe.

        A workload whose ground truth is recorded gets the recording
        :meth:`record` made for ``params`` on ``array``;
        :class:`~cutbench.errors.HarnessFault` when there is none (the trial
        is ``unknown``: nothing to judge it by).
        """
        if workload_api.records_reference(cls):
            key = workload_api.reference_key(cls.name, params, workload_api.resolve_array(cls, array))
            if key not in self.recordings:
                raise HarnessFault("judge", f"no recorded reference {key} for workload {cls.name!r}: the run records "
                                            "one before its trials (Session.record_references)")
            return self.recordings[key]
        if not hasattr(self._local, "references"):
            self._local.references = {}
        references = self._local.references
        ref_key = (f"{cls.__module__}:{cls.__qualname__}", json.dumps(params, sort_keys=True, default=str))
        if ref_key not in references:
            references[ref_key] = cls.reference(params)
        return references[ref_key]

    def record(self, specs: Iterable[TrialSpec], jobs: int, observe: Observe, *, machine: dict[str, Any] | None = None,
               keep: Callable[[str, workload_api.RecordedReference], None] | None = None) -> dict[str, str]:
        """Record the ground truth of every recorded-reference workload among ``specs``; return ``{key: why not}``.

        For each distinct (workload, parameters, array backend) whose class
        declares ``ground_truth = "recorded"``, two uninterrupted runs (the
        spec without cuts, through ``observe``) are made, ``jobs`` at a time.
        Where both completed and agree op for op, the recording is kept for
        :meth:`get` and handed to ``keep(key, recording)`` (the run stores
        it); where a run failed, or the two disagree (the workload is not
        deterministic here), the reason is returned under its key and nothing
        is kept: the caller runs none of its trials, so a workload that cannot
        be judged never turns into findings. ``machine`` (the run's
        :func:`~cutbench.harness.environment.record.fingerprint`) is written
        into each recording.
        """
        todo: dict[str, TrialSpec] = {}
        for spec in specs:
            if workload_api.records_reference(spec.workload_class()):
                key = spec.reference_key()
                if key not in self.recordings:
                    todo.setdefault(key, spec)
        failures: dict[str, str] = {}
        running: set[int] = set()  # idents of the threads inside a control run (a Ctrl-C is raised in each)
        lock = threading.Lock()

        def record(key: str, spec: TrialSpec) -> None:
            with lock:
                running.add(threading.get_ident())
            try:
                kept = self._control_runs(key, spec, observe, machine)
                if isinstance(kept, str):
                    failures[key] = kept
                    return
                self.recordings[key] = kept
                if keep is not None:
                    keep(key, kept)
            finally:
                with lock:
                    running.discard(threading.get_ident())

        pool = ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo) or 1)), thread_name_prefix="cutbench-ref")
        futures = [pool.submit(record, key, spec) for key, spec in todo.items()]
        try:
            for future in futures:
                future.result()
        except BaseException:
            # Ctrl-C (or a harness error): start no more control runs, and interrupt the running ones, which
            # clean up as a trial does; wait for them, so none outlives the session's receiver.
            pool.shutdown(wait=False, cancel_futures=True)
            with lock:
                for ident in running:
                    interrupts.interrupt(ident)
            for future in futures:
                try:
                    future.result()
                except BaseException:
                    pass
            raise
        pool.shutdown()
        return failures


    def _control_runs(self, key: str, spec: TrialSpec, observe: Observe,
                      machine: dict[str, Any] | None) -> "workload_api.RecordedReference | str":
        """Two uninterrupted runs of ``spec``: the recording when both completed and agree op for op, else why
        not (one sentence naming the run and what went wrong)."""
        cls = spec.workload_class()
        array = workload_api.resolve_array(cls, spec.array)
        runs: list[workload_api.RecordedReference] = []
        for n in (1, 2):
            record, effects = observe(replace(spec, trial_id=f"ref-{key}-{n}", plan={"cuts": []}, variant=""))
            if record.status != "completed" or record.exit_code != 0:
                tail = f"; workload log: {record.log_tail[-1500:]}" if record.log_tail else ""
                return (f"its uninterrupted run {n} of 2 did not complete ({record.status}, exit "
                        f"{record.exit_code}): {record.error or 'no error given'}{tail}")
            try:
                runs.append(workload_api.RecordedReference.from_run(cls.name, spec.params, array, effects,
                                                                    record.report, machine))
            except workload_api.WorkloadError as exc:
                return f"its uninterrupted run {n} of 2 cannot be a reference: {exc}"
        differs = runs[0].first_difference(runs[1])
        if differs:
            return f"not deterministic on this machine: two uninterrupted runs differ at {differs}"
        # Their counted system calls may differ (threads interleave): said, and a cut there lands where it lands.
        runs[0].boundaries_differ = boundaries.first_difference(
            [boundaries.Boundary.from_dict(b) for b in runs[0].boundaries],
            [boundaries.Boundary.from_dict(b) for b in runs[1].boundaries])
        runs[0].runs = 2
        if key in self.artefact_dirs:
            runs[0].artefacts_dir = str(self.artefact_dirs[key])
        return runs[0]

@dataclass
class SupportLookup:
    """What the measured support matrix (``pipeline.support_matrix``) says of each backend on this machine.

    The certificates ask it about the CUDA features a workload declares. Per
    backend it answers ``{fault: {feature: (cell, where)}}`` for this
    machine's driver and CRIU; without a matrix, nothing (every declared
    feature is then unmeasured).
    """

    table: pd.DataFrame | None = None
    driver: str = ""
    criu_version: str = ""
    known: dict[str, dict[str, dict[str, tuple[str, str]]]] = field(default_factory=dict)  # by backend, once asked

    def configure(self, table: pd.DataFrame | None, env: dict[str, Any]) -> None:
        """Use ``table`` (None: no matrix) with the driver and CRIU of the run's environment record ``env``; returns None."""
        self.table = table
        self.driver = str((env.get("gpu") or {}).get("driver_version") or "")
        self.criu_version = str((env.get("criu") or {}).get("version") or "")

    def of(self, backend: str) -> dict[str, dict[str, tuple[str, str]]]:
        """Return what the matrix says of ``backend`` here: ``{fault: {feature: (cell, where)}}`` (empty without one)."""
        if backend not in self.known:
            from cutbench.harness.matrix.checker import support_for

            table = self.table
            self.known[backend] = support_for(table, backend, self.driver, self.criu_version) if table is not None else {}
        return self.known[backend]


RECEIVER_RERUNS = 2  # times a trial runs again because the run's receiver died while it ran


class ReceiverWatch:
    """Watches the run's own receiver and starts it again on the same store and address the moment it dies.

    The receiver is a durable service: what it acknowledged is in its store, so a new process on the same
    store loses nothing. A trial that was running while it died is not judged (an effect committed just before
    the death, its ack lost, comes back as a resend: under ``at_least_once`` a duplicate of the harness's
    making); the session runs it again (:attr:`generation` says whether a death fell inside a trial).
    :attr:`events` is what ``run.toml`` records under ``receiver_restarts``. When the receiver cannot come
    back, :attr:`lost` says why and :meth:`check` raises :class:`ReceiverLost`.
    """

    POLL_S = 0.05
    ATTEMPTS = 3  # starts tried before the run is stopped

    def __init__(self, handle: Any, on_lost: Callable[[str], None] = lambda reason: None):
        self.handle = handle
        self.on_lost = on_lost  # told once, with the reason, when the receiver is gone for good
        self.generation = 0  # deaths seen so far
        self.events: list[dict[str, Any]] = []
        self.lost: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cutbench-receiver-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.POLL_S):
            self.check(raise_lost=False)

    def check(self, *, raise_lost: bool = True) -> int:
        """Look now; start the receiver again if it died. Returns :attr:`generation`; raises
        :class:`ReceiverLost` (unless ``raise_lost`` is false) when it is gone for good."""
        with self._lock:
            if self.lost is None and not self._stop.is_set():
                rc = self.handle.exited()
                if rc is not None:
                    self._revive(rc)
            if self.lost is not None and raise_lost:
                raise ReceiverLost(self.lost)
            return self.generation

    def _revive(self, rc: int) -> None:
        self.generation += 1
        event: dict[str, Any] = {"at": time.time(), "exit_status": rc, "log_tail": _last_lines(self.handle.log_tail()),
                                 "store": self.handle.store_url, "trials_rerun": []}
        self.events.append(event)
        errors = []
        for _ in range(self.ATTEMPTS):
            try:
                self.handle.revive()
                event["restarted_after_s"] = round(time.time() - event["at"], 3)
                return
            except Exception as exc:  # whatever stops a start: this thread must live on to say so
                errors.append(_last_lines(self.handle.log_tail()) if isinstance(exc, Unavailable) else repr(exc))
        self.lost = (f"the run's receiver died (exit status {rc}) and could not be started again on its store "
                     f"{self.handle.store_url} ({self.ATTEMPTS} tries); its log ends:\n{errors[-1]}\n")
        event["lost"] = self.lost
        self.on_lost(self.lost)

    def spoiled(self, result: TrialResult) -> TrialResult:
        """Return ``result`` as ``unknown``: the receiver died in every attempt of its trial, so what the last one saw
        may be of the harness's making (never judged)."""
        why = f"harness: the run's receiver died during each of the {RECEIVER_RERUNS + 1} attempts of this trial"
        result.record.status, result.record.error = "unknown", why
        return replace(result, verdict=Verdict("unknown", (), why))

    def rerun(self, trial_id: str) -> None:
        """Note that trial ``trial_id`` runs again because the receiver died while it ran."""
        with self._lock:
            self.events[-1]["trials_rerun"].append(trial_id)

    def close(self) -> None:
        """Stop watching (before the session stops the receiver itself)."""
        with self._lock:
            self._stop.set()
        self._thread.join()


def _last_lines(text: str, n: int = 4) -> str:
    """The last ``n`` non-empty lines of ``text`` (a log's tail: its last words, not a whole traceback)."""
    return "\n".join([line for line in text.splitlines() if line.strip()][-n:])

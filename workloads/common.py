"""Small pieces the built-in workloads share: deterministic numbers, digests,
a replay reference, state files for the ``app`` baseline, and an input cursor
kept outside the process.

Everything numeric is unsigned 64-bit integer arithmetic, which wraps
identically on CuPy, PyTorch and NumPy, so a reference computed with NumPy on
the host reproduces a GPU run bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Protocol

from cutbench.workloads.adapters import ConsumerOffset, RequestLog
from cutbench.workloads.xp import backend_name, is_device, synchronize, to_host, word, word_dtype
from cutbench import validate
from cutbench.files import atomic_open, read_number, write_number

MASK = (1 << 64) - 1
MULT = 6364136223846793005  # odd: x -> x * MULT + c is a bijection mod 2**64
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def splitmix(*words: int) -> int:
    """A 64-bit hash of integer ``words`` (splitmix64 chained), as a Python int."""
    x = 0
    for w in words:
        x = (x + (w & MASK) * GOLDEN + GOLDEN) & MASK
        x ^= x >> 30
        x = (x * MIX1) & MASK
        x ^= x >> 27
        x = (x * MIX2) & MASK
        x ^= x >> 31
    return x


def digest(*items: Any) -> str:
    """A short hex digest of ``items`` (ints, strings, or sequences of them)."""
    text = json.dumps([list(map(int, i)) if hasattr(i, "__len__") and not isinstance(i, str) else i for i in items])
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def sums(xp: ModuleType, a: Any) -> Any:
    """Two wrapping 64-bit word sums of ``a`` computed where ``a`` lives: plain and position-weighted.

    Returns a 2-element word array on ``a``'s device (read it with
    ``xp.host_words`` on any backend); together they change when any
    element changes (the weights ``2i+1`` are odd, so no single change cancels).
    """
    u = word_dtype(xp)
    # Array API spellings (functions, ``shape``) and xp's words, so the same
    # code runs on torch's compat namespace.
    flat = xp.reshape(a, (-1,))
    weights = xp.arange(flat.shape[0], dtype=u)
    weights *= word(xp, 2)
    weights += word(xp, 1)
    weights *= flat
    return xp.stack([xp.sum(flat, dtype=u), xp.sum(weights, dtype=u)])


def host_ints(a: Any) -> list[int]:
    """Return ``a`` copied to the host as a list of Python ints (synchronises on a device)."""
    return [int(v) for v in to_host(a).reshape(-1)]


def device_domains(xp: ModuleType) -> list[str]:
    """The extra state domain an array module adds: ``["cuda"]`` on CuPy and torch, none on NumPy."""
    return ["cuda"] if is_device(xp) else []


# -- ground truth ---------------------------------------------------------------


class Model(Protocol):
    """A workload's state machine run without cut points (what the reference replays)."""

    def step(self, op: int) -> str:
        """Apply op ``op``; return the payload its effect carries."""
        ...

    def checksum(self) -> str:
        """The checksum of the current state."""
        ...


class ReplayReference:
    """Payloads and checksums of an uninterrupted run, by replaying a model on NumPy.

    ``make_model()`` returns a fresh model at op 0. The model advances only as
    far as asked and is kept, so queries cost one replay of the largest op.
    """

    def __init__(self, make_model: Callable[[], Model]):
        self._model = make_model()
        self._payloads: list[str] = [""]
        self._checksums: list[str] = [self._model.checksum()]

    def _advance(self, op: int) -> None:
        if op < 0:
            raise ValueError(f"op must be >= 0, got {op}")
        while len(self._checksums) <= op:
            n = len(self._checksums)
            self._payloads.append(self._model.step(n))
            self._checksums.append(self._model.checksum())

    def payload(self, op: int) -> str:
        """The payload effect ``op`` carries in an uninterrupted run."""
        self._advance(op)
        return self._payloads[op]

    def checksum(self, op: int) -> str:
        """The state checksum after ``op`` ops (0: the initial state)."""
        self._advance(op)
        return self._checksums[op]


# -- the `app` baseline's state files -----------------------------------------


def state_bytes(header: dict[str, Any], arrays: dict[str, Any]) -> bytes:
    """Return ``header`` (JSON-able) and ``arrays`` (NumPy, CuPy or torch) in the format :func:`load_state_file` reads."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, __header__=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
             **{k: to_host(v) for k, v in arrays.items()})
    return buf.getvalue()


def save_state_file(path: str, header: dict[str, Any], arrays: dict[str, Any]) -> None:
    """Write ``header`` and ``arrays`` (:func:`state_bytes`) to ``path`` atomically.

    The file is opened and closed here: no file stays open across a cut.
    """
    with atomic_open(path) as fh:
        fh.write(state_bytes(header, arrays))


def load_state_file(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read what :func:`save_state_file` wrote: ``(header, {name: NumPy array})``."""
    import numpy as np

    with np.load(path) as data:
        header = json.loads(data["__header__"].tobytes())
        arrays = {k: data[k].copy() for k in data.files if k != "__header__"}
    return header, arrays


def load_state_into(path: str, xp: ModuleType, targets: dict[str, Any]) -> dict[str, Any]:
    """Copy the arrays :func:`save_state_file` wrote into the existing buffers ``targets``
    (by name, so their addresses stay those :meth:`setup` allocated); return the header."""
    header, arrays = load_state_file(path)
    for name, buf in targets.items():
        buf[...] = xp.asarray(arrays[name])
    synchronize(xp)
    return header


# -- inputs whose position lives outside the process ----------------------------


class ExternalCursor:
    """An input position kept in a file, outside any process image.

    It stands for a message broker's committed consumer offset or a data
    service's read position: whatever the process took from it stays taken,
    even if the process is later rolled back to an image from before. A
    checkpoint of the process does not cover it (domain ``disk``). The file is
    opened only inside each call.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not self.path.exists():
            write_number(self.path, 0)  # created whole before any cut point: no take() ever renames

    def position(self) -> int:
        """How many items have been taken so far."""
        return read_number(self.path)

    def seek(self, position: int) -> None:
        """Set the position (a consumer that seeks back on restore), rewritten in place
        (:func:`cutbench.files.write_number`: a cut inside it restores)."""
        write_number(self.path, position)

    def take(self) -> int:
        """Take the next item; return its 1-based index."""
        item = self.position() + 1
        self.seek(item)
        return item


class MemoryCursor:
    """An input position held in process memory (covered by any process checkpoint)."""

    def __init__(self) -> None:
        self._position = 0

    def position(self) -> int:
        """How many items have been taken so far."""
        return self._position

    def seek(self, position: int) -> None:
        """Set the position."""
        self._position = int(position)

    def take(self) -> int:
        """Take the next item; return its 1-based index."""
        self._position += 1
        return self._position


def make_cursor(kind: str, path: str | os.PathLike[str]) -> ExternalCursor | MemoryCursor:
    """An input cursor: ``"memory"`` (in the process) or ``"external"`` (a file at ``path``)."""
    return ExternalCursor(path) if kind == "external" else MemoryCursor()


# The largest op count a workload accepts: a trial is a real process per op
# range, so larger numbers would only exhaust time and memory in planning.
MAX_OPS = 1_000_000


def check_choice(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    """Raise ValueError naming parameter ``name``, its bad ``value`` and the allowed values."""
    validate.check_choice(f"parameter {name}", value, allowed, error=ValueError)


def check_range(name: str, value: int | float, low: int | float, high: int | float | None = None) -> None:
    """Raise ValueError unless ``low <= value <= high`` (no upper bound when ``high`` is None)."""
    validate.check_range(f"parameter {name}", value, low, high, error=ValueError)


# -- what the built-in workloads share ------------------------------------------

# The receiver's decisions after which an effect is out (visible): a request log records only these.
VISIBLE_DECISIONS = frozenset({"applied", "suppressed", "committed"})


class BaseWorkload:
    """The frame of the built-in workloads: parameters every one takes, the
    domains parameter values add, the publish → ack → commit end of an op, and
    the report's common keys. A subclass sets ``name``, ``phases``, its own
    ``defaults`` (merged over :attr:`COMMON_DEFAULTS`), ``choices`` and
    ``param_domains``, and implements ``setup``, ``run_op``, ``reference``.
    """

    name: ClassVar[str]  # set by each subclass
    domains: ClassVar[frozenset[str]] = frozenset({"cpu", "receiver"})
    COMMON_DEFAULTS: ClassVar[dict[str, Any]] = {
        "ops": 8,
        "seed": 0,
        "work_ms": 0.0,  # simulated device work per op (between launch and device_done)
        "op_interval_ms": 0.0,  # idle time after each commit
    }
    # parameter -> its allowed values (checked by validate_params)
    choices: ClassVar[dict[str, tuple[Any, ...]]] = {}
    # (parameter, value) -> the domain that value moves state into
    param_domains: ClassVar[dict[tuple[str, Any], str]] = {}

    @classmethod
    def validate_params(cls, p: dict[str, Any]) -> None:
        """Raise ValueError naming the first unusable parameter."""
        check_range("ops", p["ops"], 1, MAX_OPS)
        check_range("work_ms", p["work_ms"], 0)
        check_range("op_interval_ms", p["op_interval_ms"], 0)
        for name, allowed in cls.choices.items():
            check_choice(name, p[name], allowed)
        cls.check_params(p)

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """Checks of the subclass's own parameters (raise ValueError)."""

    @classmethod
    def features_for(cls, params: dict[str, Any], array: str) -> frozenset[str]:
        """The CUDA features it uses on array backend ``array``: its ``features`` on a GPU backend, none on
        NumPy (a program that runs on the host touches no CUDA feature the certificate should ask about)."""
        # Imported here: every data-loader worker process imports this module, and api (the registry, entry
        # points) would cost each of them tens of milliseconds at start.
        from cutbench.workloads.api import optional

        return frozenset() if array == "numpy" else frozenset(optional(cls, "features"))

    @classmethod
    def domains_for(cls, params: dict[str, Any]) -> frozenset[str]:
        """The domains ``params`` add (see :attr:`param_domains`)."""
        return frozenset(d for (name, value), d in cls.param_domains.items() if params.get(name) == value)

    def __init__(self, rt: Any, params: dict[str, Any]):
        self.rt = rt
        self.xp = rt.xp
        self.p = params
        self.committed = 0  # the last effect id whose commit marker is durable
        self.request_log: RequestLog | None = None  # set by join_cuts

    def start_device(self) -> None:
        """Create the CUDA context now, with a one-element allocation, and mark ``cuda_init`` on the start-up
        clock (``rt.mark_startup``), so a cold start tells CUDA's initialisation from the model build; on
        NumPy only the mark. Call it first in ``setup``."""
        if is_device(self.xp):
            self.xp.zeros(1)
            synchronize(self.xp)
        self.rt.mark_startup("cuda_init")

    def simulate_work(self) -> None:
        """Stand in for ``work_ms`` of device work."""
        if self.p["work_ms"]:
            time.sleep(self.p["work_ms"] / 1000.0)

    def step_through(self, op: int, launch: Callable[[], None], read: Callable[[], str], key: int | None = None) -> None:
        """The seven phases of op ``op``: ``admit``; ``launch`` once ``launch()`` has enqueued the device work;
        ``device_done`` after the simulated work and a synchronise; ``record`` once ``read()`` has given the
        effect; then :meth:`deliver` under ``key`` (default ``op``)."""
        rt = self.rt
        rt.point(op, "admit")
        launch()
        rt.point(op, "launch")
        self.simulate_work()
        synchronize(self.xp)
        rt.point(op, "device_done")
        effect = read()
        rt.point(op, "record")
        self.deliver(op, op if key is None else key, effect)

    def deliver(self, op: int, key: int, effect: str) -> None:
        """Phases ``publish``, ``ack``, ``commit`` of op ``op``: send ``effect`` under
        ``key``, wait for the receiver's ack, commit ``key`` durably, then idle.

        With a request log (:meth:`join_cuts`) a reply the log says was delivered is not sent again, and
        an acknowledged one is logged before ``ack``."""
        rt = self.rt
        log = self.request_log
        if log is not None:
            if log.already_delivered(key):
                rt.log(f"op {op}: the request log says effect {key} was delivered; not sent again")
                rt.point(op, "publish")
                rt.point(op, "ack")
                self.commit(op, key)
                return
        rt.receiver.send_effect(rt.trial, key, rt.epoch, effect)
        rt.point(op, "publish")
        if log is not None and log.already_delivered(key):
            # Restored here: the crashed incarnation had the ack and logged it; a resend on reconnect would
            # deliver it twice.
            rt.receiver.forget(key, trial=rt.trial)
            rt.log(f"op {op}: the request log says effect {key} was delivered; not waiting for its ack")
        else:
            ack = rt.receiver.wait_ack(key)
            if log is not None and ack.get("decision") in VISIBLE_DECISIONS:
                log.delivered(key)  # a fenced receiver's "prepared" is not out yet: the fence decides
        rt.point(op, "ack")
        self.commit(op, key)

    def join_cuts(self, queue: Any = None) -> None:
        """With parameter ``adapters`` on, register the semantic adapters of a serving runtime
        (:mod:`cutbench.workloads.adapters`): a request log of the acknowledged replies (domain
        ``request_log``) and, for an external ``queue``, its consumer offset (domain ``disk``)."""
        if not self.p.get("adapters"):
            return
        self.request_log = RequestLog(self.rt.workdir / "request_log")
        self.rt.register_adapter(self.request_log)
        if isinstance(queue, ExternalCursor):
            self.rt.register_adapter(ConsumerOffset(queue))

    def commit(self, op: int, key: int) -> None:
        """Phase ``commit`` of op ``op``: commit ``key`` durably, then idle."""
        self.rt.commit_marker(key)
        self.committed = key
        self.rt.point(op, "commit")
        if self.p["op_interval_ms"]:
            time.sleep(self.p["op_interval_ms"] / 1000.0)

    def report_frame(self, checksum: str, domain_ops: dict[str, int] | None = None, what: str = "") -> dict[str, Any]:
        """The report's common keys; ``domain_ops`` that must agree are the self-check ``what`` describes."""
        out: dict[str, Any] = {
            "host_op": self.committed,
            "checksum": checksum,
            "device": backend_name(self.xp),
            "domains": device_domains(self.xp) + sorted(self.domains_for(self.p)),
        }
        if domain_ops is not None:
            out["domain_ops"] = domain_ops
            out["self_check"] = {"ok": len(set(domain_ops.values())) == 1, "what": what}
        return out


class RecordedWorkload(BaseWorkload):
    """A :class:`BaseWorkload` with no model: its ground truth is recorded from two uninterrupted runs on the
    machine (``ground_truth = "recorded"``; floating point, CUDA libraries, anything NumPy does not replay)."""

    ground_truth: ClassVar[str] = "recorded"

    @classmethod
    def reference(cls, params: dict[str, Any]) -> Any:
        """None to compute: the runner records the reference before the trials."""
        from cutbench.errors import WorkloadError

        raise WorkloadError(f"workload {cls.name!r} has no model reference: its ground truth is recorded from "
                            "uninterrupted runs on this machine (the runner records it before the trials)")

"""``counter``: the smallest workload that can be wrong in every interesting way.

State is a vector of 64-bit words on the device (NumPy on machines without a
GPU; ``xp.word_dtype`` says why torch holds them as int64). Op *i* applies
``state = state * MULT + mix(seed, i)`` elementwise, publishes the digest of
the new state as its effect, waits for the ack and commits a local marker.
Integer arithmetic wraps mod 2**64 identically on CuPy, PyTorch and NumPy, so
the reference below reproduces every digest bit for bit. The body keeps to the
array API standard (plus the helpers of ``xp``), so it also runs on
``array = "torch"``.
"""

from __future__ import annotations

import hashlib
import time
from functools import lru_cache
from types import ModuleType
from typing import Any, ClassVar

import array_api_compat

from cutbench.workloads.api import ARRAYS
from cutbench.workloads.common import (GOLDEN, MASK, MAX_OPS, MIX1, MIX2, MULT, check_range, load_state_into,
                                       save_state_file, sums)
from cutbench.workloads.control import PHASES
from cutbench.workloads.xp import (backend_name, device_uuid, host_words, is_device, pointer, release_cached_memory,
                                   shift_right, synchronize, word, word_dtype)


def mix(xp: ModuleType, n: int, seed: int, op: int) -> Any:
    """The deterministic increment of op ``op``: splitmix64 over ``arange(n)`` offset by (seed, op)."""
    base = (seed * GOLDEN + op * MIX1) & MASK
    x = xp.arange(n, dtype=word_dtype(xp))
    x += word(xp, base)
    x ^= shift_right(xp, x, 30)
    x *= word(xp, MIX1)
    x ^= shift_right(xp, x, 27)
    x *= word(xp, MIX2)
    x ^= shift_right(xp, x, 31)
    return x


BALLAST_SALT = 0xBA11A57
# Appended to the checksum when the ballast changed: the oracle then reports
# the device state as not matching the reference (mixed_epoch).
BALLAST_CORRUPT = ":ballast-corrupt"


def ballast(xp: ModuleType, mib: int, seed: int) -> Any:
    """Return ``mib`` MiB of deterministic uint64 words (None for 0)."""
    if mib <= 0:
        return None
    return mix(xp, mib * (1 << 20) // 8, seed ^ BALLAST_SALT, 0)


def initial_state(xp: ModuleType, n: int, seed: int) -> Any:
    """The state before op 1."""
    return mix(xp, n, seed, 0)


def apply_op(xp: ModuleType, state: Any, seed: int, op: int) -> None:
    """Apply op ``op`` to ``state`` in place (enqueues device work on a GPU)."""
    state *= word(xp, MULT)
    state += mix(xp, array_api_compat.size(state), seed, op)


def digest(xp: ModuleType, state: Any) -> str:
    """A short digest of ``state``: two wrapping sums reduced on the device, hashed on the host."""
    s1, s2 = host_words(sums(xp, state))
    return hashlib.blake2b(f"{array_api_compat.size(state)}:{s1}:{s2}".encode(), digest_size=16).hexdigest()


class CounterReference:
    """Digests of an uninterrupted counter run, computed with NumPy."""

    def __init__(self, seed: int, state_size: int):
        self.seed = seed
        self.state_size = state_size

    @lru_cache(maxsize=None)
    def _digests(self, upto: int) -> tuple[str, ...]:
        import numpy as np

        state = initial_state(np, self.state_size, self.seed)
        out = [digest(np, state)]
        for op in range(1, upto + 1):
            apply_op(np, state, self.seed, op)
            out.append(digest(np, state))
        return tuple(out)

    def checksum(self, op: int) -> str:
        """State digest after ``op`` ops."""
        # Round up so nearby queries share one cached computation.
        return self._digests(max(64, 1 << (op.bit_length())))[op]

    payload = checksum  # the effect of op i carries the state digest after op i


class Counter:
    """The ``counter`` workload (see module docstring)."""

    name: ClassVar[str] = "counter"
    domains: ClassVar[frozenset[str]] = frozenset({"cpu", "receiver"})
    phases: ClassVar[tuple[str, ...]] = PHASES
    arrays: ClassVar[tuple[str, ...]] = ("numpy", "cupy", "torch")
    defaults: ClassVar[dict[str, Any]] = {
        "ops": 8,
        "seed": 0,
        "state_size": 1024,
        "op_interval_ms": 0.0,
        # Extra device memory of known content (MiB): makes the checkpoint move
        # that many bytes; verified at the end and folded into the checksum.
        "ballast_mib": 0,
    }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A subclass changes the op's steps, and may do so with CuPy's or
        # NumPy's own methods (``state.copy()``): it runs on torch only if it says so.
        super().__init_subclass__(**kwargs)
        if "arrays" not in cls.__dict__:
            cls.arrays = ARRAYS

    @classmethod
    def validate_params(cls, p: dict[str, Any]) -> None:
        """Raise ValueError naming the first parameter out of its range."""
        check_range("ops", p["ops"], 1, MAX_OPS)
        check_range("state_size", p["state_size"], 1, 1 << 30)
        check_range("op_interval_ms", p["op_interval_ms"], 0, 3_600_000)
        check_range("ballast_mib", p["ballast_mib"], 0, 1 << 20)

    def __init__(self, rt: Any, params: dict[str, Any]):
        self.rt = rt
        self.xp = rt.xp
        self.p = params
        self.cursor = 0  # host input cursor: last op admitted
        self.host_op = 0  # last op whose result is recorded on the host
        self.committed = 0  # last op whose marker is durable
        self.last_digest = ""

    def setup(self) -> None:
        """Allocate the state vector and remember its address."""
        self.state = initial_state(self.xp, self.p["state_size"], self.p["seed"])
        self.ballast = ballast(self.xp, self.p["ballast_mib"], self.p["seed"])
        # A device-side pointer table: the buffer's own address stored in device
        # memory, checked against the live address at the end (GPU runs only).
        self.ptr_table = self.xp.asarray([pointer(self.state)], dtype=word_dtype(self.xp)) if is_device(self.xp) else None
        synchronize(self.xp)
        if is_device(self.xp):
            # Give the temporaries of the set-up back to the driver: the device
            # state a checkpoint moves is then the buffers (and the context).
            release_cached_memory(self.xp)
        self.pointers_initial = {"state": pointer(self.state)}
        self.gpu_uuid_initial = device_uuid(self.xp)

    def run_op(self, op: int) -> None:
        """Run op ``op`` through all seven phases."""
        self.compute(op)
        self.deliver(op, self.last_digest)
        self.commit(op)

    # -- the op's steps (a variant may change one of them) ----
    def point(self, op: int, phase: str) -> None:
        """Call ``rt.point``, then :meth:`on_point`: a restored process resumes inside
        ``rt.point``, so this is the first code it runs after a restore."""
        self.rt.point(op, phase)
        self.on_point()

    def on_point(self) -> None:
        """Hook run after every cut point (variants notice restores here)."""

    def compute(self, op: int) -> None:
        """Phases ``admit`` to ``record``: update the state, record its digest on the host."""
        self.cursor = op
        self.point(op, "admit")
        self.launch_op(op)
        self.point(op, "launch")
        self.wait_op(op)
        self.point(op, "device_done")
        self.last_digest = self.state_digest()
        self.host_op = op
        self.point(op, "record")

    def deliver(self, op: int, payload: str) -> None:
        """Phases ``publish`` and ``ack``: send the effect, wait for the receiver's ack."""
        rt = self.rt
        rt.receiver.send_effect(rt.trial, op, rt.epoch, payload)
        self.point(op, "publish")
        rt.receiver.wait_ack(op)
        self.point(op, "ack")

    def commit(self, op: int) -> None:
        """Phase ``commit``: the durable marker, then the op interval."""
        self.rt.commit_marker(op)
        self.committed = op
        self.point(op, "commit")
        if self.p["op_interval_ms"]:
            time.sleep(self.p["op_interval_ms"] / 1000.0)

    # -- device hooks (a subclass may run the same arithmetic another way) ----
    def launch_op(self, op: int) -> None:
        """Enqueue op ``op``'s device work."""
        apply_op(self.xp, self.state, self.p["seed"], op)

    def wait_op(self, op: int) -> None:
        """Wait until op ``op``'s device work is complete."""
        synchronize(self.xp)

    def state_digest(self) -> str:
        """The digest of the state vector now."""
        return digest(self.xp, self.state)

    def ballast_ok(self) -> bool:
        """Whether the ballast still holds exactly what :func:`ballast` wrote."""
        if self.ballast is None:
            return True
        return bool(self.xp.all(self.ballast == ballast(self.xp, self.p["ballast_mib"], self.p["seed"])))

    def report(self) -> dict[str, Any]:
        """Host counters, the device state digest and the buffer addresses."""
        out = {
            "host_op": self.committed,
            "cursor": self.cursor,
            "recorded_op": self.host_op,
            "checksum": self.state_digest() + ("" if self.ballast_ok() else BALLAST_CORRUPT),
            "pointers_initial": self.pointers_initial,
            "pointers_final": {"state": pointer(self.state)},
            "device": backend_name(self.xp),
        }
        if self.ptr_table is not None:
            out["pointer_table_ok"] = host_words(self.ptr_table)[0] == pointer(self.state)
            out["domains"] = ["cuda"]
            out["gpu_uuid_initial"] = self.gpu_uuid_initial
            out["gpu_uuid"] = device_uuid(self.xp)
        return out

    def save_state(self, path: str) -> None:
        """Application-level checkpoint at an op boundary: counters and the state vector."""
        header = {"cursor": self.cursor, "host_op": self.host_op, "committed": self.committed, "last_digest": self.last_digest}
        save_state_file(path, header, {"state": self.state})

    def load_state(self, path: str) -> int:
        """Load what :meth:`save_state` wrote into the buffers :meth:`setup` made; return the op to resume after."""
        header = load_state_into(path, self.xp, {"state": self.state})
        self.cursor, self.host_op = header["cursor"], header["host_op"]
        self.committed, self.last_digest = header["committed"], header["last_digest"]
        return self.committed

    @classmethod
    def reference(cls, params: dict[str, Any]) -> CounterReference:
        """Ground truth for ``params`` (only ``seed`` and ``state_size`` matter)."""
        return CounterReference(params["seed"], params["state_size"])

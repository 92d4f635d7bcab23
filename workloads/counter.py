"""``counter``: the smallest workload that can be wrong in every interesting way.

State is a vector of uint64 on the device (NumPy on machines without a GPU).
Op *i* applies ``state = state * MULT + mix(seed, i)`` elementwise, publishes
the digest of the new state as its effect, waits for the ack and commits a
local marker. Integer arithmetic wraps mod 2**64 identically on CuPy and
NumPy, so the reference below reproduces every digest bit for bit.
"""

from __future__ import annotations

import hashlib
import time
from functools import lru_cache
from types import ModuleType
from typing import Any, ClassVar

from workloads.control import PHASES
from workloads.xp import pointer, synchronize

MASK = (1 << 64) - 1
MULT = 6364136223846793005  # Knuth's MMIX LCG multiplier: odd, so the update is a bijection
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def mix(xp: ModuleType, n: int, seed: int, op: int) -> Any:
    """The deterministic increment of op ``op``: splitmix64 over ``arange(n)`` offset by (seed, op)."""
    u = xp.uint64
    base = (seed * GOLDEN + op * MIX1) & MASK
    x = xp.arange(n, dtype=u)
    x += u(base)
    x ^= x >> u(30)
    x *= u(MIX1)
    x ^= x >> u(27)
    x *= u(MIX2)
    x ^= x >> u(31)
    return x


def initial_state(xp: ModuleType, n: int, seed: int) -> Any:
    """The state before op 1."""
    return mix(xp, n, seed, 0)


def apply_op(xp: ModuleType, state: Any, seed: int, op: int) -> None:
    """Apply op ``op`` to ``state`` in place (enqueues device work on CuPy)."""
    state *= xp.uint64(MULT)
    state += mix(xp, state.size, seed, op)


def digest(xp: ModuleType, state: Any) -> str:
    """A short digest of ``state``: two wrapping sums reduced on the device, hashed on the host."""
    u = xp.uint64
    s1 = int(state.sum(dtype=u))
    weights = xp.arange(state.size, dtype=u)
    weights *= u(2)
    weights += u(1)
    weights *= state
    s2 = int(weights.sum(dtype=u))
    return hashlib.blake2b(f"{state.size}:{s1}:{s2}".encode(), digest_size=16).hexdigest()


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
    defaults: ClassVar[dict[str, Any]] = {
        "ops": 8,
        "seed": 0,
        "state_size": 1024,
        "op_interval_ms": 0.0,
    }

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
        synchronize(self.xp)
        self.pointers_initial = {"state": pointer(self.state)}

    def run_op(self, op: int) -> None:
        """Run op ``op`` through all seven phases."""
        rt, xp = self.rt, self.xp
        self.cursor = op
        rt.point(op, "admit")
        apply_op(xp, self.state, self.p["seed"], op)
        rt.point(op, "launch")
        synchronize(xp)
        rt.point(op, "device_done")
        self.last_digest = digest(xp, self.state)
        self.host_op = op
        rt.point(op, "record")
        rt.receiver.send_effect(rt.trial, op, rt.epoch, self.last_digest)
        rt.point(op, "publish")
        rt.receiver.wait_ack(op)
        rt.point(op, "ack")
        rt.commit_marker(op)
        self.committed = op
        rt.point(op, "commit")
        if self.p["op_interval_ms"]:
            time.sleep(self.p["op_interval_ms"] / 1000.0)

    def report(self) -> dict[str, Any]:
        """Host counters, the device state digest and the buffer addresses."""
        return {
            "host_op": self.committed,
            "cursor": self.cursor,
            "recorded_op": self.host_op,
            "checksum": digest(self.xp, self.state),
            "pointers_initial": self.pointers_initial,
            "pointers_final": {"state": pointer(self.state)},
            "device": self.xp.__name__,
        }

    @classmethod
    def reference(cls, params: dict[str, Any]) -> CounterReference:
        """Ground truth for ``params`` (only ``seed`` and ``state_size`` matter)."""
        return CounterReference(params["seed"], params["state_size"])

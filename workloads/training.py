"""``training``: parameters and optimizer state on the device, a data cursor on
the host, per-step metrics published as effects.

Each op is one optimizer step in exact integer arithmetic (uint64, wrapping
identically on CuPy and NumPy): take batch ``b`` from the data cursor,
compute a "gradient" from the parameters and the batch, update the momentum
and the parameters, bump a device-side step counter, and publish the step's
metrics (two wrapping sums of the gradient and of the parameters).

The data cursor says which batch comes next. ``cursor = "host"`` keeps it in
process memory, beside the parameters it must agree with. ``cursor =
"external"`` keeps it outside the process (a data service's read position or
a loader that persists its offset; here a file, domain ``disk``): after a
rollback the restored parameters are from step *k* but the cursor is past
the batches the crashed incarnation consumed, so the run trains on the wrong
batches. That is the mixed epoch this workload exists to show: the final
``domain_ops`` report the cursor and the device step counter, which a
coherent run keeps equal, and the metrics and checksum leave the reference.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

from cutbench.workloads.common import (
    BaseWorkload,
    ReplayReference,
    check_range,
    digest,
    host_ints,
    load_state_into,
    make_cursor,
    save_state_file,
    sums,
)
from cutbench.workloads.control import PHASES
from cutbench.workloads.counter import mix
from cutbench.workloads.xp import pointer, synchronize

DATA_SALT = 0xDA7A_5A17
BETA = 0x9E37_79B9  # momentum multiplier (odd)
GRAD_MULT = 0xC2B2_AE3D_27D4_EB4F


class TrainModel:
    """Parameters, momentum and the step counter, and one step of the update rule."""

    def __init__(self, xp: ModuleType, seed: int, dim: int, shift: int):
        self.xp = xp
        self.seed, self.dim = seed, dim
        u = xp.uint64
        self.shift = u(shift)
        self.w = mix(xp, dim, seed, 0)
        self.m = xp.zeros(dim, dtype=u)
        self.steps = xp.zeros(1, dtype=u)
        self.metrics = xp.zeros(4, dtype=u)

    def batch(self, b: int) -> Any:
        """Batch ``b`` of the (generated) data set."""
        return mix(self.xp, self.dim, self.seed ^ DATA_SALT, b)

    def update(self, batch: Any) -> None:
        """Enqueue one optimizer step on ``batch``: gradient, momentum, parameters, step counter, metrics."""
        xp, u = self.xp, self.xp.uint64
        g = self.w ^ batch
        g *= u(GRAD_MULT)
        g >>= self.shift
        self.m *= u(BETA)
        self.m += g
        self.w -= self.m
        self.steps += u(1)
        self.metrics = xp.concatenate([sums(xp, g), sums(xp, self.w)])

    def published(self, step: int) -> str:
        """The metrics effect of step ``step`` (reads the metrics back)."""
        return digest(step, host_ints(self.metrics))

    def device_step(self) -> int:
        """The device's own count of steps applied."""
        return host_ints(self.steps)[0]

    def checksum(self) -> str:
        """Digest of parameters, momentum and the step counter."""
        xp = self.xp
        return digest(host_ints(sums(xp, self.w)), host_ints(sums(xp, self.m)), host_ints(self.steps))

    def step(self, op: int) -> str:
        """Step ``op`` on batch ``op`` without cut points (the reference's replay)."""
        self.update(self.batch(op))
        return self.published(op)


class Training(BaseWorkload):
    """The ``training`` workload (see module docstring)."""

    name: ClassVar[str] = "training"
    phases: ClassVar[tuple[str, ...]] = PHASES
    defaults: ClassVar[dict[str, Any]] = {**BaseWorkload.COMMON_DEFAULTS, "dim": 4096, "grad_shift": 11, "cursor": "host",
                                          "adapters": False}
    choices: ClassVar[dict[str, tuple[Any, ...]]] = {"cursor": ("host", "external")}
    # An external data cursor is state on disk, outside any process image; ``adapters = true`` joins it to each
    # cut at the step the image holds (the loader's position at that optimizer step), with a log of the metrics
    # acknowledged (BaseWorkload.join_cuts).
    param_domains: ClassVar[dict[tuple[str, Any], str]] = {("cursor", "external"): "disk", ("adapters", True): "request_log"}

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """Model size and the gradient's shift."""
        check_range("dim", p["dim"], 1, 1 << 28)
        check_range("grad_shift", p["grad_shift"], 0, 63)

    def setup(self) -> None:
        """Allocate parameters and optimizer state; open the data cursor."""
        p = self.p
        self.model = TrainModel(self.xp, p["seed"], p["dim"], p["grad_shift"])
        kind = "external" if p["cursor"] == "external" else "memory"
        self.cursor = make_cursor(kind, self.rt.workdir / "data.cursor")
        self.join_cuts(self.cursor)
        synchronize(self.xp)
        self.pointers_initial = {"params": pointer(self.model.w), "momentum": pointer(self.model.m)}

    def run_op(self, op: int) -> None:
        """One training step through all seven phases."""
        model = self.model
        batch = model.batch(self.cursor.take())
        self.step_through(op, lambda: model.update(batch), lambda: model.published(op))

    def report(self) -> dict[str, Any]:
        """Committed step, state checksum, cursor against device step, buffer addresses."""
        model = self.model
        domain_ops = {"data_cursor": self.cursor.position(), "device_step": model.device_step()}
        return {
            **self.report_frame(model.checksum(), domain_ops, "data cursor = device step counter"),
            "pointers_initial": self.pointers_initial,
            "pointers_final": {"params": pointer(model.w), "momentum": pointer(model.m)},
        }

    def save_state(self, path: str) -> None:
        """Application-level checkpoint at a step boundary: parameters, momentum, step, cursor."""
        m = self.model
        header = {"committed": self.committed, "cursor": self.cursor.position()}
        save_state_file(path, header, {"w": m.w, "m": m.m, "steps": m.steps})

    def load_state(self, path: str) -> int:
        """Load :meth:`save_state`'s file and seek the data cursor back; return the step to resume after."""
        m = self.model
        header = load_state_into(path, self.xp, {"w": m.w, "m": m.m, "steps": m.steps})
        self.cursor.seek(header["cursor"])
        self.committed = header["committed"]
        return self.committed

    @classmethod
    def reference(cls, params: dict[str, Any]) -> ReplayReference:
        """Metrics and checksums of an uninterrupted run (step i trains on batch i), on NumPy."""
        import numpy as np

        return ReplayReference(lambda: TrainModel(np, params["seed"], params["dim"], params["grad_shift"]))

"""``request_service``: requests from a queue → device update → host record →
reply effect → ack → commit.

The service keeps a table of ``rows × width`` uint64 on the device (NumPy on
machines without a GPU) and a per-row version counter beside it. Request
``rid`` names a row (``key``) and a value vector, both derived from
``(seed, rid)``; serving it updates that row (``row = row * MULT + value``),
bumps the row's version, and records the reply on the host: the reply carries
the request id, the row, the service's log sequence number (requests served
so far) and the row's digest, and is chained into a host-side ledger. The
reply is the effect, keyed by ``rid`` (the request's idempotency key).

Where the queue lives is a parameter, and it decides what a rollback does:

- ``queue = "memory"``: pending requests are in process memory, so any
  checkpoint of the process covers them; after a rollback the restored
  service serves the same requests again (duplicate replies unless the
  receiver is idempotent).
- ``queue = "external"``: the queue's read position is outside the process (a
  broker's committed consumer offset, here a file; domain ``disk``). After a
  rollback the restored service asks for the next request and gets one after
  those its crashed incarnation already took: requests taken and not yet
  answered are lost (``missing``), and every later reply and the final table
  are computed from a state that skipped requests (``mixed_epoch``).

Self-check at the end (``domain_ops``): the queue position, the number of
updates the device applied (sum of row versions) and the host's log sequence
number are the same number in any coherent run.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

from cutbench.workloads.common import (
    MULT,
    BaseWorkload,
    ReplayReference,
    check_range,
    digest,
    host_ints,
    load_state_into,
    make_cursor,
    save_state_file,
    splitmix,
    sums,
)
from cutbench.workloads.control import PHASES
from cutbench.workloads.counter import mix
from cutbench.workloads.xp import pointer, synchronize

VALUE_SALT = 0x5EED_0F_5E41_1CE5


class ServiceModel:
    """The service's state and its three steps (update, reply, checksum), on any array module."""

    def __init__(self, xp: ModuleType, seed: int, rows: int, width: int):
        self.xp = xp
        self.seed, self.rows, self.width = seed, rows, width
        self.table = mix(xp, rows * width, seed, 0).reshape(rows, width)
        self.versions = xp.zeros(rows, dtype=xp.uint64)
        self.lsn = 0  # host: requests whose reply is recorded
        self.ledger = ""  # host: chain of reply digests

    def key(self, rid: int) -> int:
        """The row request ``rid`` updates."""
        return splitmix(self.seed, rid) % self.rows

    def apply(self, rid: int, key: int) -> None:
        """Enqueue the device update of request ``rid`` on row ``key``."""
        xp = self.xp
        row = self.table[key]
        row *= xp.uint64(MULT)
        row += mix(xp, self.width, self.seed ^ VALUE_SALT, rid)
        self.versions[key] += xp.uint64(1)

    def reply(self, rid: int, key: int) -> str:
        """Record the reply to ``rid`` on the host (reads the row back); return its digest."""
        self.lsn += 1
        answer = digest(rid, key, self.lsn, host_ints(sums(self.xp, self.table[key])))
        self.ledger = digest(self.ledger, answer)
        return answer

    def applied(self) -> int:
        """How many updates the device applied (sum of row versions)."""
        return int(self.versions.sum())

    def checksum(self) -> str:
        """Digest of the table, the versions and the host ledger."""
        xp = self.xp
        return digest(host_ints(sums(xp, self.table)), host_ints(sums(xp, self.versions)), self.lsn, self.ledger)

    def step(self, rid: int) -> str:
        """Serve request ``rid`` without cut points (the reference's replay)."""
        key = self.key(rid)
        self.apply(rid, key)
        return self.reply(rid, key)


class RequestService(BaseWorkload):
    """The ``request_service`` workload (see module docstring)."""

    name: ClassVar[str] = "request_service"
    phases: ClassVar[tuple[str, ...]] = PHASES
    defaults: ClassVar[dict[str, Any]] = {**BaseWorkload.COMMON_DEFAULTS, "rows": 64, "width": 128, "queue": "memory",
                                             "adapters": False}
    choices: ClassVar[dict[str, tuple[Any, ...]]] = {"queue": ("memory", "external")}
    # An external queue's read position is state on disk, outside any process image.
    # ``adapters = true``: a serving runtime's semantic adapters (BaseWorkload.join_cuts), its reply log on disk.
    param_domains: ClassVar[dict[tuple[str, Any], str]] = {("queue", "external"): "disk", ("adapters", True): "request_log"}

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """Table shape."""
        check_range("rows", p["rows"], 1, 1 << 16)
        check_range("width", p["width"], 1, 1 << 20)

    def setup(self) -> None:
        """Allocate the table; open the request queue."""
        p = self.p
        self.op_done = 0  # last op (loop iteration) completed; `committed` is a request id
        self.model = ServiceModel(self.xp, p["seed"], p["rows"], p["width"])
        self.queue = make_cursor(p["queue"], self.rt.workdir / "queue.offset")
        self.join_cuts(self.queue)
        synchronize(self.xp)
        self.pointers_initial = {"table": pointer(self.model.table)}

    def run_op(self, op: int) -> None:
        """Serve the next request through all seven phases."""
        model = self.model
        rid = self.queue.take()
        key = model.key(rid)

        def read() -> str:
            answer = model.reply(rid, key)
            self.op_done = op
            return answer

        self.step_through(op, lambda: model.apply(rid, key), read, key=rid)

    def report(self) -> dict[str, Any]:
        """Committed request, state checksum, per-domain progress and the table's address."""
        model = self.model
        domain_ops = {"queue": self.queue.position(), "device": model.applied(), "host": model.lsn}
        return {
            **self.report_frame(model.checksum(), domain_ops, "queue position = device updates = host replies"),
            "pointers_initial": self.pointers_initial,
            "pointers_final": {"table": pointer(model.table)},
        }

    def save_state(self, path: str) -> None:
        """Application-level checkpoint at an op boundary: table, versions, host record, queue position."""
        m = self.model
        header = {"op": self.op_done, "committed": self.committed, "lsn": m.lsn, "ledger": m.ledger,
                  "queue": self.queue.position()}
        save_state_file(path, header, {"table": m.table, "versions": m.versions})

    def load_state(self, path: str) -> int:
        """Load :meth:`save_state`'s file into the buffers :meth:`setup` made and seek the
        queue back to the saved position; return the op to resume after."""
        m = self.model
        header = load_state_into(path, self.xp, {"table": m.table, "versions": m.versions})
        m.lsn, m.ledger = header["lsn"], header["ledger"]
        self.queue.seek(header["queue"])
        self.op_done, self.committed = header["op"], header["committed"]
        return self.op_done

    @classmethod
    def reference(cls, params: dict[str, Any]) -> ReplayReference:
        """Replies and checksums of an uninterrupted run (requests served in id order), on NumPy."""
        import numpy as np

        return ReplayReference(lambda: ServiceModel(np, params["seed"], params["rows"], params["width"]))

"""``ranks``: 2 to 4 processes that all-reduce over a loopback TCP ring every op.

The workload's process is rank 0. At its first op it starts ranks 1..n-1 as
its own children (``python -m cutbench.workloads.ranks CONFIG``), so a checkpoint of
rank 0 with CRIU (``criu dump -t ROOT``) takes the whole tree. Every rank holds
a replica ``x`` of one uint64 vector. Op *i*: each rank computes its
contribution ``g_r = (x ^ H(seed, r, i)) >> 1``, the ranks sum the
contributions with a chunked ring all-reduce (reduce-scatter, then
all-gather; ``2(n-1)`` messages per link), and every replica applies ``x = x *
MULT + Σ g_r``. Rank 0 publishes the digest of ``x`` as the op's effect.

The ring protocol (:class:`~cutbench.workloads.ring.Ring`) tags every message with ``(op, step)`` and
keeps the messages it sent during the current and the previous op. When a
connection breaks (a restore with ``--tcp-close`` closes every TCP
connection), the sender reconnects, the receiver says which tag it consumed
last, and the sender resends what follows. That is enough to resume after a
coordinated cut (all ranks rolled back to one instant). After an
uncoordinated cut — one rank rolled back while its peers ran on — the peers
no longer hold the messages it needs and it no longer has the ones they
expect: the ring hangs, and the harness's watchdog reports a ``deadlock``.

Which cut is taken is a parameter: ``cut = "tree"`` (default) lets the harness
checkpoint rank 0's whole tree at once; ``cut = "rank"`` names rank
``cut_rank`` as the one process to checkpoint (``Runtime.set_cut_target``),
and the workload then declares the ``peer`` domain, because its peers' half
of the conversation is outside that checkpoint.

With ``adapters = true`` the ranks join each cut through a distributed pause
(:class:`RankSet`, the semantic adapter of domain ``rank_set``): every rank
notes in the control file the last collective it completed; at ``prepare``
rank 0 waits until every rank stands at the same collective boundary as
itself and answers ``ranks {0,1,2}@op 3``, or refuses, naming the ranks that
did not get there by the deadline (then every rank goes on: nothing was
captured). ``slow_rank`` and ``slow_rank_ms`` make one rank late on purpose
after each collective, to measure that bounded failure.

Self-check at the end: rank 0 gathers every rank's last op and replica digest
around the ring; ``domain_ops`` holds each rank's op, and replicas that
disagree make the reported checksum leave the reference.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from types import ModuleType
from typing import Any, ClassVar

from cutbench.workloads.adapters import Ready
from cutbench.workloads.common import (
    MASK,
    MULT,
    BaseWorkload,
    ReplayReference,
    check_range,
    digest,
    host_ints,
    load_state_into,
    save_state_file,
    sums,
)
from cutbench.workloads.control import ControlFile
from cutbench.workloads.ring import STRIDE, Ring, tag_of
from cutbench.workloads.counter import mix
from cutbench.workloads.xp import backend_name, pointer, synchronize, to_host

PHASES: tuple[str, ...] = ("admit", "allreduce", "device_done", "record", "publish", "ack", "commit")
RANK_SALT = 0x0DDB_A11_5EED
SYNC_STEP = STRIDE - 1  # the state handed round the ring when ranks start
# -- the arithmetic every rank runs --------------------------------------------


def contribution(xp: ModuleType, x: Any, seed: int, rank: int, op: int) -> Any:
    """Rank ``rank``'s contribution to op ``op``: ``(x ^ H(seed, rank, op)) >> 1``."""
    g = x ^ mix(xp, x.size, (seed ^ (RANK_SALT * (rank + 1))) & MASK, op)
    g >>= xp.uint64(1)
    return g


def apply_sum(xp: ModuleType, x: Any, total: Any) -> None:
    """Compute ``x = x * MULT + total`` in place."""
    x *= xp.uint64(MULT)
    x += total


def allreduce(xp: ModuleType, ring: Ring, op: int, g: Any) -> Any:
    """The wrapping sum of every rank's ``g`` (chunked ring: reduce-scatter, then all-gather)."""
    import numpy as np

    n, r = ring.n, ring.rank
    bounds = [i * g.size // n for i in range(n + 1)]
    acc = [g[bounds[i] : bounds[i + 1]].copy() for i in range(n)]

    def wire(a: Any) -> bytes:
        return to_host(a).tobytes()

    def unwire(data: bytes) -> Any:
        return xp.asarray(np.frombuffer(data, dtype=np.uint64))

    for s in range(n - 1):
        ring.send(tag_of(op, s), wire(acc[(r - s) % n]))
        acc[(r - s - 1) % n] += unwire(ring.recv(tag_of(op, s)))
    for s in range(n - 1):
        ring.send(tag_of(op, n - 1 + s), wire(acc[(r - s + 1) % n]))
        acc[(r - s) % n] = unwire(ring.recv(tag_of(op, n - 1 + s)))
    return xp.concatenate(acc)


def replica_digest(xp: ModuleType, x: Any) -> str:
    """The digest of a replica (what rank 0 publishes, and what ranks compare)."""
    return digest(host_ints(sums(xp, x)))


def encode_state(op: int, x: Any) -> bytes:
    """The SYNC payload: the op a replica is at and its contents."""
    return struct.pack("<q", op) + to_host(x).tobytes()


def decode_state(xp: ModuleType, payload: bytes) -> tuple[int, Any]:
    """Inverse of :func:`encode_state`."""
    import numpy as np

    (op,) = struct.unpack_from("<q", payload)
    return op, xp.asarray(np.frombuffer(payload[8:], dtype=np.uint64).copy())


class RanksModel:
    """All replicas at once, without a network (the reference's replay)."""

    def __init__(self, xp: ModuleType, seed: int, size: int, ranks: int):
        self.xp, self.seed, self.ranks = xp, seed, ranks
        self.x = mix(xp, size, seed, 0)

    def step(self, op: int) -> str:
        """Op ``op`` for every rank; return the digest rank 0 publishes."""
        total = contribution(self.xp, self.x, self.seed, 0, op)
        for rank in range(1, self.ranks):
            total += contribution(self.xp, self.x, self.seed, rank, op)
        apply_sum(self.xp, self.x, total)
        return replica_digest(self.xp, self.x)

    def checksum(self) -> str:
        """Digest of the (common) replica."""
        return replica_digest(self.xp, self.x)


# -- rank 0: the workload ------------------------------------------------------


class RankSet:
    """The distributed pause (domain ``rank_set``): every rank at rank 0's collective boundary, or a refusal."""

    domain = "rank_set"
    effects = False  # rank 0 publishes the effects; their log is not this adapter's

    def __init__(self, workload: "Ranks"):
        self.workload = workload

    def behind(self) -> dict[int, int]:
        """Rank -> the last collective it says it completed, for every rank not at rank 0's."""
        w = self.workload
        ops = {r: w.rt.control.get(f"rank_op_{r}") for r in range(1, w.p["ranks"])}
        # Not "below": after a leave_running rollback the slots still hold where the crashed ranks got to.
        return {r: op for r, op in ops.items() if op != w.collectives}

    def prepare(self, epoch: int, deadline: float) -> "Ready | str":
        """Wait, until ``deadline``, for every rank to complete rank 0's last collective."""
        while (late := self.behind()) and time.time() < deadline:
            time.sleep(0.0005)
        done = self.workload.collectives
        if late:
            return "; ".join(f"rank {r} at op {op}, not at op {done}'s boundary" for r, op in sorted(late.items()))
        return Ready(f"ranks {{{','.join(map(str, range(self.workload.p['ranks'])))}}} at op {done}")

    def commit(self, epoch: int) -> None:
        """Nothing held: the ranks wait on rank 0's next contribution by themselves."""

    abort = commit


class Ranks(BaseWorkload):
    """The ``ranks`` workload (see module docstring); this object is rank 0."""

    name: ClassVar[str] = "ranks"
    phases: ClassVar[tuple[str, ...]] = PHASES
    defaults: ClassVar[dict[str, Any]] = {
        **BaseWorkload.COMMON_DEFAULTS, "ranks": 3, "state_size": 4096,
        "cut": "tree",  # or "rank": checkpoint rank `cut_rank` alone
        "cut_rank": 1,
        "adapters": False,  # the distributed pause (RankSet)
        "slow_rank": 0,  # a rank (1..n-1) that lags `slow_rank_ms` after each collective (0: none)
        "slow_rank_ms": 0.0,
    }
    choices: ClassVar[dict[str, tuple[Any, ...]]] = {"cut": ("tree", "rank")}
    # Cutting one rank leaves its peers' side of the protocol outside the checkpoint; the distributed pause
    # makes the ranks' collective position a domain of its own.
    param_domains: ClassVar[dict[tuple[str, Any], str]] = {("cut", "rank"): "peer", ("adapters", True): "rank_set"}

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """Rank count, state size (a chunk per rank), which rank a one-rank cut takes."""
        check_range("ops", p["ops"], 1, STRIDE * 1000)
        check_range("ranks", p["ranks"], 2, 4)
        check_range("state_size", p["state_size"], p["ranks"], 1 << 26)
        check_range("cut_rank", p["cut_rank"], 1, p["ranks"] - 1)
        check_range("slow_rank", p["slow_rank"], 0, p["ranks"] - 1)
        check_range("slow_rank_ms", p["slow_rank_ms"], 0, 3_600_000)

    def setup(self) -> None:
        """Allocate rank 0's replica (the other ranks start at the first op)."""
        self.op_done = 0
        self.collectives = 0  # the last all-reduce rank 0 completed
        self.ring: Ring | None = None
        self.children: list[subprocess.Popen[bytes]] = []
        self.rank_reports: list[dict[str, Any]] = []
        self.x = mix(self.xp, self.p["state_size"], self.p["seed"], 0)
        synchronize(self.xp)
        self.pointers_initial = {"replica": pointer(self.x)}
        if self.p["adapters"]:
            self.rt.register_adapter(RankSet(self))

    def _start_ranks(self) -> None:
        """Start ranks 1..n-1 as children, connect the ring, hand everyone the current replica."""
        n = self.p["ranks"]
        # Children that exit are reaped by the kernel, never left as zombies
        # whose pids a restore of one rank would need.
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        listeners = []
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            sock.listen(4)
            listeners.append(sock)
        ports = [s.getsockname()[1] for s in listeners]
        for rank in range(1, n):
            cfg = {"rank": rank, "ranks": n, "ports": ports, "listener_fd": listeners[rank].fileno(),
                   "seed": self.p["seed"], "ops": self.p["ops"], "array": backend_name(self.xp),
                   "log_path": self.rt.config.log_path, "root_pid": os.getpid(),
                   "control_path": self.rt.config.control_path if self.p["adapters"] else "",
                   "slow_ms": self.p["slow_rank_ms"] if rank == self.p["slow_rank"] else 0.0}
            self.children.append(subprocess.Popen(
                [sys.executable, "-m", "cutbench.workloads.ranks", json.dumps(cfg)], pass_fds=(listeners[rank].fileno(),),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            listeners[rank].close()
        self.ring = Ring(0, n, listeners[0], ports, log=self.rt.log)
        if self.p["cut"] == "rank":
            self.rt.set_cut_target(self.children[self.p["cut_rank"] - 1].pid)
        sync = tag_of(self.op_done, SYNC_STEP)
        self.ring.send(sync, encode_state(self.op_done, self.x))
        self.ring.recv(sync)  # back round the ring: every rank holds the replica
        self.rt.log(f"ranks started: pids {[c.pid for c in self.children]} ports {ports}")

    def run_op(self, op: int) -> None:
        """Contribute, all-reduce, apply, publish, commit."""
        rt, xp = self.rt, self.xp
        if self.ring is None:
            self._start_ranks()
        assert self.ring is not None  # _start_ranks made it
        g = contribution(xp, self.x, self.p["seed"], 0, op)
        rt.point(op, "admit")
        total = allreduce(xp, self.ring, op, g)
        self.collectives = op
        rt.point(op, "allreduce")
        apply_sum(xp, self.x, total)
        self.simulate_work()
        synchronize(xp)
        self.op_done = op
        rt.point(op, "device_done")
        effect = replica_digest(xp, self.x)
        rt.point(op, "record")
        self.deliver(op, op, effect)

    def finish(self) -> None:
        """Gather every rank's last op and replica digest round the ring, then close it.

        Called before the last op (an instance given up after a save), it stops the ranks instead.
        """
        if self.ring is None:
            return
        if self.op_done < self.p["ops"]:
            for child in self.children:
                child.kill()
            self.ring.close()
            self.ring = None
            return
        gather = tag_of(self.p["ops"] + 1, 0)
        self.ring.send(gather, json.dumps([]).encode())
        self.rank_reports = json.loads(self.ring.recv(gather))
        self.ring.close()
        self.ring = None

    def report(self) -> dict[str, Any]:
        """Committed op, the replicas' agreement, each rank's op, the replica's address."""
        own = replica_digest(self.xp, self.x)
        digests = [own] + [r["checksum"] for r in self.rank_reports]
        agree = len(set(digests)) == 1
        domain_ops = {"rank0": self.op_done, **{f"rank{r['rank']}": r["op"] for r in self.rank_reports}}
        frame = self.report_frame(own if agree else digest("replicas disagree", digests), domain_ops,
                                  "every replica at the same op and equal")
        frame["self_check"]["ok"] = frame["self_check"]["ok"] and agree
        # Replicas that disagree are not the state of any op: the checksum above leaves the reference.
        return {**frame, "ranks": self.rank_reports, "pointers_initial": self.pointers_initial,
                "pointers_final": {"replica": pointer(self.x)}}

    def save_state(self, path: str) -> None:
        """Application-level checkpoint at an op boundary: the replicas are equal there, so rank 0's suffices."""
        save_state_file(path, {"op": self.op_done, "committed": self.committed}, {"x": self.x})

    def load_state(self, path: str) -> int:
        """Load rank 0's replica; the ranks start from it at the next op. Return the op to resume after."""
        header = load_state_into(path, self.xp, {"x": self.x})
        self.op_done, self.committed = header["op"], header["committed"]
        self.collectives = self.op_done
        return self.op_done

    @classmethod
    def reference(cls, params: dict[str, Any]) -> ReplayReference:
        """Digests of an uninterrupted run, every replica computed on NumPy without a network."""
        import numpy as np

        p = params
        return ReplayReference(lambda: RanksModel(np, p["seed"], p["state_size"], p["ranks"]))


# -- ranks 1..n-1: ``python -m cutbench.workloads.ranks CONFIG`` ----------------------------


def rank_main(cfg: dict[str, Any]) -> int:
    """Run one non-zero rank to the end of the run; return its exit code."""
    from cutbench.workloads.xp import get_xp

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # inherited SIG_IGN from rank 0; restore the default
    rank, ops = cfg["rank"], cfg["ops"]

    def log(message: str) -> None:
        with open(cfg["log_path"], "a") as fh:  # opened per line: nothing stays open across a cut
            fh.write(f"{time.time():.6f} pid={os.getpid()} rank={rank} {message}\n")

    try:
        xp = get_xp(cfg["array"])
        # Where this rank says which collective it completed last (the distributed pause reads it).
        control = ControlFile(cfg["control_path"]) if cfg.get("control_path") else None
        listener = socket.socket(fileno=cfg["listener_fd"])
        ring = Ring(rank, cfg["ranks"], listener, cfg["ports"], log=log, root_pid=cfg["root_pid"])
        sync, payload = ring.recv_next()
        ring.send(sync, payload)
        done, x = decode_state(xp, payload)
        if control is not None:
            control.set(f"rank_op_{rank}", done)
        for op in range(done + 1, ops + 1):
            apply_sum(xp, x, allreduce(xp, ring, op, contribution(xp, x, cfg["seed"], rank, op)))
            done = op
            if cfg.get("slow_ms"):
                time.sleep(cfg["slow_ms"] / 1000.0)  # late on purpose: after the collective, before it says so
            if control is not None:
                control.set(f"rank_op_{rank}", done)
        gather = tag_of(ops + 1, 0)
        reports = json.loads(ring.recv(gather))
        reports.append({"rank": rank, "op": done, "checksum": replica_digest(xp, x), "pid": os.getpid(),
                        "dropped": ring.dropped, "unserved": ring.unserved})
        ring.send(gather, json.dumps(reports).encode())
        ring.close()
        return 0
    except SystemExit as stop:
        log(f"stopped ({stop.code}): rank 0 is gone")
        return int(stop.code or 0)
    except BaseException as exc:
        log(f"failed: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(rank_main(json.loads(sys.argv[1])))

"""``nccl_ranks``: one process per GPU, an NCCL all-reduce every op.

The launched process is rank 0; it starts ranks ``1..world_size-1`` as its
children (one GPU each), so CRIU dumps the whole job as one tree and the CUDA
backends lock every rank. Every rank keeps a ``counter``-style state vector
(seed ``seed + 1000*rank``). Op *k* on every rank:

1. ``launch``: advance the local state (``counter``'s arithmetic);
2. ``collective``: all-reduce (sum) a vector in which each rank fills its own
   slots — its two state sums and its op number — so every rank learns every
   rank's state and epoch; each rank then folds the global sum into its state
   (the ranks' states become coupled: a rank restored at another epoch
   poisons the others);
3. rank 0 records the reduced vector's digest (the payload of op *k*),
   publishes it, waits for the ack and commits, like ``counter``.

Ground truth per op and per rank: :class:`NcclRanksReference` replays every
rank with NumPy. The report's ``domain_ops`` holds each rank's op as seen in
the first collective where they disagreed (else at the last op), so ranks at
different epochs are a ``mixed_epoch`` finding; a collective that hangs after a
restore is a ``deadlock`` (the harness watchdog).

Workers wait on a host barrier (``go`` slot in a shared file mapping) before
each op, so while rank 0 is parked outside a collective no rank has a
collective kernel in flight. NVLink multicast is always off
(``NCCL_NVLS_ENABLE=0``). ``transport = "socket"`` (default) also turns off
NCCL's peer-to-peer, shared-memory and cuMem paths, so ranks talk over
loopback TCP (which CRIU can dump); ``"default"`` lets NCCL choose.

Run a worker by hand: ``python -m cutbench.workloads.nccl_ranks --worker CONFIG RANK``.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Sequence

from cutbench.workloads.common import MASK, BaseWorkload
from cutbench.workloads.counter import apply_op, initial_state
from cutbench.workloads.xp import backend_name, device_uuid, is_device, pointer, synchronize
from cutbench.files import atomic_write

PHASES: tuple[str, ...] = ("admit", "launch", "collective", "device_done", "record", "publish", "ack", "commit")
# Always off (a multicast program can take the host's GPUs out of service).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SOCKET_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_CUMEM_ENABLE": "0", "NCCL_NET": "Socket"}
RANK_SEED = 1000
WAIT_S = 0.0002
JOIN_TIMEOUT_S = 120.0

# Shared rank file: slot 0 = go (last op rank 0 allowed), 1 = stop; then per rank.
_HEAD = 8
_PER_RANK = ("op", "s1", "s2", "ptr_initial", "ptr_final", "exited", "error")
_RANK_SLOTS = 8


def nccl_env(transport: str) -> dict[str, str]:
    """The NCCL environment for ``transport`` (multicast off in every case)."""
    env = dict(NCCL_ENV)
    if transport == "socket":
        env.update(SOCKET_ENV)
    return env


class RankFile:
    """A small shared file mapping of uint64 slots between the ranks (closed fd; CRIU re-maps it)."""

    SIZE = 4096

    def __init__(self, path: str | os.PathLike[str], create: bool = False):
        if create:
            Path(path).write_bytes(bytes(self.SIZE))
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, self.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        import numpy as np

        self.words = np.frombuffer(self._map, dtype=np.uint64)

    def get(self, index: int) -> int:
        """Slot ``index``."""
        return int(self.words[index])

    def set(self, index: int, value: int) -> None:
        """Store ``value`` (wrapped to 64 bits) in slot ``index``."""
        self.words[index] = value & MASK

    def rank(self, r: int, name: str) -> int:
        """Rank ``r``'s slot ``name``."""
        return self.get(_HEAD + r * _RANK_SLOTS + _PER_RANK.index(name))

    def set_rank(self, r: int, name: str, value: int) -> None:
        """Set rank ``r``'s slot ``name``."""
        self.set(_HEAD + r * _RANK_SLOTS + _PER_RANK.index(name), value)


def sums(xp: ModuleType, state: Any) -> tuple[Any, Any]:
    """The two wrapping sums of ``counter``'s digest, left on the device (0-d arrays)."""
    u = xp.uint64
    weights = xp.arange(state.size, dtype=u)
    weights *= u(2)
    weights += u(1)
    weights *= state
    return state.sum(dtype=u), weights.sum(dtype=u)


def contribution(xp: ModuleType, state: Any, rank: int, world: int, op: int) -> Any:
    """Rank ``rank``'s all-reduce input: its sums in slots 2r, 2r+1 and its op in slot 2W+r."""
    c = xp.zeros(3 * world, dtype=xp.uint64)
    s1, s2 = sums(xp, state)
    c[2 * rank] = s1
    c[2 * rank + 1] = s2
    c[2 * world + rank] = op
    return c


def fold(xp: ModuleType, state: Any, reduced: Any, world: int) -> None:
    """Couple the ranks: add the sum of every rank's state sums to element 0 (wrapping)."""
    state[0:1] += reduced[: 2 * world].sum(dtype=xp.uint64)


def op_digest(op: int, reduced_host: list[int]) -> str:
    """The payload of op ``op``: a hash of the reduced vector."""
    return hashlib.blake2b(f"{op}:{reduced_host}".encode(), digest_size=16).hexdigest()


def final_digest(rank_sums: Sequence[tuple[int, ...]]) -> str:
    """The checksum of the job: a hash of every rank's final state sums."""
    return hashlib.blake2b(f"final:{rank_sums}".encode(), digest_size=16).hexdigest()


class NcclRanksReference:
    """Every rank replayed with NumPy: payload and checksum after each op."""

    def __init__(self, seed: int, state_size: int, world: int):
        self.seed, self.state_size, self.world = seed, state_size, world

    @lru_cache(maxsize=None)
    def _run(self, upto: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        import numpy as np

        states = [initial_state(np, self.state_size, self.seed + RANK_SEED * r) for r in range(self.world)]
        payloads, finals = [""], [self._final(np, states)]
        for op in range(1, upto + 1):
            reduced = np.zeros(3 * self.world, dtype=np.uint64)
            for r, st in enumerate(states):
                apply_op(np, st, self.seed + RANK_SEED * r, op)
                reduced += contribution(np, st, r, self.world, op)
            for st in states:
                fold(np, st, reduced, self.world)
            payloads.append(op_digest(op, [int(x) for x in reduced]))
            finals.append(self._final(np, states))
        return tuple(payloads), tuple(finals)

    @staticmethod
    def _final(np: ModuleType, states: list[Any]) -> str:
        return final_digest([tuple(int(x) for x in sums(np, st)) for st in states])

    def payload(self, op: int) -> str:
        """The digest rank 0 publishes for op ``op``."""
        return self._run(max(16, 1 << op.bit_length()))[0][op]

    def checksum(self, op: int) -> str:
        """The job checksum after ``op`` ops."""
        return self._run(max(16, 1 << op.bit_length()))[1][op]


# -- communicators -------------------------------------------------------------


class Comm:
    """An all-reduce (sum, uint64) over one CuPy array, in place, on the current stream."""

    def __init__(self, kind: str, world: int, rank: int, uid_path: Path, xp: ModuleType):
        self.kind = self._pick(kind)
        self.xp = xp
        if self.kind == "cupy":
            from cupy.cuda import nccl  # type: ignore[import-not-found]

            self.nccl = nccl
            if rank == 0:
                uid = nccl.get_unique_id()  # bytes in CuPy >= 14, a tuple of ints before
                atomic_write(uid_path, json.dumps(bytes(uid).hex() if isinstance(uid, (bytes, bytearray)) else list(uid)))
            raw = json.loads(_wait_for(uid_path).read_text())
            self.comm = nccl.NcclCommunicator(world, bytes.fromhex(raw) if isinstance(raw, str) else tuple(raw), rank)
        else:
            import torch  # type: ignore[import-not-found]
            import torch.distributed as dist  # type: ignore[import-not-found]

            self.torch, self.dist = torch, dist
            torch.cuda.set_device(xp.cuda.Device().id)
            dist.init_process_group("nccl", init_method=f"file://{uid_path}", world_size=world, rank=rank)

    @staticmethod
    def _pick(kind: str) -> str:
        if kind != "auto":
            return kind
        try:
            from cupy.cuda import nccl  # type: ignore[import-not-found]

            return "cupy" if getattr(nccl, "available", True) else "torch"
        except Exception:
            return "torch"

    def allreduce(self, buf: Any) -> None:
        """Sum ``buf`` across ranks, in place."""
        if self.kind == "cupy":
            stream = self.xp.cuda.get_current_stream().ptr
            self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, self.nccl.NCCL_UINT64, self.nccl.NCCL_SUM, stream)
        else:
            self.dist.all_reduce(self.torch.from_dlpack(buf))




def _wait_for(path: Path, timeout: float = JOIN_TIMEOUT_S) -> Path:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear within {timeout:g}s")
        time.sleep(0.01)
    return path


class RankState:
    """What every rank does per op, independent of the harness (rank 0 adds the cut points)."""

    def __init__(self, xp: ModuleType, params: dict[str, Any], rank: int, rankfile: RankFile, comm: Comm):
        self.xp, self.p, self.rank, self.rf, self.comm = xp, params, rank, rankfile, comm
        self.world = int(params["world_size"])
        self.seed = int(params["seed"]) + RANK_SEED * rank
        self.state = initial_state(xp, int(params["state_size"]), self.seed)
        synchronize(xp)
        self.ptr_initial = pointer(self.state)
        rankfile.set_rank(rank, "ptr_initial", self.ptr_initial)
        self.reduced: Any = None

    def local(self, op: int) -> None:
        """Advance the local state by op ``op`` (enqueued)."""
        apply_op(self.xp, self.state, self.seed, op)

    def collective(self, op: int) -> None:
        """All-reduce this rank's contribution and fold the result in (enqueued)."""
        self.reduced = contribution(self.xp, self.state, self.rank, self.world, op)
        self.comm.allreduce(self.reduced)
        fold(self.xp, self.state, self.reduced, self.world)

    def done(self, op: int) -> None:
        """Wait for the device and publish this rank's progress."""
        synchronize(self.xp)
        self.rf.set_rank(self.rank, "op", op)

    def final(self) -> None:
        """Write this rank's final sums and pointer to the rank file."""
        s1, s2 = sums(self.xp, self.state)
        self.rf.set_rank(self.rank, "s1", int(s1))
        self.rf.set_rank(self.rank, "s2", int(s2))
        self.rf.set_rank(self.rank, "ptr_final", pointer(self.state))


def _setup_rank(xp: ModuleType, params: dict[str, Any], rank: int, rankfile_path: Path, uid_path: Path) -> RankState:
    for key, value in nccl_env(params["transport"]).items():
        os.environ[key] = value
    count = xp.cuda.runtime.getDeviceCount()
    if count < int(params["world_size"]):
        raise RuntimeError(f"nccl_ranks with world_size={params['world_size']} needs that many GPUs; {count} visible")
    xp.cuda.Device(rank).use()
    rf = RankFile(rankfile_path)
    comm = Comm(params["comm"], int(params["world_size"]), rank, uid_path, xp)
    return RankState(xp, params, rank, rf, comm)


class NcclRanks(BaseWorkload):
    """The ``nccl_ranks`` workload, rank 0 side (see module docstring)."""

    name: ClassVar[str] = "nccl_ranks"
    domains: ClassVar[frozenset[str]] = frozenset({"cpu", "cuda", "ipc", "receiver"})
    phases: ClassVar[tuple[str, ...]] = PHASES
    arrays: ClassVar[tuple[str, ...]] = ("cupy",)
    defaults: ClassVar[dict[str, Any]] = {
        **BaseWorkload.COMMON_DEFAULTS,
        "ops": 6,
        "state_size": 4096,
        "world_size": 2,
        "transport": "socket",
        "comm": "auto",
    }
    choices: ClassVar[dict[str, tuple[Any, ...]]] = {"transport": ("socket", "default"), "comm": ("auto", "cupy", "torch")}

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """At least two ranks; a state vector to reduce."""
        if p["world_size"] < 2 or p["state_size"] < 1:
            raise ValueError(f"world_size = {p['world_size']}, state_size = {p['state_size']}: need world_size >= 2, state_size >= 1")

    def __init__(self, rt: Any, params: dict[str, Any]):
        super().__init__(rt, params)
        self.world = int(params["world_size"])
        self.cursor = self.host_op = 0
        self.workers: list[subprocess.Popen] = []
        self.mismatch: dict[str, int] | None = None
        self.last_ops: dict[str, int] = {}

    def setup(self) -> None:
        """Start ranks 1..W-1, join the communicator, allocate every rank's state."""
        if not is_device(self.xp):
            raise RuntimeError("nccl_ranks needs GPUs: set workload.array = \"cupy\"")
        base = Path(self.rt.config.control_path).parent
        self.rankfile_path, self.uid_path = base / "ranks.ctl", base / "nccl.id"
        self.uid_path.unlink(missing_ok=True)
        RankFile(self.rankfile_path, create=True)
        env = {**os.environ, **nccl_env(self.p["transport"])}
        config_path = base / "config.json"
        for r in range(1, self.world):
            # Children of rank 0, in its session: CRIU dumps them with it and a
            # kill of the process group takes them all.
            self.workers.append(subprocess.Popen(
                [sys.executable, "-m", "cutbench.workloads.nccl_ranks", "--worker", str(config_path), str(r)],
                cwd=str(base), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, close_fds=True))
        self.me = _setup_rank(self.xp, self.p, 0, self.rankfile_path, self.uid_path)
        self.rf = self.me.rf

    def run_op(self, op: int) -> None:
        """Run op ``op`` on rank 0 through its eight phases; the workers follow the ``go`` slot."""
        rt, me = self.rt, self.me
        self.cursor = op
        rt.point(op, "admit")
        me.local(op)
        rt.point(op, "launch")
        self.rf.set(0, op)  # let the workers run op `op` (they stop at the barrier before op+1)
        me.collective(op)
        rt.point(op, "collective")
        me.done(op)
        rt.point(op, "device_done")
        reduced = [int(x) for x in me.reduced.get()]
        ops = {f"rank{r}": reduced[2 * self.world + r] for r in range(self.world)}
        self.last_ops = ops
        if self.mismatch is None and len(set(ops.values())) > 1:
            self.mismatch = ops
        self.last_digest = op_digest(op, reduced)
        self.host_op = op
        rt.point(op, "record")
        self.deliver(op, op, self.last_digest)

    def finish(self) -> None:
        """Let the workers finish, write rank 0's final sums, and reap them."""
        self.me.final()
        for w in self.workers:
            try:
                w.wait(timeout=JOIN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()

    def report(self) -> dict[str, Any]:
        """Rank 0's counters, the job checksum from every rank's final sums, pointers and epochs."""
        rf = self.rf
        rank_sums = [(rf.rank(r, "s1"), rf.rank(r, "s2")) for r in range(self.world)]
        exited = [r for r in range(1, self.world) if rf.rank(r, "exited") != 1]
        return {
            "host_op": self.committed,
            "cursor": self.cursor,
            "recorded_op": self.host_op,
            "checksum": final_digest(rank_sums) if not exited else f"ranks {exited} did not finish",
            "pointers_initial": {f"rank{r}": rf.rank(r, "ptr_initial") for r in range(self.world)},
            "pointers_final": {f"rank{r}": rf.rank(r, "ptr_final") for r in range(self.world)},
            "domain_ops": self.mismatch or self.last_ops,
            "rank_ops": {f"rank{r}": rf.rank(r, "op") for r in range(self.world)},
            "gpu_uuid": device_uuid(self.xp),
            "comm": self.me.comm.kind,
            "device": backend_name(self.xp),
        }

    @classmethod
    def reference(cls, params: dict[str, Any]) -> NcclRanksReference:
        """Ground truth for every rank (NumPy)."""
        return NcclRanksReference(int(params["seed"]), int(params["state_size"]), int(params["world_size"]))


def worker_main(config_path: str, rank: int) -> int:
    """Rank ``rank`` ≥ 1: follow rank 0's ``go`` slot through every op, then report and exit."""
    from cutbench.workloads.runtime import WorkloadConfig
    from cutbench.workloads.xp import get_xp

    config = WorkloadConfig.load(config_path)
    params = {**NcclRanks.defaults, **config.params}
    base = Path(config.control_path).parent
    parent = os.getppid()
    rf = None
    try:
        me = _setup_rank(get_xp("cupy"), params, rank, base / "ranks.ctl", base / "nccl.id")
        rf = me.rf
        for op in range(1, int(params["ops"]) + 1):
            while rf.get(0) < op:
                if os.getppid() != parent or rf.get(1):
                    return 3  # rank 0 is gone or asked to stop
                time.sleep(WAIT_S)
            me.local(op)
            me.collective(op)
            me.done(op)
        me.final()
        rf.set_rank(rank, "exited", 1)
        return 0
    except BaseException as exc:
        if rf is not None:
            rf.set_rank(rank, "error", 1)
        with open(base / f"rank{rank}.log", "a") as fh:
            fh.write(f"rank {rank} failed: {type(exc).__name__}: {exc}\n")
        return 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        sys.exit(worker_main(sys.argv[2], int(sys.argv[3])))
    print("usage: python -m cutbench.workloads.nccl_ranks --worker CONFIG RANK", file=sys.stderr)
    sys.exit(2)

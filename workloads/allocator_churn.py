"""``allocator_churn``: buffers allocated and freed every op, and a pointer table
traversed through raw addresses.

The workload keeps ``slots`` live buffers. Op *i* frees the buffer of slot
``i % slots``, allocates a new one of a size drawn from ``(seed, i)`` (on CuPy
the memory pool is then trimmed, so frees and allocations reach the driver),
writes a tag ``H(seed, i, slot)`` into its first word and data after it, and
stores its address in the pointer table. Then a traversal follows every table
entry: it checks that the address lies inside a live buffer (so a bad entry
is reported, never dereferenced), reads the tag and the last word through it,
and compares the tag with the one the host expects for that slot. On CuPy the
traversal is a kernel reading device memory through device pointers; on
NumPy it reads host memory through host addresses.

The effect of op *i* is a digest of what the traversal read; the reference
computes the same values straight from the buffers' contents, never through
an address. ``pointer_table_ok`` in the report is false if any traversal in
the run found an entry that no longer leads to its buffer.

``table = "device"`` keeps the table with the buffers (device memory, or
private host memory on NumPy). ``table = "shared"`` keeps it in a file-backed
shared mapping (state shared with another process through a file, domain
``shared_file``): a CRIU image does not hold such a mapping's contents, so after a
rollback the restored process sees entries its crashed incarnation wrote.
"""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import Any, ClassVar

from cutbench.workloads.common import (
    MASK,
    BaseWorkload,
    ReplayReference,
    check_range,
    digest,
    host_ints,
    load_state_file,
    save_state_file,
    splitmix,
    sums,
)
from cutbench.workloads.control import PHASES
from cutbench.workloads.counter import mix
from cutbench.workloads.xp import is_device, pointer, synchronize, to_host

TAG_SALT = 0x7A6_0F_B0F
TRAVERSE_SRC = r"""
extern "C" __global__ void traverse(const unsigned long long* table, const unsigned long long* bases,
                                    const unsigned long long* lens, const unsigned long long* expect,
                                    int k, unsigned long long* out) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= k) return;
    unsigned long long p = table[s], ok = 0, val = 0;
    for (int j = 0; j < k; ++j) {
        unsigned long long b = bases[j], end = b + 8ULL * lens[j];
        if (b != 0 && p >= b && p < end && (p - b) % 8 == 0) {
            const unsigned long long* q = (const unsigned long long*)p;
            unsigned long long last = (end - p) / 8 - 1;
            ok = (q[0] == expect[s]) ? 1ULL : 0ULL;
            val = q[0] + q[last];
            break;
        }
    }
    out[2 * s] = ok;
    out[2 * s + 1] = val;
}
"""


def tag(seed: int, op: int, slot: int) -> int:
    """The tag written into the first word of the buffer op ``op`` allocates in ``slot``."""
    return splitmix(seed ^ TAG_SALT, op, slot)


class ChurnModel:
    """The live buffers, what the host expects of each slot, and the churn step."""

    def __init__(self, xp: ModuleType, seed: int, slots: int, min_elems: int, max_elems: int):
        self.xp = xp
        self.seed, self.slots = seed, slots
        self.min_elems, self.max_elems = min_elems, max_elems
        self.bufs: list[Any] = [None] * slots
        self.expect = [0] * slots  # host: tag each slot's buffer must carry
        self.born = [0] * slots  # host: op that allocated each slot's buffer
        for slot in range(slots):  # op 0 fills every slot
            self.churn(0, slot)

    def elems(self, op: int, slot: int) -> int:
        """The element count of the buffer op ``op`` allocates."""
        return self.min_elems + splitmix(self.seed, op, slot) % (self.max_elems - self.min_elems + 1)

    def churn(self, op: int, slot: int) -> None:
        """Free ``slot``'s buffer and allocate and fill a new one."""
        xp = self.xp
        self.bufs[slot] = None
        if is_device(xp):  # return the freed block to the driver: real cudaFree/cudaMalloc churn
            xp.get_default_memory_pool().free_all_blocks()
        buf = mix(xp, self.elems(op, slot), self.seed ^ slot, op)
        buf[0] = xp.uint64(tag(self.seed, op, slot))
        self.bufs[slot] = buf
        self.expect[slot] = tag(self.seed, op, slot)
        self.born[slot] = op

    def direct(self) -> list[int]:
        """What a correct traversal reads, taken from the buffers themselves: (ok=1, first+last) per slot."""
        out: list[int] = []
        for buf in self.bufs:
            first_last = host_ints(self.xp.concatenate([buf[:1], buf[-1:]]))
            out += [1, (first_last[0] + first_last[1]) & MASK]
        return out

    def checksum(self) -> str:
        """Digest of every live buffer's contents and birth op, slot by slot."""
        return digest([v for buf in self.bufs for v in host_ints(sums(self.xp, buf))], self.born)

    def step(self, op: int) -> str:
        """Op ``op`` without cut points (the reference's replay)."""
        self.churn(op, op % self.slots)
        return digest(op, self.direct())


class AllocatorChurn(BaseWorkload):
    """The ``allocator_churn`` workload (see module docstring)."""

    name: ClassVar[str] = "allocator_churn"
    phases: ClassVar[tuple[str, ...]] = PHASES
    defaults: ClassVar[dict[str, Any]] = {
        **BaseWorkload.COMMON_DEFAULTS, "slots": 8, "min_elems": 256, "max_elems": 4096, "table": "device",
    }
    choices: ClassVar[dict[str, tuple[Any, ...]]] = {"table": ("device", "shared")}
    # A shared table is memory shared with other processes through a file.
    param_domains: ClassVar[dict[tuple[str, Any], str]] = {("table", "shared"): "shared_file"}

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """Slot count and buffer sizes."""
        check_range("slots", p["slots"], 1, 1024)
        check_range("min_elems", p["min_elems"], 2)
        check_range("max_elems", p["max_elems"], p["min_elems"], 1 << 26)

    def setup(self) -> None:
        """Allocate the buffers and the pointer table; fill the table."""
        p, xp = self.p, self.xp
        self.table_ok = True  # sticky: every traversal so far found every buffer
        self._kernel: Any = None
        self.model = ChurnModel(xp, p["seed"], p["slots"], p["min_elems"], p["max_elems"])
        if p["table"] == "shared":
            import numpy as np

            # np.memmap maps the file MAP_SHARED; the mapping (not an open
            # file) is what the process holds across cut points.
            self.table = np.memmap(self.rt.workdir / "pointer_table", dtype=np.uint64, mode="w+", shape=(p["slots"],))
        else:
            self.table = xp.zeros(p["slots"], dtype=xp.uint64)
        for slot in range(p["slots"]):
            self._publish_pointer(slot)
        synchronize(xp)
        self.pointers_initial = {"table": pointer(self.table)}

    def _publish_pointer(self, slot: int) -> None:
        self.table[slot] = pointer(self.model.bufs[slot])

    def traverse(self) -> list[int]:
        """Follow every table entry; return ``[ok, first+last]`` per slot (ok = 0: a bad entry)."""
        xp, model = self.xp, self.model
        bases = [pointer(b) for b in model.bufs]
        lens = [int(b.size) for b in model.bufs]
        if is_device(xp):
            return self._traverse_device(bases, lens)
        out: list[int] = []
        for slot, entry in enumerate(int(v) for v in to_host(self.table)):
            ok = val = 0
            for base, n in zip(bases, lens):
                if base <= entry < base + 8 * n and (entry - base) % 8 == 0:
                    first = ctypes.c_uint64.from_address(entry).value
                    last = ctypes.c_uint64.from_address(base + 8 * (n - 1)).value
                    ok, val = int(first == model.expect[slot]), (first + last) & MASK
                    break
            out += [ok, val]
        return out

    def _traverse_device(self, bases: list[int], lens: list[int]) -> list[int]:
        xp, k = self.xp, self.p["slots"]
        if self._kernel is None:
            self._kernel = xp.RawKernel(TRAVERSE_SRC, "traverse")
        u = xp.uint64
        table = xp.asarray(self.table, dtype=u)  # a shared table is host memory: copy it over
        out = xp.zeros(2 * k, dtype=u)
        args = (table, xp.asarray(bases, dtype=u), xp.asarray(lens, dtype=u), xp.asarray(self.model.expect, dtype=u),
                xp.int32(k), out)
        self._kernel(((k + 127) // 128,), (128,), args)
        return host_ints(out)

    def run_op(self, op: int) -> None:
        """Free, allocate, publish the new address, traverse, publish the result, commit."""
        rt, model = self.rt, self.model
        slot = op % self.p["slots"]
        rt.point(op, "admit")
        model.churn(op, slot)
        self._publish_pointer(slot)
        rt.point(op, "launch")
        self.simulate_work()
        synchronize(self.xp)
        rt.point(op, "device_done")
        seen = self.traverse()
        self.table_ok = self.table_ok and all(seen[0::2])
        rt.point(op, "record")
        self.deliver(op, op, digest(op, seen))

    def report(self) -> dict[str, Any]:
        """Committed op, contents checksum, whether the pointer table held up, table address."""
        ok = self.table_ok and all(self.traverse()[0::2])
        return {
            **self.report_frame(self.model.checksum()),
            "pointer_table_ok": ok,
            "self_check": {"ok": ok, "what": "every traversal found every slot's buffer"},
            "pointers_initial": self.pointers_initial,
            "pointers_final": {"table": pointer(self.table)},
        }

    def save_state(self, path: str) -> None:
        """Application-level checkpoint: buffer contents and host bookkeeping, never addresses."""
        m = self.model
        header = {"committed": self.committed, "born": m.born, "expect": [str(t) for t in m.expect],
                  "table_ok": self.table_ok}
        save_state_file(path, header, {f"slot{i}": b for i, b in enumerate(m.bufs)})

    def load_state(self, path: str) -> int:
        """Re-allocate every slot from :meth:`save_state`'s file and rebuild the pointer
        table from the new addresses; return the op to resume after."""
        header, arrays = load_state_file(path)
        m, xp = self.model, self.xp
        for slot in range(self.p["slots"]):
            m.bufs[slot] = xp.asarray(arrays[f"slot{slot}"])
            self._publish_pointer(slot)
        synchronize(xp)
        m.born, m.expect = header["born"], [int(t) for t in header["expect"]]
        self.table_ok, self.committed = header["table_ok"], header["committed"]
        return self.committed

    @classmethod
    def reference(cls, params: dict[str, Any]) -> ReplayReference:
        """Traversal results and checksums of an uninterrupted run, read without addresses, on NumPy."""
        import numpy as np

        p = params
        return ReplayReference(lambda: ChurnModel(np, p["seed"], p["slots"], p["min_elems"], p["max_elems"]))

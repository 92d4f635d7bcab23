"""A program's system-call boundaries: which calls count, how a boundary is named, how two recordings compare.

A cut of phase ``syscall`` at op *k* lands just before the program's *k*-th counted call: a call of
``plan.syscalls`` that makes an effect visible or durable (a write to its stdout or stderr, to a socket or to a
file within its directory, an ``fsync`` of one, a ``rename`` or ``unlink`` there, the root process's
``exit_group``). The uninterrupted runs record the sequence (:class:`Boundary` each); the boundary between calls
*k-1* and *k* is named after both ("after write(stdout) `done 17`, before pwrite64(file:jobs.db-wal)").

Pure data, standard library only: the tracer process (:mod:`cutbench.harness.observer.tracer`) reads
:data:`CALLS` too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

# The calls that may make an effect visible or durable, by x86-64 number, and how their arguments read: "fd"
# (a descriptor, then a buffer of the third argument's length), "iov" (a descriptor, then an iovec array), "msg"
# (a socket, then a message header), "sync" (a descriptor), "map" (an address in a mapped file), "paths:I,J"
# (the argument indices of path names), "exit" (the process ends).
CALLS: dict[str, tuple[int, str]] = {
    "write": (1, "fd"), "pwrite64": (18, "fd"), "writev": (20, "iov"), "pwritev": (296, "iov"), "pwritev2": (328, "iov"),
    "sendto": (44, "fd"), "sendmsg": (46, "msg"), "sendmmsg": (307, "msg"),
    "fsync": (74, "sync"), "fdatasync": (75, "sync"), "msync": (26, "map"),
    "rename": (82, "paths:0,1"), "renameat": (264, "paths:1,3"), "renameat2": (316, "paths:1,3"),
    "unlink": (87, "paths:0"), "unlinkat": (263, "paths:1"),
    "exit_group": (231, "exit"),
}
# plan.syscalls's default: every call above.
DEFAULT_CALLS: tuple[str, ...] = tuple(CALLS)
HEAD = 32  # characters of what a write carried, in a boundary's name


@dataclass(frozen=True)
class Boundary:
    """One counted call of an uninterrupted run: its number, the call, what it acts on, its size and the start of
    what it wrote."""

    n: int
    call: str
    target: str
    bytes: int = 0
    head: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Boundary":
        """A boundary from its stored form (the tracer's line, a recorded reference's entry)."""
        return cls(int(data["n"]), str(data["call"]), str(data["target"]), int(data.get("bytes") or 0),
                   str(data.get("head") or ""))

    def to_dict(self) -> dict[str, Any]:
        """Its stored form."""
        return asdict(self)

    def words(self) -> str:
        """Return the boundary in words: ``write(stdout) `done 17 ab12…``` , ``fsync(file:jobs.db)``, ``exit_group``."""
        if self.call == "exit_group":
            return "exit_group"
        shown = " ".join(self.head.split())
        if shown and shown.isprintable():
            head = f" `{shown[:HEAD]}{'…' if len(shown) > HEAD or len(self.head) < self.bytes else ''}`"
        elif self.head or self.bytes:  # bytes of a file format, a newline alone: their size says more
            head = f" {self.bytes} bytes" if self.bytes != 1 or self.head != "\n" else " `\\n`"
        else:
            head = ""
        return f"{self.call}({self.target}){head}"

    def same_call(self, other: "Boundary") -> bool:
        """Whether two recordings' boundaries are the same call on the same target (what they wrote may differ)."""
        return (self.call, self.target) == (other.call, other.target)


def name(boundaries: Sequence[Boundary], k: int) -> str:
    """The boundary before counted call ``k`` (1-based) of ``boundaries``, in words: "after write(stdout) `done 17`,
    before pwrite64(file:jobs.db-wal)"; "before the first …" for ``k`` = 1; "" when ``k`` is out of range."""
    if not 1 <= k <= len(boundaries):
        return ""
    before = f"before {boundaries[k - 1].words()}"
    return f"after {boundaries[k - 2].words()}, {before}" if k > 1 else f"{before}, the first counted call"


def first_difference(a: Sequence[Boundary], b: Sequence[Boundary]) -> str:
    """Where two recordings' counted calls first differ, in words ("boundary 37: write(stdout) … in one run,
    fsync(file:x) in the other"); "" when they are the same calls on the same targets."""
    for one, two in zip(a, b):
        if not one.same_call(two):
            return f"boundary {one.n}: {one.words()} in one run, {two.words()} in the other"
    if len(a) != len(b):
        shorter = min(len(a), len(b))
        return f"boundary {shorter + 1}: one run made {len(a)} counted calls, the other {len(b)}"
    return ""

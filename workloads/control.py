"""The shared-file control channel between the harness and a workload.

A small file that both sides map with ``MAP_SHARED``. The harness arms a cut
point, the workload parks there and says so, the harness runs the checkpoint
pipeline and releases it. A shared *file* mapping is used (not a pipe, not
anonymous shared memory) because CRIU re-maps the same file on restore, so
the restored workload and the harness still talk through it afterwards.

Every field is a little-endian signed 64-bit slot; aligned 8-byte stores are
not torn on the machines cutbench runs on. Only the harness writes the
``arm_*``/``release_seq``/``incarnation``/``stop`` slots and only the workload
writes ``parked_seq`` and the ``progress_*`` slots, so no locking is needed.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

# Phases of one operation, in order (DESIGN.md "Operation lifecycle"). A cut
# point is the boundary *after* the phase.
PHASES: tuple[str, ...] = ("admit", "launch", "device_done", "record", "publish", "ack", "commit")

MAGIC = 0x6375_7462_656E_6368  # "cutbench"
VERSION = 2
SIZE = 4096
_SLOTS = (
    "magic",
    "version",
    "arm_seq",  # bumped by the harness each time it arms a cut
    "arm_op",
    "arm_phase",  # index into the workload's phase list
    "parked_seq",  # the workload sets it to arm_seq when parked
    "release_seq",  # the harness sets it to arm_seq to release
    "progress_op",
    "progress_phase",
    "progress_count",  # monotonic count of cut points passed (watchdog input)
    "incarnation",  # epoch: bumped by the harness after every restore
    "pid",  # the workload's pid, written at start
    "stop",  # harness asks the workload to stop at the next point
    "done",  # workload finished its last op and wrote its report
    # Application-level checkpoints (the `app` backend): the harness asks for a
    # save at the next op boundary; the path is in the text area.
    "save_seq",  # harness: bumped to request a save
    "saved_seq",  # workload: set to save_seq once saved (negative: cannot save)
    "saved_op",  # workload: the op the save covers
    "save_hold",  # harness: 1 = wait at the boundary after saving until it is 0
    "load_count",  # workload: bumped after a process loaded a saved state
    # Multi-process workloads: the one process a cut checkpoints instead of the
    # whole tree (0: the workload's root and every process under it).
    "cut_pid",  # workload
    # Effects (the receiver's external domain): the highest effect id this
    # workload has sent, written right after the send (the coordinator's
    # evidence for the fence of a cut: what the image's process had sent).
    "sent_effect",  # workload
    "acked_effect",  # workload: the highest effect id whose ack it received
    "on_device",  # workload: 1 when its arrays live on a CUDA device (the "cuda" domain)
    # Ground truth for "restored or started anew": a workload process that starts
    # from op 1 (not a restored image, not an application-level --resume) bumps it.
    "fresh_starts",  # workload
    # A workload process that, started afresh, continued from the application's own checkpoint on disk (a
    # simulation's -cpi, a training script's resume) bumps ``own_resumes`` and notes the op it resumed after.
    "own_resumes",  # workload
    "own_resumed_op",  # workload
    # Semantic adapters (cutbench.workloads.adapters): one request at a time, harness -> workload. The harness
    # writes verb, epoch, deadline and op range, then bumps adapt_seq; the workload answers in the reply area
    # (JSON naming the seq) and then sets adapted_seq.
    "adapters",  # workload: how many adapters it registered
    "adapt_seq",  # harness: bumped per request
    "adapt_verb",  # harness: index into cutbench.workloads.adapters.VERBS
    "adapt_epoch",  # harness: the cut's epoch (the cut index within the trial, counted from 1)
    "adapt_deadline_ns",  # harness: wall-clock time (time.time_ns) by which prepare must have answered
    "adapt_lo",  # harness: classify the effect ids adapt_lo..adapt_hi
    "adapt_hi",
    "adapted_seq",  # workload: the adapt_seq it answered last
    # Multi-rank workloads: the last collective (op) each non-zero rank completed, written by that rank.
    "rank_op_1",
    "rank_op_2",
    "rank_op_3",
)
# A length-prefixed UTF-8 string (the app backend's save path) lives here,
TEXT_OFFSET = 2048
# and the adapters' reply (JSON) here, each area ending where the next begins.
REPLY_OFFSET = 3072
_INDEX = {name: i for i, name in enumerate(_SLOTS)}


class ControlFile:
    """A mapped control file. ``ControlFile.create(path)`` makes a fresh one."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR)
        try:
            # The fd is closed right away: CRIU restores the mapping from the
            # path, and an open fd would be one more file to restore.
            self._map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        if self.get("magic") != MAGIC:
            raise ValueError(f"{self.path} is not a cutbench control file")

    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> "ControlFile":
        """Write a zeroed control file at ``path`` and map it."""
        buf = bytearray(SIZE)
        struct.pack_into("<q", buf, 0, MAGIC - (1 << 64) if MAGIC >= 1 << 63 else MAGIC)
        struct.pack_into("<q", buf, 8, VERSION)
        Path(path).write_bytes(bytes(buf))
        return cls(path)

    def get(self, name: str) -> int:
        """The value of slot ``name``."""
        (value,) = struct.unpack_from("<q", self._map, 8 * _INDEX[name])
        return value & ((1 << 64) - 1) if name == "magic" else value

    def position(self, n_phases: int) -> int:
        """Where the workload last stood, as one index in execution order: ``progress_op * n_phases +
        progress_phase`` (the scale of ``cutbench.harness.model.plan.position``)."""
        return self.get("progress_op") * n_phases + self.get("progress_phase")

    def set(self, name: str, value: int) -> None:
        """Store ``value`` in slot ``name``."""
        struct.pack_into("<q", self._map, 8 * _INDEX[name], value)

    def set_text(self, text: str, *, area: int = TEXT_OFFSET) -> None:
        """Store a short string in a text area: the save path's (``TEXT_OFFSET``, the default) or the
        adapters' reply (``REPLY_OFFSET``), each at most 1,016 bytes of UTF-8; ValueError when it does not fit."""
        data = text.encode()
        end = REPLY_OFFSET if area == TEXT_OFFSET else SIZE
        if len(data) > end - area - 8:
            raise ValueError(f"control text of {len(data)} bytes does not fit")
        self._map[area + 8 : area + 8 + len(data)] = data
        struct.pack_into("<q", self._map, area, len(data))

    def get_text(self, *, area: int = TEXT_OFFSET) -> str:
        """The string stored by :meth:`set_text` in ``area`` ("" when none; undecodable bytes replaced)."""
        end = REPLY_OFFSET if area == TEXT_OFFSET else SIZE
        (n,) = struct.unpack_from("<q", self._map, area)
        n = min(max(0, n), end - area - 8)
        return bytes(self._map[area + 8 : area + 8 + n]).decode(errors="replace")

    def snapshot(self) -> dict[str, int]:
        """All slots as a dict (for logs and timelines)."""
        return {name: self.get(name) for name in _SLOTS}

    # -- harness side -------------------------------------------------------
    def arm(self, op: int, phase_index: int) -> int:
        """Arm a park at ``(op, phase)``; return the arm sequence number to wait for."""
        self.set("arm_op", op)
        self.set("arm_phase", phase_index)
        seq = self.get("arm_seq") + 1
        self.set("arm_seq", seq)  # written last: the workload checks it first
        return seq

    def release(self, seq: int) -> None:
        """Let a workload parked at arm sequence ``seq`` continue."""
        self.set("release_seq", seq)

    def hold(self, seq: int) -> None:
        """Keep (or put back) a workload parked at arm sequence ``seq`` until :meth:`release`."""
        self.set("release_seq", min(self.get("release_seq"), seq - 1))

    def close(self) -> None:
        """Unmap the file."""
        self._map.close()

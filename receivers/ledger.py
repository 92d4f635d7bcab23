"""Delivery-mode semantics: what each write request decides and what it stores.

Pure logic, no I/O. The server's single writer feeds requests through
``Ledger.apply`` one at a time, collects the resulting ``Changes`` of a whole
batch, has the store commit them in one transaction, and only then replies.
Because there is exactly one writer, the in-memory view always equals the
store after each commit; after a store failure or a restart the ledger is
rebuilt from the store (``Ledger.rebuild``), which stays the single truth.
The ledger holds only what deciding needs; counts a client asks for are read
from the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from cutbench.errors import ProtocolError

from .protocol import reply

@dataclass(slots=True)
class Command:
    """One validated write request as it arrived on a connection."""

    mtype: str
    msg: dict[str, Any]
    connection_id: int
    client: str
    received_at: float


@dataclass
class Changes:
    """Store mutations of one batch, in the order the store must apply them."""

    rows: list[tuple] = field(default_factory=list)  # schema.ROW_COLUMNS tuples to insert
    decisions: list[tuple[str, int, int]] = field(default_factory=list)  # (decision, decided_seq, arrival_seq)
    trials: list[tuple[str, str, int, float]] = field(default_factory=list)  # (trial, mode, opened_seq, opened_at)
    fences: list[tuple[int, str, int, float]] = field(default_factory=list)  # (arrival_seq, trial, fence, received_at)
    last_seq: int = 0

    def __bool__(self) -> bool:
        return bool(self.rows or self.decisions or self.trials or self.fences)


@dataclass
class TrialState:
    mode: str
    fence: int | None = None
    # ops applied (idempotent) or committed (fenced); at_least_once decides nothing from it and keeps none
    done: set[int] = field(default_factory=set)
    prepared: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # op -> [(seq, epoch)] still open


class Ledger:
    """In-memory mirror of the committed store state that decides every write."""

    def __init__(self, last_seq: int = 0):
        self.trials: dict[str, TrialState] = {}
        self.last_seq = last_seq  # last arrival_seq handed out (durable once its batch commits)

    @classmethod
    def rebuild(
        cls,
        trials: Iterable[tuple[str, str, int | None]],
        open_rows: Iterable[tuple[int, str, int, int, str]],
        last_seq: int,
    ) -> "Ledger":
        """Return a ledger equal to a store's state.

        ``trials``: (trial, mode, fence); ``open_rows``: (arrival_seq, trial,
        op_id, epoch, decision) for rows that are applied, committed or prepared.
        """
        led = cls(last_seq)
        for trial, mode, fence in trials:
            led.trials[trial] = TrialState(mode, fence)
        for seq, trial, op, epoch, decision in open_rows:
            st = led.trials.get(trial)
            if st is None:
                continue
            if decision in ("applied", "committed"):
                st.done.add(op)
            elif decision == "prepared":
                st.prepared.setdefault(op, []).append((seq, epoch))
        return led

    def _seq(self) -> int:
        self.last_seq += 1
        return self.last_seq

    def _trial(self, name: str, *modes: str) -> TrialState:
        st = self.trials.get(name)
        if st is None:
            raise ProtocolError("unknown_trial", f"trial {name[:80]!r} was never opened; send open_trial first")
        if modes and st.mode not in modes:
            raise ProtocolError(
                "wrong_mode", f"trial {name[:80]!r} is in mode {st.mode}; this request needs {' or '.join(modes)}"
            )
        return st

    def apply(self, cmd: Command, changes: Changes) -> dict[str, Any]:
        """Decide ``cmd``, append its store mutations to ``changes``, return its ack.

        Raises ``ProtocolError`` (before changing anything) when the request
        cannot be served, e.g. an unopened trial or a fence moving backwards.
        """
        handler = getattr(self, "_" + cmd.mtype)
        out = handler(cmd, cmd.msg, changes)
        changes.last_seq = self.last_seq
        return out

    # -- handlers: validate first, mutate after -------------------------------------------

    def _open_trial(self, cmd: Command, m: dict, ch: Changes) -> dict:
        trial, mode = m["trial"], m["mode"]
        st = self.trials.get(trial)
        if st is not None:
            if st.mode != mode:
                raise ProtocolError("mode_conflict", f"trial {trial[:80]!r} is already open in mode {st.mode}")
            return reply("ack", "open_trial", m.get("id"), trial=trial, mode=mode, existing=True)
        seq = self._seq()
        self.trials[trial] = TrialState(mode)
        ch.trials.append((trial, mode, seq, cmd.received_at))
        return reply("ack", "open_trial", m.get("id"), trial=trial, mode=mode, existing=False, arrival_seq=seq)

    def _delivery_row(self, cmd: Command, seq: int, kind: str, decision: str) -> tuple:
        m = cmd.msg
        sender = m.get("sender")
        return (seq, m["trial"], m["op_id"], m["attempt"], m["epoch"], m["digest"],
                cmd.connection_id, cmd.client, kind, decision, seq, cmd.received_at, -1 if sender is None else sender)

    def _publish(self, cmd: Command, m: dict, ch: Changes) -> dict:
        st = self._trial(m["trial"])
        if st.mode == "fenced":
            return self._prepare(cmd, m, ch)
        op = m["op_id"]
        if st.mode == "idempotent" and op in st.done:
            decision = "suppressed"
        else:
            decision = "applied"
            if st.mode == "idempotent":
                st.done.add(op)
        seq = self._seq()
        ch.rows.append(self._delivery_row(cmd, seq, "publish", decision))
        return self._delivery_ack(m, "publish", decision, seq)

    def _prepare(self, cmd: Command, m: dict, ch: Changes) -> dict:
        st = self._trial(m["trial"], "fenced")
        op = m["op_id"]
        seq = self._seq()
        if op in st.done:
            decision = "suppressed"  # the op is already committed; this delivery can never be
        else:
            decision = "prepared"
            st.prepared.setdefault(op, []).append((seq, m["epoch"]))
        ch.rows.append(self._delivery_row(cmd, seq, m["type"], decision))
        return self._delivery_ack(m, m["type"], decision, seq)

    @staticmethod
    def _delivery_ack(m: dict, re: str, decision: str, seq: int) -> dict:
        return reply("ack", re, m.get("id"), trial=m["trial"], op_id=m["op_id"], attempt=m["attempt"],
                     epoch=m["epoch"], decision=decision, arrival_seq=seq)

    def _commit(self, cmd: Command, m: dict, ch: Changes) -> dict:
        trial, op, epoch = m["trial"], m["op_id"], m.get("epoch")
        st = self._trial(trial, "fenced")
        rid = m.get("id")
        if op in st.done:
            # Commit is idempotent: a repeat changes nothing and says so.
            return reply("ack", "commit", rid, trial=trial, op_id=op, decision="committed", already=True)
        candidates = [p for p in st.prepared.get(op, ()) if epoch is None or p[1] == epoch]
        if st.fence is None or op > st.fence:
            reason = f"op {op} is past the fence {st.fence}"
        elif not candidates:
            reason = f"op {op} has no open prepared delivery" + ("" if epoch is None else f" at epoch {epoch}")
        else:
            reason = None
        seq = self._seq()
        if reason is not None:
            # A refused commit is recorded: the oracle may want to see who tried.
            ch.rows.append((seq, trial, op, 0, -1 if epoch is None else epoch, "", cmd.connection_id,
                            cmd.client, "commit", "rejected", seq, cmd.received_at, -1))
            return reply("ack", "commit", rid, trial=trial, op_id=op, decision="rejected", reason=reason,
                         arrival_seq=seq)
        target_seq, target_epoch = candidates[-1]  # the latest prepared delivery wins
        st.prepared[op].remove((target_seq, target_epoch))
        if not st.prepared[op]:
            del st.prepared[op]
        st.done.add(op)
        ch.decisions.append(("committed", seq, target_seq))
        return reply("ack", "commit", rid, trial=trial, op_id=op, decision="committed", already=False,
                     epoch=target_epoch, committed_seq=target_seq, arrival_seq=seq)

    def _abort(self, cmd: Command, m: dict, ch: Changes) -> dict:
        trial = m["trial"]
        st = self._trial(trial, "fenced")
        op, from_epoch = m.get("op_id"), m.get("from_epoch")
        seq = self._seq()
        aborted: list[int] = []
        ops = [op] if op is not None else list(st.prepared)
        for o in ops:
            keep = []
            for p_seq, p_epoch in st.prepared.get(o, ()):
                if op is not None or p_epoch >= from_epoch:  # type: ignore[operator]  # validate(): one of the two is set
                    aborted.append(p_seq)
                    ch.decisions.append(("aborted", seq, p_seq))
                else:
                    keep.append((p_seq, p_epoch))
            if keep:
                st.prepared[o] = keep
            else:
                st.prepared.pop(o, None)
        return reply("ack", "abort", m.get("id"), trial=trial, aborted=len(aborted), arrival_seq=seq)

    def _fence(self, cmd: Command, m: dict, ch: Changes) -> dict:
        trial, fence = m["trial"], m["fence"]
        st = self._trial(trial, "fenced")
        if st.fence is not None and fence < st.fence:
            raise ProtocolError("fence_backwards", f"fence may not move backwards: {fence} < {st.fence}")
        seq = self._seq()
        st.fence = fence
        ch.fences.append((seq, trial, fence, cmd.received_at))
        return reply("ack", "fence", m.get("id"), trial=trial, fence=fence, arrival_seq=seq)

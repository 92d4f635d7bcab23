"""Semantic adapters, workload side: a subsystem that freezing cannot make consistent joins a cut.

A process image holds the process. It does not hold a consumer offset kept by
a broker, a request log on disk, or the replies already out on the wire; a
restore of the image alone leaves those at another moment than the process.
An **adapter** is the narrow transition such a subsystem exports so that it
joins the cut instead (the two phases of ``docs/certificates.md``):

- ``prepare(epoch, deadline)``: reach a state the cut can hold (stop publishing, note the offset) and
  return :class:`Ready` with that state in words, or a reason it cannot by ``deadline`` (a refusal);
- ``commit(epoch)``: the cut's image exists; go on;
- ``abort(epoch)``: the cut was called off; undo ``prepare`` and go on;
- ``restored(epoch)``: this process is the restored image of the cut ``epoch``; bring the subsystem back
  to the state ``prepare`` noted (seek the offset back), then go on as after ``commit``;
- ``classify(key)``: for an effect (its id) that may already be out, what this process will do with it:
  ``committed`` (its log says delivered: it will not be sent again), ``replay`` (it will be sent again)
  or ``discard`` (it will never be sent). An adapter of an input that makes no effects (a consumer
  offset) sets ``effects = False``, is not asked, and need not have ``classify``.

An adapter that keeps its domain at the cut by itself until ``commit``,
``abort`` or ``restored``, whatever the process does meanwhile (a drained
kernel that is not relaunched), sets ``holds = True``: its domain joins even
a cut during which the process runs on (a split window, an asynchronous
cut). Any other adapter's domain joins only a cut at which the process stays
parked until its image is taken.

A workload registers one adapter per state domain it declares
(:meth:`cutbench.workloads.runtime.Runtime.register_adapter`). The harness
never imports workload code: it asks over the control file (one request at a
time, slots ``adapt_*``), and :class:`AdapterDesk` answers at the workload's
next cut point or while it is parked there. Whatever an adapter raises or
returns that is not an answer goes back as an error in its own words; the
harness treats it as a refusal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cutbench.files import read_number, write_number
from cutbench.workloads.control import REPLY_OFFSET

VERBS: tuple[str, ...] = ("prepare", "commit", "abort", "restored", "classify")
CLASSES: tuple[str, ...] = ("committed", "replay", "discard")
# An answer is cut to this many characters of reason per adapter: the reply area holds about 1 KB.
REASON_CHARS = 160
# The most effect ids one classify request may name (the reply must fit the control file's area).
MAX_CLASSIFY = 48


@dataclass(frozen=True)
class Ready:
    """A subsystem's yes to ``prepare``: the subsystem holds still at the cut, in the state ``state`` (``offset(7)``)."""

    state: str


@runtime_checkable
class Adapter(Protocol):
    """One subsystem's transitions (module docstring). ``domain`` is the state domain it stands for."""

    domain: str

    def prepare(self, epoch: int, deadline: float) -> "Ready | str":
        """Return :class:`Ready`, or the reason it cannot join the cut ``epoch`` by ``deadline`` (``time.time()``)."""
        ...

    def commit(self, epoch: int) -> None:
        """The cut ``epoch`` has its image: go on."""
        ...

    def abort(self, epoch: int) -> None:
        """The cut ``epoch`` was called off: undo :meth:`prepare` and go on."""
        ...

    def classify(self, key: int) -> str:
        """One of :data:`CLASSES` for the effect with id ``key``."""
        ...


class AdapterDesk:
    """The runtime's side of the adapter channel: the registered adapters and the one request at a time."""

    def __init__(self, control: Any):
        self.control = control
        self.adapters: dict[str, Any] = {}

    def register(self, adapter: Any) -> None:
        """Add ``adapter`` (one per domain); ValueError for a second adapter of a domain or a missing verb."""
        domain = getattr(adapter, "domain", None)
        if not isinstance(domain, str) or not domain:
            raise ValueError(f"adapter {adapter!r} has no domain (a non-empty string attribute)")
        # An input's adapter (effects = False) is never asked to classify, so it need not say how.
        verbs = ("prepare", "commit", "abort") + (() if getattr(adapter, "effects", True) is False else ("classify",))
        missing = [v for v in verbs if not callable(getattr(adapter, v, None))]
        if missing:
            raise ValueError(f"adapter for domain {domain!r} lacks {', '.join(missing)}")
        if domain in self.adapters:
            raise ValueError(f"a second adapter for domain {domain!r}: one adapter per domain")
        self.adapters[domain] = adapter
        self.control.set("adapters", len(self.adapters))

    def check_domains(self, declared: frozenset[str] | set[str]) -> None:
        """ValueError naming every adapter registered for a domain the workload does not declare."""
        stray = sorted(set(self.adapters) - set(declared))
        if stray:
            raise ValueError(f"adapter(s) registered for undeclared domain(s) {', '.join(stray)}: the workload "
                             f"declares {', '.join(sorted(declared))}")

    def answer(self) -> None:
        """Answer the pending request, if any (called at every cut point and while parked)."""
        c = self.control
        while self.adapters and (seq := c.get("adapt_seq")) > c.get("adapted_seq"):
            verb_index, epoch = c.get("adapt_verb"), c.get("adapt_epoch")
            verb = VERBS[verb_index] if 0 <= verb_index < len(VERBS) else f"verb#{verb_index}"
            answers = {domain: self._ask(adapter, verb, epoch, c) for domain, adapter in self.adapters.items()}
            reply = json.dumps({"seq": seq, "verb": verb, "answers": answers}, sort_keys=True)
            try:
                c.set_text(reply, area=REPLY_OFFSET)
            except ValueError:
                c.set_text(json.dumps({"seq": seq, "verb": verb, "error": f"reply of {len(reply)} bytes too long"}),
                           area=REPLY_OFFSET)
            c.set("adapted_seq", seq)

    @staticmethod
    def _ask(adapter: Any, verb: str, epoch: int, c: Any) -> dict[str, Any]:
        """One adapter's answer to one request, as the reply's JSON: its words, or the error it made."""
        try:
            if verb == "prepare":
                out = adapter.prepare(epoch, c.get("adapt_deadline_ns") / 1e9)
                if isinstance(out, Ready):
                    return {"ready": True, "state": str(out.state)[:REASON_CHARS],
                            "holds": getattr(adapter, "holds", False) is True}
                if isinstance(out, str):
                    return {"ready": False, "reason": out[:REASON_CHARS]}
                return {"error": f"prepare returned {out!r:.80} (expected Ready or a reason)"}
            if verb == "classify":
                if getattr(adapter, "effects", True) is False:
                    return {"classes": {}}  # an input's adapter: no effect of its own to classify
                lo, hi = c.get("adapt_lo"), c.get("adapt_hi")
                keys = range(lo, min(hi, lo + MAX_CLASSIFY - 1) + 1)
                return {"classes": {str(k): _checked_class(adapter.classify(k)) for k in keys}}
            if verb == "restored":
                hook = getattr(adapter, "restored", None)
                (hook if callable(hook) else adapter.commit)(epoch)
                return {"ok": True}
            if verb in ("commit", "abort"):
                getattr(adapter, verb)(epoch)
                return {"ok": True}
            return {"error": f"unknown request {verb}"}
        except Exception as exc:  # the adapter's own failure is its answer: the harness refuses with these words
            return {"error": f"{verb} raised {type(exc).__name__}: {exc}"[:REASON_CHARS]}


def _checked_class(value: Any) -> str:
    if value not in CLASSES:
        raise ValueError(f"classify returned {value!r:.40}, not one of {', '.join(CLASSES)}")
    return str(value)


# -- the built-in workloads' adapters --------------------------------------------------


class RequestLog:
    """A write-ahead log of the replies the receiver acknowledged (domain ``request_log``): a file outside
    the image, as a serving runtime's reply log on disk.

    The workload logs a reply (:meth:`delivered`) once its ack came back and asks :meth:`already_delivered`
    before it sends one, so a restored process never sends again what its crashed incarnation had out and
    acknowledged; :meth:`classify` tells the coordinator so. Publication is not held between prepare and
    commit: the log, read after the restore, already decides every reply, and a hold would stop a workload
    that must run on to its op boundary to save (an application-level checkpoint).
    """

    domain = "request_log"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            write_number(self.path, 0)  # created whole before any cut point

    def through(self) -> int:
        """The highest effect id the log says was delivered."""
        return read_number(self.path)

    def delivered(self, key: int) -> None:
        """Note durably that effect ``key`` was acknowledged (keys arrive in increasing order)."""
        if key > self.through():
            write_number(self.path, key, durable=True)

    def already_delivered(self, key: int) -> bool:
        """Whether the log says effect ``key`` is out (then it must not be sent again)."""
        return key <= self.through()

    def prepare(self, epoch: int, deadline: float) -> Ready:
        """Ready at once; the state is the log's fence."""
        return Ready(f"committed_through({self.through()})")

    def commit(self, epoch: int) -> None:
        """Nothing to release."""

    abort = commit

    def classify(self, key: int) -> str:
        """Return ``committed`` for what the log holds (it will not be sent again), else ``replay``."""
        return "committed" if self.already_delivered(key) else "replay"


class ConsumerOffset:
    """A consumer offset kept outside the process (domain ``disk``, an
    :class:`~cutbench.workloads.common.ExternalCursor`), joined to the cut as a broker's consumer commits
    its offset with a checkpoint: ``prepare`` notes the offset in process memory, so the image holds it,
    and ``restored`` seeks the cursor back to it; what the crashed incarnation took after the cut is taken
    again."""

    domain = "disk"
    effects = False  # an input: the replies are the request log's to classify

    def __init__(self, cursor: Any):
        self.cursor = cursor
        self.at_cut: int | None = None

    def prepare(self, epoch: int, deadline: float) -> Ready:
        """Note the offset (in memory: it is part of the image)."""
        self.at_cut = self.cursor.position()
        return Ready(f"offset({self.at_cut})")

    def commit(self, epoch: int) -> None:
        """Nothing to release: taking from the queue never stopped."""

    abort = commit

    def restored(self, epoch: int) -> None:
        """Seek back to the offset the image's process had at the cut."""
        if self.at_cut is not None:
            self.cursor.seek(self.at_cut)


__all__ = ["Adapter", "AdapterDesk", "CLASSES", "ConsumerOffset", "Ready", "RequestLog", "VERBS"]

"""Fuzz: >= 10,000 Hypothesis-generated malformed frames and messages against a live receiver.

The service must answer every intact frame with exactly one reply and keep the
connection usable, close a connection whose framing broke, never crash or hang,
and keep serving well-behaved clients on other connections throughout: while
each malformed connection is still open (a frame cut short, an oversized length,
garbage), a request on another connection is answered, and a publisher on a
third connection gets acks within every tenth of the fuzzer's examples. These
are orderings and counts of examples, not durations: a loaded machine
stretches every step alike.
"""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutbench.receivers import protocol as P
from cutbench.receivers.client import ReceiverClient
from tests.conftest import FULL_SUITE
from tests.fixtures.receiver_fixtures import Publisher

# 2,500 by default (about a quarter of the test's minute); the full 10,000 with CUTBENCH_FULL_SUITE=1.
EXAMPLES = 10_000 if FULL_SUITE else 2_500
REPLY_TIMEOUT = 10.0  # a reply slower than this counts as a hang

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
)
# One level of containers only: st.recursive costs milliseconds per example, and depth
# itself is covered more cheaply by the deeply nested bodies below.
json_values = st.one_of(
    json_scalars,
    st.lists(json_scalars, max_size=4),
    st.dictionaries(st.text(max_size=8), json_scalars, max_size=4),
)
_templates = [
    {"type": "publish", "trial": "fuzz", "op_id": 1, "attempt": 1, "epoch": 0, "digest": "d"},
    {"type": "prepare", "trial": "fuzz-f", "op_id": 1, "attempt": 1, "epoch": 0, "digest": "d"},
    {"type": "commit", "trial": "fuzz-f", "op_id": 1},
    {"type": "abort", "trial": "fuzz-f", "op_id": 1},
    {"type": "fence", "trial": "fuzz-f", "fence": 3},
    {"type": "open_trial", "trial": "fuzz", "mode": "idempotent"},
    {"type": "query", "what": "trial", "trial": "fuzz"},
    {"type": "export", "trial": "fuzz-none", "limit": 3},
    {"type": "hello", "client": "fuzzer"},
    {"type": "health"},
]
_keys = sorted({k for t in _templates for k in t} | {"v", "id", "extra"})


@st.composite
def mutated_messages(draw) -> dict:
    """A valid-looking message with a few fields deleted, replaced or added."""
    msg = {"v": 1, "id": draw(st.integers(0, 1 << 40)), **draw(st.sampled_from(_templates))}
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["drop", "set", "set"]))
        key = draw(st.sampled_from(_keys))
        if action == "drop":
            msg.pop(key, None)
        else:
            msg[key] = draw(json_values)
    return msg


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


intact_bodies = st.one_of(
    st.binary(max_size=200),  # mostly not JSON at all
    json_values.map(lambda v: json.dumps(v).encode()),  # JSON, mostly not an object
    mutated_messages().map(lambda m: json.dumps(m).encode()),  # objects that are nearly right
    st.text(max_size=100).map(lambda s: s.encode("utf-8", "surrogatepass")),
    # very deep nesting: the JSON parser's recursion limit must not hurt the server
    st.tuples(st.integers(1, 3000), st.sampled_from(["[", '{"a":'])).map(
        lambda t: (t[1] * t[0] + "1" + ("]" if t[1] == "[" else "}") * t[0]).encode()),
)
# Several intact frames in one write: exactly as many replies must come back.
intact_cases = st.lists(intact_bodies, min_size=1, max_size=4).map(lambda bs: ("intact", bs))
broken_cases = st.one_of(
    # a length prefix above the maximum: error reply, then the server closes
    st.tuples(st.integers(P.MAX_FRAME + 1, (1 << 32) - 1), st.binary(max_size=50)).map(
        lambda t: ("oversize", struct.pack(">I", t[0]) + t[1])),
    # a frame cut short, then the client hangs up
    st.tuples(st.integers(5, 5000), st.binary(max_size=4)).map(
        lambda t: ("truncated", struct.pack(">I", t[0]) + t[1])),
    # unframed garbage: whatever the server makes of it, it must survive
    st.binary(min_size=1, max_size=64).map(lambda b: ("garbage", b)),
)


class _Conn:
    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=REPLY_TIMEOUT)
        self.decoder = P.FrameDecoder()
        self.queue: list[bytes] = []

    def replies(self, n: int) -> list[dict]:
        """Read exactly ``n`` reply frames; fails on EOF or timeout (a hang)."""
        while len(self.queue) < n:
            data = self.sock.recv(1 << 16)
            assert data, "server closed a connection whose framing was intact"
            self.queue += self.decoder.feed(data)
        out, self.queue = self.queue[:n], self.queue[n:]
        return [json.loads(b) for b in out]

    def drain_until_eof(self) -> list[dict]:
        out = []
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                return out
            out += [json.loads(b) for b in self.decoder.feed(data)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fuzzed_frames_never_hurt_the_service(receiver) -> None:
    ctl = ReceiverClient(receiver.address)
    ctl.open_trial("fuzz", "at_least_once")
    ctl.open_trial("fuzz-f", "fenced")
    ctl.open_trial("good", "at_least_once")
    good = Publisher(receiver.address, "good")
    good.start()
    fuzz = _Conn(receiver.address)
    counts = {"intact": 0, "frames": 0, "oversize": 0, "truncated": 0, "garbage": 0, "error_replies": 0,
              "answered_while_open": 0}
    progress: list[int] = []  # the well-behaved publisher's acks so far, at each fuzz example
    t0 = time.monotonic()  # for the figure printed at the end, never for an assertion

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(intact_cases, intact_cases, broken_cases))
    def check(case) -> None:
        kind, payload = case
        counts[kind] += 1
        progress.append(len(good.ack_times))
        if kind == "intact":
            fuzz.sock.sendall(b"".join(_frame(b) for b in payload))
            for r in fuzz.replies(len(payload)):
                assert r.get("v") == 1 and r.get("type") in ("ack", "result", "error"), r
                counts["error_replies"] += r["type"] == "error"
            counts["frames"] += len(payload)
            return
        conn = _Conn(receiver.address)
        try:
            conn.sock.sendall(payload)
            # The malformed connection is still open on this side (a frame cut short, an oversized length the
            # server is rejecting, garbage it may still be waiting on): another connection is served meanwhile.
            assert ctl.health()["status"] == "ok"
            counts["answered_while_open"] += 1
            if kind == "oversize":
                got = conn.drain_until_eof()  # the server closes it; a hang fails on timeout
                assert got and got[-1]["code"] == "frame_too_large", got
            elif kind == "truncated":
                conn.sock.shutdown(socket.SHUT_WR)
                assert conn.drain_until_eof() == []  # the server sees EOF mid-frame and just closes
        finally:
            conn.sock.close()

    check()
    progress.append(len(good.ack_times))  # after the last example
    elapsed = time.monotonic() - t0
    good.stop()
    assert good.error is None, repr(good.error)
    total = sum(counts[k] for k in ("intact", "oversize", "truncated", "garbage"))
    broken = sum(counts[k] for k in ("oversize", "truncated", "garbage"))
    moved = sum(1 for a, b in zip(progress, progress[1:]) if b > a)
    print(f"\nfuzz: {total} examples ({counts}) in {elapsed:.1f}s (a figure, not a bound); the publisher got "
          f"{progress[-1] - progress[0]} acks meanwhile, and some during {moved} of {len(progress) - 1} examples")
    assert total >= EXAMPLES
    # Every malformed connection had another connection's request answered while it was open.
    assert broken > 0 and counts["answered_while_open"] == broken, counts
    # The publisher was served throughout, not only before the fuzzer started or after it stopped: its ack
    # count moved on within every tenth of the fuzz examples (a count of examples, not of seconds).
    tenths = progress[:: max(1, (len(progress) - 1) // 10)]
    assert all(b > a for a, b in zip(tenths, tenths[1:])), tenths
    # The service is still alive, still the same process, and still answers.
    assert receiver.running
    assert ctl.health()["status"] == "ok"
    fuzz.sock.sendall(P.encode({"type": "health", "id": 7}))
    assert fuzz.replies(1)[0]["id"] == 7

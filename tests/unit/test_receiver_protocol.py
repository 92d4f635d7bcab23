"""Unit tests of the pure parts: framing, message validation, the mode ledger."""

from __future__ import annotations

import json
import struct

import pytest

from cutbench.receivers import protocol as P
from cutbench.receivers.ledger import Changes, Command, Ledger


def test_frames_split_across_chunks_and_batched() -> None:
    frames = P.encode({"type": "health", "id": 1}) + P.encode({"type": "health", "id": 2})
    dec = P.FrameDecoder()
    got = []
    for i in range(len(frames)):  # one byte at a time
        got += dec.feed(frames[i : i + 1])
    assert [json.loads(b)["id"] for b in got] == [1, 2]
    assert dec.pending == 0 and dec.broken is None


def test_oversize_length_breaks_the_stream_but_keeps_earlier_frames() -> None:
    dec = P.FrameDecoder(max_frame=100)
    good = P.encode({"type": "health"})
    out = dec.feed(good + struct.pack(">I", 101) + b"x" * 10)
    assert len(out) == 1
    assert dec.broken is not None and dec.broken.code == "frame_too_large"
    assert dec.feed(good) == []  # nothing more is parsed from a broken stream


@pytest.mark.parametrize(
    "body, code",
    [
        (b"\xff\xfe", "bad_json"),
        (b"NaN", "bad_json"),
        (b"[1]", "bad_message"),
        (b"[" * 100000 + b"]" * 100000, "bad_json"),
        (b"", "bad_json"),
    ],
)
def test_bodies_that_are_not_messages(body: bytes, code: str) -> None:
    with pytest.raises(P.ProtocolError) as info:
        P.parse_body(body)
    assert info.value.code == code


@pytest.mark.parametrize(
    "msg, code",
    [
        ({"type": "health"}, "unsupported_version"),
        ({"v": 2, "type": "health"}, "unsupported_version"),
        ({"v": True, "type": "health"}, "unsupported_version"),
        ({"v": 1, "type": "nope"}, "unknown_type"),
        ({"v": 1, "type": "health", "id": -1}, "bad_argument"),
        ({"v": 1, "type": "health", "junk": 1}, "bad_argument"),
        ({"v": 1, "type": "publish", "trial": "t", "op_id": 1, "attempt": 0, "epoch": 0, "digest": ""}, "bad_argument"),
        ({"v": 1, "type": "publish", "trial": "t", "op_id": True, "attempt": 1, "epoch": 0, "digest": ""}, "bad_argument"),
        ({"v": 1, "type": "publish", "trial": "", "op_id": 1, "attempt": 1, "epoch": 0, "digest": ""}, "bad_argument"),
        ({"v": 1, "type": "publish", "trial": "t\x00", "op_id": 1, "attempt": 1, "epoch": 0, "digest": ""}, "bad_argument"),
        ({"v": 1, "type": "publish", "trial": "t", "op_id": 1 << 63, "attempt": 1, "epoch": 0, "digest": ""}, "bad_argument"),
        ({"v": 1, "type": "open_trial", "trial": "t", "mode": "exactly_once"}, "bad_argument"),
        ({"v": 1, "type": "abort", "trial": "t"}, "bad_argument"),
        ({"v": 1, "type": "abort", "trial": "t", "op_id": 1, "from_epoch": 1}, "bad_argument"),
        ({"v": 1, "type": "export", "limit": 10**6}, "bad_argument"),
    ],
)
def test_invalid_requests_name_the_problem(msg: dict, code: str) -> None:
    with pytest.raises(P.ProtocolError) as info:
        P.validate(msg)
    assert info.value.code == code and info.value.message


def _cmd(mtype: str, **fields) -> Command:
    msg = {"v": 1, "type": mtype, **fields}
    assert P.validate(msg) == mtype
    return Command(mtype, msg, 1_000_001, "test", 0.0)


def _pub(trial: str, op: int, epoch: int = 0, mtype: str = "publish") -> Command:
    return _cmd(mtype, trial=trial, op_id=op, attempt=1, epoch=epoch, digest="d")


def test_ledger_modes_decide_as_documented() -> None:
    led, ch = Ledger(), Changes()
    apply = lambda cmd: led.apply(cmd, ch)  # noqa: E731
    apply(_cmd("open_trial", trial="a", mode="at_least_once"))
    apply(_cmd("open_trial", trial="i", mode="idempotent"))
    apply(_cmd("open_trial", trial="f", mode="fenced"))
    assert apply(_cmd("open_trial", trial="i", mode="idempotent"))["existing"] is True
    with pytest.raises(P.ProtocolError, match="already open"):
        apply(_cmd("open_trial", trial="i", mode="fenced"))
    assert [apply(_pub("a", 1))["decision"] for _ in range(2)] == ["applied", "applied"]
    assert [apply(_pub("i", 1))["decision"] for _ in range(2)] == ["applied", "suppressed"]
    with pytest.raises(P.ProtocolError) as info:
        apply(_pub("zzz", 1))
    assert info.value.code == "unknown_trial"
    with pytest.raises(P.ProtocolError) as info:
        apply(_cmd("commit", trial="i", op_id=1))
    assert info.value.code == "wrong_mode"
    # fenced: publish means prepare; commit only up to the fence; commit is idempotent
    assert apply(_pub("f", 1, epoch=1))["decision"] == "prepared"
    assert apply(_pub("f", 2, epoch=2, mtype="prepare"))["decision"] == "prepared"
    assert apply(_cmd("commit", trial="f", op_id=1))["decision"] == "rejected"  # no fence yet
    apply(_cmd("fence", trial="f", fence=1))
    first = apply(_cmd("commit", trial="f", op_id=1))
    assert first["decision"] == "committed" and first["already"] is False
    assert apply(_cmd("commit", trial="f", op_id=1))["already"] is True
    assert apply(_cmd("commit", trial="f", op_id=2))["decision"] == "rejected"
    with pytest.raises(P.ProtocolError) as info:
        apply(_cmd("fence", trial="f", fence=0))
    assert info.value.code == "fence_backwards"
    assert apply(_pub("f", 1, epoch=3))["decision"] == "suppressed"  # already committed
    assert apply(_cmd("abort", trial="f", from_epoch=2))["aborted"] == 1
    apply(_cmd("fence", trial="f", fence=5))
    assert "no open prepared" in apply(_cmd("commit", trial="f", op_id=2))["reason"]
    # seqs are dense and every one is accounted for in the changes
    assert ch.last_seq == led.last_seq
    assert len({r[0] for r in ch.rows}) == len(ch.rows)


def test_ledger_rebuild_matches_the_state_it_came_from() -> None:
    led, ch = Ledger(), Changes()
    for cmd in [_cmd("open_trial", trial="i", mode="idempotent"), _cmd("open_trial", trial="f", mode="fenced"),
                _pub("i", 7), _pub("f", 1), _pub("f", 2), _cmd("fence", trial="f", fence=1),
                _cmd("commit", trial="f", op_id=1)]:
        led.apply(cmd, ch)
    decisions = {seq: d for d, _, seq in ch.decisions}
    rows = [(r[0], r[1], r[2], r[4], decisions.get(r[0], r[9])) for r in ch.rows]
    back = Ledger.rebuild([("i", "idempotent", None), ("f", "fenced", 1)], rows, led.last_seq)
    ch2 = Changes()
    assert back.apply(_pub("i", 7), ch2)["decision"] == "suppressed"
    assert back.apply(_cmd("commit", trial="f", op_id=1), ch2)["already"] is True
    assert back.apply(_cmd("commit", trial="f", op_id=2), ch2)["decision"] == "rejected"
    assert back.trials["f"].prepared == {2: [(5, 0)]}  # op 2, prepared at seq 5, epoch 0, still open

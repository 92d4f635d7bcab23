"""Wire protocol of the receiver: framing, message validation, reply builders.

A frame is a 4-byte big-endian unsigned length followed by that many bytes of
UTF-8 JSON holding one object with ``"v": 1`` and ``"type"``. See
``receivers/PROTOCOL.md`` for the full description. This module is pure (no
sockets): both the asyncio server and the blocking client build on it.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from cutbench.errors import FramingError, InvalidArgument, ProtocolError

VERSION = 1
TOKEN_ENV = "CUTBENCH_RECEIVER_TOKEN"  # where the server and process.start_receiver pass the shared secret
MAX_FRAME = 1 << 20  # 1 MiB: far above any legal message, far below memory trouble
# The smallest frame limit a server may run with: every legal request and every single reply
# (an export page of one row included) fits in it, the longest texts JSON-escaped included.
MIN_FRAME = 16 << 10
HEADER = struct.Struct(">I")

MODES = ("at_least_once", "idempotent", "fenced")
DECISIONS = ("applied", "suppressed", "prepared", "committed", "aborted", "rejected")

# Bounds that keep every value storable as a signed 64-bit integer / short text.
MAX_INT = (1 << 63) - 1
MAX_TEXT = 256
MAX_EXPORT_PAGE = 5000

# Request types and the fields each one takes: name -> (kind, required).
_TRIAL = ("text", True)
_EFFECT = {  # publish and prepare carry the same effect
    "trial": _TRIAL,
    "op_id": ("uint", True),
    "attempt": ("attempt", True),
    "epoch": ("uint", True),
    "digest": ("text0", True),
    # The incarnation of the process sending this frame, where the client knows it: a resend after a restore
    # carries the op's old ``epoch`` but the restored process's ``sender``.
    "sender": ("uint", False),
}
_FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    "hello": {"token": ("text", False), "client": ("text", False)},
    "open_trial": {"trial": _TRIAL, "mode": ("mode", True)},
    "publish": _EFFECT,
    "prepare": _EFFECT,
    "commit": {"trial": _TRIAL, "op_id": ("uint", True), "epoch": ("uint", False)},
    "abort": {"trial": _TRIAL, "op_id": ("uint", False), "from_epoch": ("uint", False)},
    "fence": {"trial": _TRIAL, "fence": ("uint", True)},
    "query": {"what": ("query", True), "trial": ("text", False)},
    "export": {"trial": ("text", False), "after_seq": ("uint", False), "limit": ("page", False)},
    "health": {},
}
REQUEST_TYPES = frozenset(_FIELDS)
# Requests that change the store: they go through the writer and are acked after commit.
WRITE_TYPES = frozenset({"open_trial", "publish", "prepare", "commit", "abort", "fence"})
QUERY_WHATS = ("high_water_mark", "trial", "clients")


def encode(msg: dict[str, Any]) -> bytes:
    """Return one frame (length prefix + compact JSON) for ``msg``; adds ``"v"``."""
    if "v" not in msg:
        msg = {"v": VERSION, **msg}
    body = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental frame splitter: feed bytes, get complete frame bodies back.

    When a length prefix exceeds ``max_frame`` the stream is unusable (nothing
    tells where the next frame starts): ``feed`` then still returns the frames
    completed before it and sets ``broken`` to the ``FramingError``.
    """

    def __init__(self, max_frame: int = MAX_FRAME):
        if not isinstance(max_frame, int) or isinstance(max_frame, bool) or max_frame < 64:
            raise ValueError(f"max_frame must be an int >= 64, got {max_frame!r}")
        self.max_frame = max_frame
        self.broken: FramingError | None = None
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Append ``data``; return the bodies of all frames now complete, in order."""
        if self.broken is not None:
            return []
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = HEADER.unpack_from(buf, pos)
            if n > self.max_frame:
                self.broken = FramingError(
                    "frame_too_large", f"frame length {n} exceeds the maximum {self.max_frame}"
                )
                buf.clear()
                return out
            if len(buf) - pos - 4 < n:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        if pos:
            del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        """Number of buffered bytes that do not yet form a complete frame."""
        return len(self._buf)


def _reject_constant(name: str) -> Any:
    # json.loads accepts NaN/Infinity by default; they are not JSON and not storable.
    raise ValueError(f"{name} is not valid JSON")


def parse_body(body: bytes) -> dict[str, Any]:
    """Decode one frame body into a message dict; raises ``ProtocolError`` if it is not one."""
    try:
        msg = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError("bad_json", f"frame body is not UTF-8 JSON: {str(exc)[:120]}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("bad_message", f"message must be a JSON object, got {type(msg).__name__}")
    return msg


def request_id(msg: dict[str, Any]) -> int | None:
    """Return the message's ``id`` if it is a valid one (an int in 0..2**63-1), else None (also for null)."""
    rid = msg.get("id")
    if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid <= MAX_INT:
        return rid
    return None


def _check_value(field: str, kind: str, value: Any) -> None:
    if kind in ("uint", "attempt", "page"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError("bad_argument", f"{field} must be an integer, got {type(value).__name__}")
        low = {"uint": 0, "attempt": 1, "page": 1}[kind]
        high = {"uint": MAX_INT, "attempt": MAX_INT, "page": MAX_EXPORT_PAGE}[kind]
        if not low <= value <= high:
            raise ProtocolError("bad_argument", f"{field} must be in {low}..{high}, got {value}")
    elif kind in ("text", "text0"):
        if not isinstance(value, str):
            raise ProtocolError("bad_argument", f"{field} must be a string, got {type(value).__name__}")
        if (kind == "text" and not value) or len(value) > MAX_TEXT:
            raise ProtocolError("bad_argument", f"{field} must be 1..{MAX_TEXT} characters")
        if "\x00" in value:
            # PostgreSQL text cannot hold NUL; refuse it for both stores alike.
            raise ProtocolError("bad_argument", f"{field} must not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # Valid JSON ("\ud800") but not storable text: refused here, before it could fail the
            # group commit that other connections' writes share.
            raise ProtocolError("bad_argument", f"{field} must be valid Unicode text (no lone surrogates)") from None
    elif kind == "mode":
        if value not in MODES:
            raise ProtocolError("bad_argument", f"mode must be one of {', '.join(MODES)}, got {value!r}")
    elif kind == "query":
        if value not in QUERY_WHATS:
            raise ProtocolError("bad_argument", f"what must be one of {', '.join(QUERY_WHATS)}, got {value!r}")
    else:  # pragma: no cover - table above is closed
        raise AssertionError(kind)


def validate(msg: dict[str, Any]) -> str:
    """Check version, type and fields of a request; return its type or raise ``ProtocolError``."""
    v = msg.get("v")
    if v != VERSION or isinstance(v, bool):
        raise ProtocolError("unsupported_version", f"protocol version must be {VERSION}, got {v!r}")
    mtype = msg.get("type")
    if not isinstance(mtype, str) or mtype not in _FIELDS:
        raise ProtocolError("unknown_type", f"unknown message type {str(mtype)[:40]!r}")
    # null is the same as absent for every optional field, and ``id`` is one.
    if msg.get("id") is not None and request_id(msg) is None:
        raise ProtocolError("bad_argument", "id must be an integer in 0..2**63-1")
    fields = _FIELDS[mtype]
    for key in msg:
        if key not in fields and key not in ("v", "type", "id"):
            raise ProtocolError("bad_argument", f"{mtype} does not take field {str(key)[:40]!r}")
    for field, (kind, required) in fields.items():
        if field in msg:
            if msg[field] is None and not required:
                continue
            _check_value(field, kind, msg[field])
        elif required:
            raise ProtocolError("bad_argument", f"{mtype} needs field {field!r}")
    if mtype == "abort" and (msg.get("op_id") is None) == (msg.get("from_epoch") is None):
        raise ProtocolError("bad_argument", "abort needs exactly one of op_id or from_epoch")
    return mtype


def error_reply(code: str, message: str, *, re: str | None = None, rid: int | None = None) -> dict[str, Any]:
    """Return an ``error`` reply; ``re``/``id`` echo the request when known."""
    out: dict[str, Any] = {"v": VERSION, "type": "error", "code": code, "message": message}
    if re is not None:
        out["re"] = re
    if rid is not None:
        out["id"] = rid
    return out


def reply(kind: str, re: str, rid: int | None, **fields: Any) -> dict[str, Any]:
    """Return an ``ack`` (durable write) or ``result`` (read) reply to request type ``re``."""
    out: dict[str, Any] = {"v": VERSION, "type": kind, "re": re}
    if rid is not None:
        out["id"] = rid
    out.update(fields)
    return out


def parse_listen(listen: str) -> tuple[str, str, int]:
    """Split a listen address into ("unix", path, 0) or ("tcp", host, port)."""
    if not isinstance(listen, str) or not listen:
        raise InvalidArgument(f"listen address must be a non-empty string, got {listen!r}")
    if listen.startswith("unix:"):
        path = listen[5:]
        if not path:
            raise InvalidArgument("listen address unix: needs a socket path, e.g. unix:/tmp/r.sock")
        return ("unix", path, 0)
    host, sep, port_s = listen.rpartition(":")
    if not sep or not host or not port_s.isdigit() or int(port_s) > 65535:
        raise InvalidArgument(f"listen address {listen!r}: expected HOST:PORT (PORT 0 picks one) or unix:PATH")
    return ("tcp", host.strip("[]"), int(port_s))

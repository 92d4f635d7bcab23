"""The receiver service: an asyncio server with one group-committing writer.

Every write request (open_trial, publish, prepare, commit, abort, fence) is
queued for the single writer task, which takes everything queued so far,
decides it with the ``Ledger``, commits the whole batch in one store
transaction on a worker thread and only then sends the acks. While one batch
is being fsynced the next one accumulates: that is the group commit that keeps
throughput up with many clients. When the store refuses a batch, its requests
are decided and committed again one at a time, so a row the store cannot hold
costs only its own request an error. Reads of store contents (a trial query,
export) run on a second connection on a reader thread and see only committed
state; hello, health and the high-water mark are answered on the event loop.
The command line is ``receivers/command.py``.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cutbench.errors import InvalidArgument
from cutbench.files import atomic_write
from cutbench.validate import check_int

from . import protocol as P
from .protocol import parse_listen
from .ledger import Changes, Command, Ledger
from .schema import EXPORT_COLUMNS
from .stores import Store, open_store

log = logging.getLogger("cutbench.receiver")

MAX_BATCH = 4096  # commands per transaction; bounds latency of one commit
PAUSE_AT = 2048  # outstanding requests per connection before we stop reading it
EXPORT_PAGE = 1000
CONNS_PER_BOOT = 1_000_000  # connection_id = boot * CONNS_PER_BOOT + n


def is_loopback(host: str) -> bool:
    """True when ``host`` names only this machine (127/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def check_exposure(listen: str, token: str | None, allow_remote: bool) -> None:
    """Refuse a non-loopback bind unless ``allow_remote`` and a token are both given."""
    kind, host, _ = parse_listen(listen)
    if kind == "tcp" and not is_loopback(host):
        if not allow_remote:
            raise InvalidArgument(
                f"refusing to listen on non-loopback address {host!r}: pass --allow-remote and --token"
            )
        if not token:
            raise InvalidArgument(f"listening on non-loopback address {host!r} needs a shared-secret --token")


def write_ready_file(path: str, address: str) -> None:
    """Write ``address`` to ``path`` atomically (temporary file, fsync, rename)."""
    atomic_write(path, address + "\n", durable=True)


class _Connection(asyncio.Protocol):
    """One client connection: splits frames and hands each to the service."""

    def __init__(self, service: "Service"):
        self.service = service
        self.decoder = P.FrameDecoder(service.max_frame)
        self.transport: asyncio.Transport | None = None
        self.connection_id = 0
        self.client = ""
        self.authed = service.token is None
        self.outstanding = 0  # requests accepted but not yet answered
        self.read_paused = False
        self.write_blocked = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connection_id = self.service.new_connection_id()
        self.service.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.service.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        for body in self.decoder.feed(data):
            self.service.handle(self, body)
        if self.decoder.broken is not None:
            err = self.decoder.broken
            self.send(P.error_reply(err.code, err.message + "; closing connection"))
            if self.transport is not None:  # set by connection_made, before any data
                self.transport.close()  # flushes the error reply first

    def pause_writing(self) -> None:
        # The peer does not read its replies: stop reading its requests until it does.
        self.write_blocked = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_blocked = False
        self._update_reading()

    def _update_reading(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        want_pause = self.write_blocked or self.outstanding >= PAUSE_AT or self.service.stopping
        if want_pause and not self.read_paused:
            t.pause_reading()
            self.read_paused = True
        elif not want_pause and self.read_paused:
            t.resume_reading()
            self.read_paused = False

    def send(self, msg: dict[str, Any]) -> None:
        self.send_bytes(P.encode(msg))

    def send_bytes(self, data: bytes) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(data)

    def request_started(self) -> None:
        self.outstanding += 1
        if self.outstanding >= PAUSE_AT:
            self._update_reading()

    def request_done(self) -> None:
        self.outstanding -= 1
        if self.read_paused:
            self._update_reading()


class Service:
    """State of one running receiver: store, ledger, connections, writer queue."""

    def __init__(self, store: Store, store_url: str, boot: int, ledger: Ledger, *, token: str | None,
                 max_frame: int):
        self.store = store
        self.store_kind = "sqlite" if store_url.startswith("sqlite:") else "postgresql"
        self.store_url = store_url
        self.boot = boot
        self.ledger = ledger
        self.committed_seq = ledger.last_seq  # high-water mark: last seq durably committed
        self.token = token
        self.max_frame = max_frame
        self.connections: set[_Connection] = set()
        self.stopping = False
        self.started = time.time()
        self._conn_counter = 0
        self._pending: list[tuple[Command, _Connection]] = []
        self._wake = asyncio.Event()
        self._write_pool = ThreadPoolExecutor(1, thread_name_prefix="receiver-writer")
        self._read_pool = ThreadPoolExecutor(1, thread_name_prefix="receiver-reader")
        self._reader: Store | None = None
        # True when the ledger may differ from the store and could not be read back yet:
        # nothing may be decided until it was.
        self._ledger_stale = False
        self.batches = 0
        self.written = 0

    def new_connection_id(self) -> int:
        self._conn_counter += 1
        return self.boot * CONNS_PER_BOOT + self._conn_counter

    # -- request dispatch ------------------------------------------------------------

    def handle(self, conn: _Connection, body: bytes) -> None:
        """Answer or enqueue one frame body; every intact frame gets exactly one reply."""
        received_at = time.time()
        rid: int | None = None
        re: str | None = None
        try:
            msg = P.parse_body(body)
            rid = P.request_id(msg)
            if isinstance(msg.get("type"), str) and msg["type"] in P.REQUEST_TYPES:
                re = msg["type"]
            mtype = P.validate(msg)
            if not conn.authed and mtype != "hello":
                raise P.ProtocolError("unauthorized", "this receiver needs a token: send hello with it first")
            if mtype in P.WRITE_TYPES:
                conn.request_started()
                self._pending.append((Command(mtype, msg, conn.connection_id, conn.client, received_at), conn))
                self._wake.set()
            elif mtype == "export" or (mtype == "query" and msg["what"] == "trial"):
                if mtype == "query" and not msg.get("trial"):
                    raise P.ProtocolError("bad_argument", "query what=trial needs field 'trial'")
                conn.request_started()
                asyncio.get_running_loop().create_task(self._store_read(conn, mtype, msg, rid))
            else:
                conn.send(self._read_request(conn, mtype, msg, rid))
        except P.ProtocolError as exc:
            conn.send(P.error_reply(exc.code, exc.message, re=re, rid=rid))
        except Exception as exc:  # a bug must cost one reply, never the service
            log.exception("internal error handling a request")
            conn.send(P.error_reply("internal", f"internal error: {type(exc).__name__}", re=re, rid=rid))

    def _read_request(self, conn: _Connection, mtype: str, msg: dict, rid: int | None) -> dict:
        if mtype == "hello":
            if self.token is not None:
                given = msg.get("token")
                if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.token.encode()):
                    conn.authed = False  # the latest hello decides: a refused one revokes an earlier success
                    raise P.ProtocolError("unauthorized", "wrong or missing token")
                conn.authed = True
            conn.client = msg.get("client") or ""
            return P.reply("result", "hello", rid, server="cutbench-receiver", version=P.VERSION,
                           connection_id=conn.connection_id, boot=self.boot, max_frame=self.max_frame,
                           modes=list(P.MODES))
        if mtype == "health":
            return P.reply("result", "health", rid, status="stopping" if self.stopping else "ok",
                           pid=os.getpid(), boot=self.boot, store=self.store_kind,
                           uptime_s=round(time.time() - self.started, 3), high_water_mark=self.committed_seq,
                           connections=len(self.connections), queued=len(self._pending),
                           batches=self.batches, written=self.written)
        if mtype == "query" and msg["what"] == "high_water_mark":
            return P.reply("result", "query", rid, what="high_water_mark", value=self.committed_seq)
        if mtype == "query" and msg["what"] == "clients":
            # The open connections' client names: a closed one's every frame was read and its writes queued.
            return P.reply("result", "query", rid, what="clients", value=sorted(c.client for c in self.connections))
        raise AssertionError(mtype)  # pragma: no cover - handle() sends the other reads to the store

    async def _store_read(self, conn: _Connection, mtype: str, msg: dict, rid: int | None) -> None:
        """Answer a trial query or an export page from the store's committed state."""
        try:
            if mtype == "export":
                data = await self._export(msg, rid)
            else:
                info = await asyncio.get_running_loop().run_in_executor(
                    self._read_pool, self._read, "trial_info", msg["trial"])
                if info is None:
                    raise P.ProtocolError("unknown_trial", f"trial {msg['trial'][:80]!r} was never opened; "
                                                           "send open_trial first")
                data = P.encode(P.reply("result", "query", rid, what="trial", value=info))
            conn.send_bytes(data)
        except P.ProtocolError as exc:
            conn.send(P.error_reply(exc.code, exc.message, re=mtype, rid=rid))
        except Exception as exc:
            log.warning("%s failed: %s", mtype, exc)
            conn.send(P.error_reply("store_error", f"{mtype} failed: {str(exc)[:200]}", re=mtype, rid=rid))
        finally:
            conn.request_done()

    async def _export(self, msg: dict, rid: int | None) -> bytes:
        limit = msg.get("limit") or EXPORT_PAGE
        rows = [list(r) for r in await asyncio.get_running_loop().run_in_executor(
            self._read_pool, self._read, "export_rows", msg.get("trial"), msg.get("after_seq") or 0, limit)]
        # Shrink the page until it fits in a frame (P.MIN_FRAME holds any one row); the client asks
        # for the rest, so a page may hold fewer rows than limit although more follow.
        while True:
            more = len(rows) >= limit
            data = P.encode(P.reply("result", "export", rid, columns=list(EXPORT_COLUMNS), rows=rows,
                                    next_after=rows[-1][0] if rows and more else None))
            if len(data) - 4 <= self.max_frame or len(rows) <= 1:
                return data
            limit = max(1, len(rows) // 2)
            rows = rows[:limit]

    def _read(self, method: str, *args: Any) -> Any:
        """On the reader thread: call ``method`` of the reading store connection (opened on first use)."""
        if self._reader is None:
            self._reader = open_store(self.store_url)
        try:
            return getattr(self._reader, method)(*args)
        except Exception:
            # The connection may be what broke (a restarted PostgreSQL): the next read opens a new one.
            reader, self._reader = self._reader, None
            try:
                reader.close()
            except Exception:
                pass
            raise

    # -- the writer ------------------------------------------------------------------

    async def writer(self) -> None:
        """Group-commit loop; returns once ``stopping`` is set and the queue is empty."""
        while True:
            if not self._pending:
                if self.stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            if self._ledger_stale and not await self._rebuild_ledger():
                why = "the store cannot be read back"
                replies = [(conn, self._store_error(cmd, why)) for cmd, conn in batch]
            else:
                replies = await self._commit_batch(batch)
            self._send_grouped(replies)

    def _decide(self, cmd: Command, changes: Changes) -> dict:
        try:
            return self.ledger.apply(cmd, changes)
        except P.ProtocolError as exc:  # refused before the ledger changed anything
            return P.error_reply(exc.code, exc.message, re=cmd.mtype, rid=cmd.msg.get("id"))

    @staticmethod
    def _store_error(cmd: Command, why: object) -> dict:
        return P.error_reply("store_error", f"store write failed, nothing from this request was stored: "
                             f"{str(why)[:200]}", re=cmd.mtype, rid=cmd.msg.get("id"))

    async def _write(self, changes: Changes) -> None:
        await asyncio.get_running_loop().run_in_executor(self._write_pool, self.store.write, changes)
        self.committed_seq = changes.last_seq
        self.batches += 1

    async def _rebuild_ledger(self) -> bool:
        """Read the ledger back from the store, the truth; False (and stale) if the store cannot be read."""
        try:
            self.ledger = await asyncio.get_running_loop().run_in_executor(self._write_pool, self.store.load_ledger)
        except Exception as exc:
            log.error("cannot read the ledger back from the store: %s", exc)
            self._ledger_stale = True
            return False
        self._ledger_stale = False
        self.committed_seq = self.ledger.last_seq
        return True

    async def _commit_batch(self, batch: list[tuple[Command, _Connection]]) -> list[tuple[_Connection, dict]]:
        """Decide and commit ``batch`` in one transaction; on failure, one request at a time."""
        changes = Changes(last_seq=self.ledger.last_seq)
        replies = [(conn, self._decide(cmd, changes)) for cmd, conn in batch]
        if not changes and changes.last_seq == self.committed_seq:
            return replies
        try:
            await self._write(changes)
        except Exception as exc:
            log.warning("group commit of %d requests failed (%s); committing them one at a time",
                        len(batch), str(exc)[:200])
        else:
            self.written += len(batch)
            return replies
        # The ledger ran ahead of the store by the whole batch: start again from the store.
        if not await self._rebuild_ledger():
            return [(conn, self._store_error(cmd, "the store cannot be read back")) for cmd, conn in batch]
        return await self._commit_alone(batch)

    async def _commit_alone(self, batch: list[tuple[Command, _Connection]]) -> list[tuple[_Connection, dict]]:
        """Decide and commit each request in its own transaction, so a request the store refuses
        fails alone; the ones after it are decided as if it had never arrived."""
        replies: list[tuple[_Connection, dict]] = []
        for i, (cmd, conn) in enumerate(batch):
            changes = Changes(last_seq=self.ledger.last_seq)
            reply = self._decide(cmd, changes)
            if changes:
                try:
                    await self._write(changes)
                except Exception as exc:
                    log.error("store refused a %s request of connection %d: %s", cmd.mtype, cmd.connection_id,
                              str(exc)[:200])
                    replies.append((conn, self._store_error(cmd, exc)))
                    # The ledger ran ahead of the store by this request (or a commit that failed
                    # late was stored after all): take the truth from the store again.
                    if not await self._rebuild_ledger():
                        rest = batch[i + 1:]
                        replies += [(c, self._store_error(k, "the store cannot be read back")) for k, c in rest]
                        return replies
                    continue
            self.written += 1
            replies.append((conn, reply))
        return replies

    @staticmethod
    def _send_grouped(replies: list[tuple[_Connection, dict]]) -> None:
        # One write per connection per batch: far fewer syscalls under load.
        frames: dict[_Connection, list[bytes]] = {}
        for conn, r in replies:
            frames.setdefault(conn, []).append(P.encode(r))
        for conn, parts in frames.items():
            conn.send_bytes(b"".join(parts))
            for _ in parts:
                conn.request_done()

    def close_pools(self) -> None:
        self._write_pool.shutdown(wait=True)
        if self._reader is not None:
            self._read_pool.submit(self._reader.close).result()
        self._read_pool.shutdown(wait=True)


async def _serve(store_url: str, listen: str, token: str | None, ready_file: str | None, max_frame: int) -> None:
    loop = asyncio.get_running_loop()
    kind, host, port = parse_listen(listen)
    store = open_store(store_url)
    try:
        boot = store.begin_boot()
        service = Service(store, store_url, boot, store.load_ledger(), token=token, max_frame=max_frame)
        if kind == "unix":
            server = await loop.create_unix_server(lambda: _Connection(service), host)
            os.chmod(host, 0o600)  # only this user's processes may publish
            address = f"unix:{host}"
        else:
            server = await loop.create_server(lambda: _Connection(service), host, port, reuse_address=True)
            sockname = server.sockets[0].getsockname()
            address = f"[{sockname[0]}]:{sockname[1]}" if ":" in sockname[0] else f"{sockname[0]}:{sockname[1]}"
        stop = asyncio.Event()
        # A blocked mask is inherited across exec (Ray blocks signals in the process that starts it):
        # the receiver must stay stoppable whoever started it.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        writer = loop.create_task(service.writer())
        if ready_file:
            write_ready_file(ready_file, address)
        log.info("receiver boot %d listening on %s, store %s", boot, address, service.store_kind)
        done, _ = await asyncio.wait({writer, loop.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if writer in done:
            writer.result()  # the writer only ends early by raising: report it
        # Clean shutdown: stop accepting and reading, let the writer commit and ack what it has.
        server.close()
        service.stopping = True
        for conn in list(service.connections):
            conn._update_reading()
        service._wake.set()
        await writer
        for conn in list(service.connections):
            if conn.transport is not None:
                conn.transport.close()
        await asyncio.sleep(0.05)  # let the transports flush their last acks
        service.close_pools()
        if kind == "unix":
            try:
                os.unlink(host)
            except FileNotFoundError:
                pass
        log.info("receiver boot %d stopped after %d writes in %d batches", boot, service.written, service.batches)
    finally:
        store.close()


def serve(store_url: str, listen: str, *, token: str | None = None, allow_remote: bool = False,
          ready_file: str | None = None, max_frame: int = P.MAX_FRAME) -> None:
    """Run the receiver until SIGTERM/SIGINT; returns after a clean shutdown.

    ``listen`` is ``HOST:PORT`` (PORT 0 picks a free one) or ``unix:PATH``. Once
    listening, the actual address is written atomically to ``ready_file``.
    Raises ``InvalidArgument`` for a bad address, a non-loopback bind without
    ``allow_remote`` and ``token``, or a bad ``max_frame``.
    """
    check_exposure(listen, token, allow_remote)
    check_int("max_frame", max_frame, P.MIN_FRAME, 1 << 30)
    if token is not None and not token:
        raise InvalidArgument("token must not be empty")
    if token is not None and len(token) > P.MAX_TEXT:
        # A client's hello carries the token as protocol text: a longer one could never authenticate.
        raise InvalidArgument(f"--token is {len(token)} characters; the protocol carries at most {P.MAX_TEXT}")
    asyncio.run(_serve(store_url, listen, token, ready_file, max_frame))

"""A small streaming server that knows nothing of cutbench: each request's tokens, one event per token.

    python serve.py --port PORT [--tokens N] [--interval-ms MS]

``POST /generate`` with ``{"id": ..., "n": N}`` answers with a chunked stream
of server-sent events, ``data: POS TOKEN``, one per token, ``--interval-ms``
apart, then ``data: [DONE]``. Each request keeps its own state while it
streams (a running hash of what it generated: the stand-in for a KV cache),
and requests are served concurrently, one thread each. Deterministic: a
request's tokens depend on its ``n`` alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    tokens = 24
    interval_s = 0.02

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        if self.path != "/generate":
            self.send_error(404)
            return
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        cache = hashlib.sha256(f"prompt {request['n']}".encode()).hexdigest()  # this request's own state
        for pos in range(1, self.tokens + 1):
            cache = hashlib.sha256(f"{cache}:{pos}".encode()).hexdigest()
            self._chunk(f"data: {pos} {cache[:8]}\n\n")
            time.sleep(self.interval_s)
        self._chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # quiet: its stderr is for errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    args = parser.parse_args()
    Handler.tokens, Handler.interval_s = args.tokens, args.interval_ms / 1000.0
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"listening on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

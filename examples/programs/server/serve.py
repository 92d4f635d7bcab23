"""A small streaming server that knows nothing of cutbench: each request's tokens, one event per token.

    python serve.py --port PORT [--tokens N] [--interval-ms MS] [--model hash|gpt2] [--device cuda|cpu]

``POST /generate`` with ``{"id": ..., "n": N}`` answers with a chunked stream
of server-sent events, ``data: POS TOKEN``, one per token, ``--interval-ms``
apart, then ``data: [DONE]``. Requests are served concurrently, one thread
each, and each keeps its own state while it streams:

* ``--model hash`` (the default, no library): a running hash of what it
  generated, the stand-in for a KV cache;
* ``--model gpt2``: Hugging Face ``transformers``' GPT-2 built from a small
  config with weights from a seed (no download), decoding greedily from a
  prompt made of ``n``, with a KV cache per request; one forward pass at a
  time on the device.

Deterministic: a request's tokens depend on its ``n`` alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HashModel:
    """Tokens from a running hash: the request's state is the hash so far."""

    def generate(self, n: int, tokens: int):
        cache = hashlib.sha256(f"prompt {n}".encode()).hexdigest()
        for _ in range(tokens):
            cache = hashlib.sha256(f"{cache}".encode()).hexdigest()
            yield cache[:8]


class Gpt2Model:
    """GPT-2 from a small config, weights from a seed; greedy decoding with a KV cache per request."""

    def __init__(self, device: str):
        import threading

        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        torch.use_deterministic_algorithms(True)
        config = GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=4096, n_positions=256)
        self.torch, self.device = torch, device
        self.model = GPT2LMHeadModel(config).to(device).eval()
        self.lock = threading.Lock()  # one forward pass at a time: requests interleave token by token

    def generate(self, n: int, tokens: int):
        torch = self.torch
        ids = torch.tensor([[(n * 7919 + i * 104729) % 4096 for i in range(8)]], device=self.device)
        past = None
        with torch.no_grad():
            for _ in range(tokens):
                with self.lock:
                    out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                    past = out.past_key_values  # this request's KV cache, on the device
                    ids = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
                    token = int(ids.item())
                yield str(token)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    tokens = 24
    interval_s = 0.02
    model: "HashModel | Gpt2Model" = HashModel()

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        if self.path != "/generate":
            self.send_error(404)
            return
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for pos, token in enumerate(self.model.generate(int(request["n"]), self.tokens), 1):
            self._chunk(f"data: {pos} {token}\n\n")
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
    parser.add_argument("--model", choices=("hash", "gpt2"), default="hash")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    Handler.tokens, Handler.interval_s = args.tokens, args.interval_ms / 1000.0
    if args.model == "gpt2":
        Handler.model = Gpt2Model(args.device)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"listening on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``inference_worker``: a decoder-only transformer serving sessions in flight, with a KV cache per session.

A serving engine in miniature. The model is a small decoder-only transformer
(``layers`` blocks of causal self-attention with ``heads`` heads and a ReLU
MLP, RMSNorm, token and position embeddings and an output head), its weights drawn from the seed (no download), float32 on
the device (``rt.xp``). The engine has ``sessions`` slots; each slot holds one
session and its KV cache (``context`` positions per layer). Requests come from
a queue: request ``rid`` carries a prompt of ``prompt_tokens`` tokens and a
budget of new tokens (between half of ``max_new_tokens`` and all of it, drawn
from ``(seed, rid)``), so sessions finish at different steps and a freed slot
admits the next request while the others are mid-generation.

One op is one engine step, batched over every slot, as continuous batching
runs it: admit requests into free slots, run the model on each slot's next
input token at its position (a prompt token while the session is prefilling,
one token at a time, or the token it generated last), write the new keys and
values into the slot's cache, and pick the next token greedily (argmax). The
op's effect carries every token the step generated, each as ``[session,
position, token]``, and the reply of each session that finished: ``[session,
digest of its tokens]``. A duplicated op is tokens of in-flight sessions sent
twice; a missing one is tokens never sent.

Where the queue lives is a parameter (as in ``request_service``): ``queue =
"memory"`` keeps it in the process, ``"external"`` keeps its read position in
a file (a broker's committed offset; domain ``disk``), so a rollback does not
give back the requests the crashed incarnation took.

``app_checkpoint`` says what the engine's own checkpoint (the ``app``
backend's ``save_state``) holds. ``"weights"`` (the default) is what a serving
engine's own restart gives you: the model comes back, the sessions in flight,
their caches and the queue do not. ``"sessions"`` saves the whole engine
(weights, caches, the session table and the queue position), which serving
engines do not ship; it is here for the contrast.

Floating-point sums differ between NumPy, CuPy and PyTorch, so the ground
truth is recorded (``ground_truth = "recorded"``): two uninterrupted runs on
the machine and array backend, which must agree bit for bit. Every shape is
fixed (all slots run every step, free ones on a dummy token, so cuBLAS picks
the same kernels every step), no reduction uses atomics, and TF32 stays off
(CuPy's default; PyTorch's ``allow_tf32`` is set to False here).
"""

from __future__ import annotations

import hashlib
import json
import math
from types import ModuleType
from typing import Any, ClassVar

from cutbench.workloads.common import (BaseWorkload, RecordedWorkload, check_range, load_state_into, make_cursor,
                                      save_state_file, splitmix)
from cutbench.workloads.control import PHASES
from cutbench.workloads.xp import backend_name, pointer, synchronize, to_host

PROMPT_SALT = 0x9E0_5E55_1011
BUDGET_SALT = 0xB0D6_E7
NEG = -1.0e30  # the additive mask of a position a session has not reached


def blob_digest(arrays: list[Any]) -> str:
    """A digest of ``arrays``' bytes, bit for bit (reads device arrays back)."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(to_host(a).tobytes())
    return h.hexdigest()


class TinyDecoder:
    """The weights of the transformer and one decode step batched over every slot (see module docstring).

    The caches are laid out so that attention is two batched matmuls with no
    transpose: keys as ``[slots, heads, head_dim, context]``, values as
    ``[slots, heads, context, head_dim]``.
    """

    def __init__(self, xp: ModuleType, p: dict[str, Any]):
        import numpy as np

        self.xp = xp
        self.slots, self.layers, self.width = p["sessions"], p["layers"], p["width"]
        self.heads, self.context, self.vocab = p["heads"], p["context"], p["vocab"]
        self.head_dim = self.width // self.heads
        w, f = self.width, 4 * self.width
        rng = np.random.default_rng(p["seed"])

        def draw(*shape: int, scale: float) -> Any:
            return xp.asarray(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))

        self.emb = draw(self.vocab, w, scale=1.0)
        self.pos_emb = draw(self.context, w, scale=0.5)
        layer = []
        for _ in range(self.layers):
            layer.append({
                "wq": draw(w, w, scale=w ** -0.5), "wk": draw(w, w, scale=w ** -0.5),
                "wv": draw(w, w, scale=w ** -0.5), "wo": draw(w, w, scale=w ** -0.5),
                "w1": draw(w, f, scale=w ** -0.5), "w2": draw(f, w, scale=f ** -0.5),
                "g1": xp.asarray(np.ones(w, dtype=np.float32)), "g2": xp.asarray(np.ones(w, dtype=np.float32)),
            })
        self.layer = layer
        self.g_final = xp.asarray(np.ones(w, dtype=np.float32))
        self.head = draw(w, self.vocab, scale=w ** -0.5)
        s, h, d, c = self.slots, self.heads, self.head_dim, self.context
        self.k_cache = [xp.asarray(np.zeros((s, h, d, c), dtype=np.float32)) for _ in range(self.layers)]
        self.v_cache = [xp.asarray(np.zeros((s, h, c, d), dtype=np.float32)) for _ in range(self.layers)]
        self.slot_index = xp.asarray(np.arange(s, dtype=np.int64))
        self.next_tokens: Any = None

    def weights(self) -> dict[str, Any]:
        """Every weight tensor by name."""
        out = {"emb": self.emb, "pos_emb": self.pos_emb, "g_final": self.g_final, "head": self.head}
        for i, layer in enumerate(self.layer):
            out.update({f"l{i}.{k}": v for k, v in layer.items()})
        return out

    def caches(self) -> dict[str, Any]:
        """The KV cache of every layer by name."""
        out = {f"k{i}": k for i, k in enumerate(self.k_cache)}
        out.update({f"v{i}": v for i, v in enumerate(self.v_cache)})
        return out

    def parameter_count(self) -> int:
        """How many weights the model has."""
        return sum(math.prod(v.shape) for v in self.weights().values())

    def _norm(self, x: Any, gain: Any) -> Any:
        xp = self.xp
        return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * gain

    def launch(self, tokens: Any, positions: Any) -> None:
        """Enqueue one decode step: slot ``s`` reads token ``tokens[s]`` at position ``positions[s]`` (NumPy int64
        arrays), writes its keys and values there and attends to positions ``0..positions[s]``; the greedy next
        token of every slot is left in :attr:`next_tokens` on the device."""
        import numpy as np

        xp, s, h, d = self.xp, self.slots, self.heads, self.head_dim
        tok, pos = xp.asarray(tokens), xp.asarray(positions)
        reach = np.where(np.arange(self.context)[None, :] <= positions[:, None], 0.0, NEG).astype(np.float32)
        bias = xp.reshape(xp.asarray(reach), (s, 1, 1, self.context))
        x = xp.take(self.emb, tok, axis=0) + xp.take(self.pos_emb, pos, axis=0)
        scale = 1.0 / math.sqrt(d)
        for layer, k_cache, v_cache in zip(self.layer, self.k_cache, self.v_cache):
            a = self._norm(x, layer["g1"])
            q = xp.reshape(xp.matmul(a, layer["wq"]), (s, h, 1, d))
            k_cache[self.slot_index, :, :, pos] = xp.reshape(xp.matmul(a, layer["wk"]), (s, h, d))
            v_cache[self.slot_index, :, pos, :] = xp.reshape(xp.matmul(a, layer["wv"]), (s, h, d))
            scores = xp.matmul(q, k_cache) * scale + bias
            e = xp.exp(scores - xp.max(scores, axis=-1, keepdims=True))
            attn = e / xp.sum(e, axis=-1, keepdims=True)
            x = x + xp.matmul(xp.reshape(xp.matmul(attn, v_cache), (s, self.width)), layer["wo"])
            hid = xp.matmul(self._norm(x, layer["g2"]), layer["w1"])
            x = x + xp.matmul(xp.where(hid > 0, hid, xp.zeros_like(hid)), layer["w2"])
        logits = xp.matmul(self._norm(x, self.g_final), self.head)
        self.next_tokens = xp.argmax(logits, axis=-1)

    def read_next(self) -> list[int]:
        """The greedy next token of every slot, from the last :meth:`launch` (reads the device back)."""
        return [int(t) for t in to_host(self.next_tokens).reshape(-1)]


class Engine:
    """The engine's host state: which request each slot serves, where it is, what it generated."""

    EMPTY: ClassVar[dict[str, Any]] = {"rid": 0, "pos": 0, "budget": 0, "prompt": [], "generated": []}

    def __init__(self, p: dict[str, Any]):
        self.seed, self.vocab = p["seed"], p["vocab"]
        self.prompt_tokens, self.max_new = p["prompt_tokens"], p["max_new_tokens"]
        self.table: list[dict[str, Any]] = [dict(self.EMPTY) for _ in range(p["sessions"])]
        self.admitted = 0  # requests taken into a slot so far
        self.finished = 0

    def request(self, rid: int) -> dict[str, Any]:
        """Request ``rid``'s session at admission: its prompt and its budget of new tokens."""
        prompt = [splitmix(self.seed ^ PROMPT_SALT, rid, i) % self.vocab for i in range(self.prompt_tokens)]
        low = (self.max_new + 1) // 2
        budget = low + splitmix(self.seed ^ BUDGET_SALT, rid) % (self.max_new - low + 1)
        return {"rid": rid, "pos": 0, "budget": budget, "prompt": prompt, "generated": []}

    def admit(self, take: Any) -> None:
        """Fill every free slot, in slot order, with the next request ``take()`` gives."""
        for i, slot in enumerate(self.table):
            if not slot["rid"]:
                self.table[i] = self.request(take())
                self.admitted += 1

    def inputs(self) -> tuple[Any, Any]:
        """Each slot's input token and position for the next step (NumPy int64; a free slot reads token 0 at 0)."""
        import numpy as np

        tokens, positions = [], []
        for slot in self.table:
            if not slot["rid"]:
                tokens.append(0)
                positions.append(0)
                continue
            pos = slot["pos"]
            seen = slot["prompt"] + slot["generated"]
            tokens.append(seen[pos])
            positions.append(pos)
        return np.asarray(tokens, dtype=np.int64), np.asarray(positions, dtype=np.int64)

    def advance(self, next_tokens: list[int]) -> dict[str, Any]:
        """Take the step's greedy tokens: a prefilling session moves on through its prompt, a generating one
        appends its token; a session at its budget finishes and frees its slot. Returns the step's effect
        body: ``tokens`` as ``[session, position, token]`` and ``done`` as ``[session, digest]``."""
        tokens, done = [], []
        for i, slot in enumerate(self.table):
            if not slot["rid"]:
                continue
            slot["pos"] += 1
            if slot["pos"] >= len(slot["prompt"]):
                slot["generated"].append(next_tokens[i])
                tokens.append([slot["rid"], slot["pos"], next_tokens[i]])
            if len(slot["generated"]) == slot["budget"]:
                text = hashlib.blake2b(json.dumps(slot["generated"]).encode(), digest_size=8).hexdigest()
                done.append([slot["rid"], text])
                self.table[i] = dict(self.EMPTY)
                self.finished += 1
        return {"tokens": tokens, "done": done}

    def digest(self) -> str:
        """A digest of the session table."""
        text = json.dumps([self.table, self.admitted, self.finished], sort_keys=True)
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class InferenceWorker(RecordedWorkload):
    """The ``inference_worker`` workload (see module docstring)."""

    name: ClassVar[str] = "inference_worker"
    phases: ClassVar[tuple[str, ...]] = PHASES
    arrays: ClassVar[tuple[str, ...]] = ("numpy", "cupy", "torch")
    features: ClassVar[frozenset[str]] = frozenset({"device_memory", "cublas"})
    defaults: ClassVar[dict[str, Any]] = {
        **BaseWorkload.COMMON_DEFAULTS, "ops": 24, "sessions": 4, "layers": 2, "width": 64, "heads": 4,
        "vocab": 256, "context": 32, "prompt_tokens": 6, "max_new_tokens": 12, "queue": "memory",
        "app_checkpoint": "weights", "adapters": False,
    }
    choices: ClassVar[dict[str, tuple[Any, ...]]] = {"queue": ("memory", "external"),
                                                     "app_checkpoint": ("weights", "sessions")}
    # An external queue's read position is state on disk, outside any process image.
    # ``adapters = true``: a serving runtime's semantic adapters (BaseWorkload.join_cuts), its reply log on disk.
    param_domains: ClassVar[dict[tuple[str, Any], str]] = {("queue", "external"): "disk", ("adapters", True): "request_log"}

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """Slots, model shape, vocabulary, and a session that fits its cache."""
        check_range("sessions", p["sessions"], 1, 4096)
        check_range("layers", p["layers"], 1, 128)
        check_range("width", p["width"], 4, 1 << 15)
        check_range("heads", p["heads"], 1, 1024)
        check_range("vocab", p["vocab"], 2, 1 << 20)
        check_range("context", p["context"], 2, 1 << 16)
        check_range("prompt_tokens", p["prompt_tokens"], 1, 1 << 16)
        check_range("max_new_tokens", p["max_new_tokens"], 1, 1 << 16)
        if p["width"] % p["heads"]:
            raise ValueError(f"width = {p['width']} is not a multiple of heads = {p['heads']}: each head gets "
                             "width / heads dimensions; pick a width divisible by heads")
        if p["prompt_tokens"] + p["max_new_tokens"] > p["context"]:
            raise ValueError(f"prompt_tokens + max_new_tokens = {p['prompt_tokens'] + p['max_new_tokens']} is longer "
                             f"than the KV cache (context = {p['context']}): raise context or shorten the sessions")

    def setup(self) -> None:
        """Build the model and the caches on the device; open the request queue."""
        if backend_name(self.xp) == "torch":
            import torch

            torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmuls stay float32 (the default, made sure)
        self.start_device()
        self.model = TinyDecoder(self.xp, self.p)
        self.engine = Engine(self.p)
        self.queue = make_cursor(self.p["queue"], self.rt.workdir / "requests.offset")
        self.join_cuts(self.queue)
        synchronize(self.xp)
        self.rt.mark_startup("model_build")
        self.pointers_initial = self.pointers()

    def pointers(self) -> dict[str, int]:
        """The addresses of the first layer's key cache and of the token embedding."""
        return {"k_cache": pointer(self.model.k_cache[0]), "embedding": pointer(self.model.emb)}

    def run_op(self, op: int) -> None:
        """One engine step through all seven phases: admit requests into free slots, decode, publish the tokens."""
        engine, model = self.engine, self.model
        engine.admit(self.queue.take)
        tokens, positions = engine.inputs()

        def read() -> str:
            return json.dumps({"step": op, **engine.advance(model.read_next())})

        self.step_through(op, lambda: model.launch(tokens, positions), read)

    def report(self) -> dict[str, Any]:
        """Committed step, a digest of sessions, caches and weights, the queue against admissions, addresses."""
        model, engine = self.model, self.engine
        state = blob_digest([*model.caches().values()])
        checksum = hashlib.blake2b(f"{engine.digest()}:{state}".encode(), digest_size=16).hexdigest()
        domain_ops = {"queue": self.queue.position(), "admitted": engine.admitted}
        return {
            **self.report_frame(checksum, domain_ops, "requests taken from the queue = sessions admitted"),
            "sessions_finished": engine.finished,
            "parameters": model.parameter_count(),
            "weights": blob_digest(list(model.weights().values())),
            "backend": backend_name(self.xp),
            "pointers_initial": self.pointers_initial,
            "pointers_final": self.pointers(),
        }

    def save_state(self, path: str) -> None:
        """The engine's own checkpoint at a step boundary (the ``app`` baseline): the weights, and with
        ``app_checkpoint = "sessions"`` the caches, the session table and the queue position too."""
        model, engine = self.model, self.engine
        header: dict[str, Any] = {"committed": self.committed}
        arrays = dict(model.weights())
        if self.p["app_checkpoint"] == "sessions":
            header.update(table=engine.table, admitted=engine.admitted, finished=engine.finished,
                          queue=self.queue.position())
            arrays.update(model.caches())
        save_state_file(path, header, arrays)

    def load_state(self, path: str) -> int:
        """Load :meth:`save_state`'s file into the buffers :meth:`setup` made; return the step to resume after.

        From weights alone the engine comes back empty: no session in flight, the queue where a fresh
        process finds it (a memory queue from its first request, an external one where it was left)."""
        model, engine = self.model, self.engine
        sessions = self.p["app_checkpoint"] == "sessions"
        targets = {**model.weights(), **(model.caches() if sessions else {})}
        header = load_state_into(path, self.xp, targets)
        if sessions:
            engine.table, engine.admitted, engine.finished = header["table"], header["admitted"], header["finished"]
            self.queue.seek(header["queue"])
        self.committed = int(header["committed"])
        return self.committed

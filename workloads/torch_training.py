"""``torch_training``: a small transformer trained with AdamW, fed by a shuffling data loader with worker processes.

A training script in miniature, the kind a job scheduler preempts. The model
is a decoder-only transformer: token and position embeddings, ``layers``
blocks of causal self-attention with ``heads`` heads and a GELU MLP, each
behind an RMSNorm with a residual connection, a final RMSNorm and an output
head tied to the token embedding. It learns next-token prediction
(cross-entropy) on a synthetic corpus drawn from the seed (no download):
``corpus_sequences`` sequences of ``seq_len + 1`` tokens from a random sparse
Markov chain over ``vocab`` tokens (four possible successors each), so the
loss has something to go down to.
Weights, gradients and the AdamW moments live on the device (``rt.xp``, any
array backend: NumPy, CuPy, or PyTorch's array API namespace); NumPy has no
autograd, so the forward and the backward pass are written out by hand in
array API spellings that run on all three, and a unit test checks the
gradient of every parameter against finite differences.

One op is one optimizer step: ``accum`` micro-batches of ``batch_size``
sequences, each one's gradient accumulated, the sum clipped to a global norm
of ``clip_norm`` (0: no clipping), then AdamW with bias correction and
decoupled weight decay (on the matrices and embeddings, not the norm gains)
at the learning rate of the schedule: a linear warm-up over ``warmup_steps``,
then a cosine decay to a tenth of ``lr`` at ``decay_steps``. The op's effect
carries the step, the IEEE-754 bits of its loss (the mean over its
micro-batches) and a digest of every parameter after it, bit for bit.

The data loader is a training script's: a sampler in the process shuffles
the corpus afresh each epoch with a seeded NumPy generator and hands out
micro-batches of indices from a cursor ``(epoch, index)`` (an epoch ends
where fewer than ``batch_size`` sequences remain, as ``drop_last`` does);
``loader_workers`` worker processes gather the sequences and send the batches
back over pipes, two micro-batches ahead per worker (PyTorch's
``prefetch_factor``), in the order they were asked for, so the batches are the
same whatever the number of workers (``0``: loaded in the process). The
workers are exec'd interpreters (``python -m cutbench.workloads.data_loader
--loader-worker``: :mod:`cutbench.workloads.data_loader`) that import no CUDA library and see no GPU, never forks of a
process that holds a CUDA context (the CUDA support matrix measured that a
forked child inheriting the parent's device mapping breaks ``cuda+criu``).
They are the workload's own children, so a checkpoint of its process tree
takes them and whatever is in flight in their pipes; they die with it (EOF on
their stdin, and ``PR_SET_PDEATHSIG``).

Like a training script, it writes its own checkpoint every ``cpt_every_ops``
steps (0: never): weights, AdamW moments, the step, the loader's generator
state and cursor, to ``train.cpt`` in its trial directory (state on disk,
domain ``disk``, outside any process image), one record rewritten in place.
The ``app`` baseline saves and loads the same state (``save_state`` /
``load_state``), and a run continued from it is the uninterrupted run bit for
bit. With ``continue_from_cpt`` the script also resumes from ``train.cpt``
when it finds one at start (its restart path), so a requeue (the ``restart``
backend) recomputes only the steps since its last checkpoint.

Floating-point sums differ between NumPy, CuPy and PyTorch, so the ground
truth is recorded (``ground_truth = "recorded"``): two uninterrupted runs on
the machine and array backend, which must agree bit for bit. What makes them
agree: every shape is fixed (the same micro-batch shape every step, so cuBLAS
picks the same kernels), every reduction runs in a fixed order on one stream
with no atomics (the embedding's gradient is a one-hot matrix product, not a
scatter-add), and TF32 is off (CuPy's default; on PyTorch ``allow_tf32`` is
set to False and ``torch.use_deterministic_algorithms(True)`` makes any
nondeterministic kernel an error, with ``CUBLAS_WORKSPACE_CONFIG`` set before
CUDA starts, as it requires). No ``torch.compile`` and no autograd: the same
hand-written code runs on every backend.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from types import ModuleType
from typing import Any, ClassVar

from cutbench.files import overwrite_durably
from cutbench.workloads.common import (MASK, BaseWorkload, RecordedWorkload, check_range, load_state_into,
                                      save_state_file, state_bytes)
from cutbench.workloads.control import PHASES
from cutbench.workloads.data_loader import Loader
from cutbench.workloads.xp import backend_name, pointer, synchronize, to_host

CPT_NAME = "train.cpt"
INIT_SALT = 0x1A1_7
NEG = -1.0e9  # the additive causal mask above the diagonal: exp() of it is 0 in float32 and float64
GELU_C = math.sqrt(2.0 / math.pi)


# -- the model ------------------------------------------------------------------


def transpose(xp: ModuleType, a: Any) -> Any:
    """Return ``a`` with its last two axes swapped (the array API's ``matrix_transpose``)."""
    f = getattr(xp, "matrix_transpose", None)
    return f(a) if f is not None else xp.swapaxes(a, -1, -2)


def permute(xp: ModuleType, a: Any, axes: tuple[int, ...]) -> Any:
    """Return ``a`` with its axes in the order ``axes`` (the array API's ``permute_dims``)."""
    f = getattr(xp, "permute_dims", None)
    return f(a, axes) if f is not None else xp.transpose(a, axes)


def upload(xp: ModuleType, host: Any, dtype: Any) -> Any:
    """A new array of ``xp`` holding NumPy array ``host``: made by a factory (on the namespace's default device,
    a GPU for torch), then filled."""
    buf = xp.zeros(tuple(host.shape), dtype=dtype)
    buf[...] = xp.asarray(host)
    return buf


def rms_norm(xp: ModuleType, x: Any, g: Any) -> tuple[Any, Any]:
    """RMSNorm of ``x`` over its last axis with gain ``g``; also the reciprocal RMS the backward pass needs."""
    r = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + 1e-5)
    return x * r * g, r


def rms_norm_back(xp: ModuleType, dy: Any, x: Any, r: Any, g: Any) -> tuple[Any, Any]:
    """The gradients of :func:`rms_norm` with respect to ``x`` and ``g``, given the output's ``dy``."""
    dg = xp.sum(xp.reshape(dy * x * r, (-1, x.shape[-1])), axis=0)
    dn = dy * g
    return r * (dn - x * (r * r) * xp.mean(dn * x, axis=-1, keepdims=True)), dg


def gelu(xp: ModuleType, u: Any) -> tuple[Any, Any]:
    """GELU (the tanh form) of ``u`` and its derivative."""
    t = xp.tanh(GELU_C * (u + 0.044715 * u * u * u))
    return 0.5 * u * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * u * u)


class Transformer:
    """The transformer's parameters and its loss with every gradient, forward and backward by hand (see module
    docstring). Parameters are a dict in a fixed order; every step updates them in place."""

    def __init__(self, xp: ModuleType, p: dict[str, Any]):
        import numpy as np

        self.xp = xp
        self.dtype = getattr(xp, p["dtype"])
        self.B, self.T, self.C, self.H = p["batch_size"], p["seq_len"], p["d_model"], p["heads"]
        self.V, self.L = p["vocab"], p["layers"]
        rng = np.random.default_rng([p["seed"] & MASK, INIT_SALT])
        self.params: dict[str, Any] = {}
        for name, shape, std in self.layout(p):
            host = np.ones(shape) if std is None else rng.standard_normal(shape) * std
            self.params[name] = upload(xp, host.astype(p["dtype"]), self.dtype)
        mask = np.triu(np.full((self.T, self.T), NEG), k=1)
        self.mask = upload(xp, mask.astype(p["dtype"]), self.dtype)

    @staticmethod
    def layout(p: dict[str, Any]) -> list[tuple[str, tuple[int, ...], float | None]]:
        """Every parameter: name, shape, initial standard deviation (None: a norm gain, ones)."""
        C, L = p["d_model"], p["layers"]
        out: list[tuple[str, tuple[int, ...], float | None]] = [
            ("wte", (p["vocab"], C), 0.02), ("wpe", (p["context"], C), 0.01)]
        for i in range(L):
            # The projections back into the residual stream start smaller, by 1/sqrt(2 L) (GPT-2's scaling).
            out += [(f"h{i}.norm1", (C,), None), (f"h{i}.qkv", (C, 3 * C), 0.02),
                    (f"h{i}.proj", (C, C), 0.02 / math.sqrt(2 * L)), (f"h{i}.norm2", (C,), None),
                    (f"h{i}.fc", (C, 4 * C), 0.02), (f"h{i}.out", (4 * C, C), 0.02 / math.sqrt(2 * L))]
        return out + [("norm_f", (C,), None)]

    def loss_and_grads(self, x1: Any, y1: Any, weight: float = 1.0) -> tuple[Any, dict[str, Any]]:
        """The mean next-token cross-entropy of one micro-batch times ``weight`` (a 0-d array) and its gradient
        for every parameter. ``x1`` and ``y1`` are the one-hot input and target tokens, ``[batch * seq_len, vocab]``."""
        xp, P = self.xp, self.params
        B, T, C, H = self.B, self.T, self.C, self.H
        D, BT = C // H, B * T
        scale = 1.0 / math.sqrt(D)
        # -- forward, keeping what the backward pass reads
        x = xp.reshape(xp.matmul(x1, P["wte"]), (B, T, C)) + P["wpe"][:T]
        saved = []
        for i in range(self.L):
            x_in = x
            n1, r1 = rms_norm(xp, x, P[f"h{i}.norm1"])
            n1 = xp.reshape(n1, (BT, C))
            qkv = permute(xp, xp.reshape(xp.matmul(n1, P[f"h{i}.qkv"]), (B, T, 3, H, D)), (2, 0, 3, 1, 4))
            q, k, v = qkv[0], qkv[1], qkv[2]  # [B, H, T, D] each
            s = xp.matmul(q, transpose(xp, k)) * scale + self.mask
            e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
            att = e / xp.sum(e, axis=-1, keepdims=True)
            o = xp.reshape(permute(xp, xp.matmul(att, v), (0, 2, 1, 3)), (BT, C))
            x = x + xp.reshape(xp.matmul(o, P[f"h{i}.proj"]), (B, T, C))
            x_mid = x
            n2, r2 = rms_norm(xp, x, P[f"h{i}.norm2"])
            n2 = xp.reshape(n2, (BT, C))
            u = xp.matmul(n2, P[f"h{i}.fc"])
            a, da = gelu(xp, u)
            x = x + xp.reshape(xp.matmul(a, P[f"h{i}.out"]), (B, T, C))
            saved.append((x_in, n1, r1, q, k, v, att, o, x_mid, n2, r2, a, da))
        nf, rf = rms_norm(xp, x, P["norm_f"])
        nf = xp.reshape(nf, (BT, C))
        logits = xp.matmul(nf, transpose(xp, P["wte"]))  # the output head is the token embedding
        z = logits - xp.max(logits, axis=-1, keepdims=True)
        logp = z - xp.log(xp.sum(xp.exp(z), axis=-1, keepdims=True))
        w = weight / BT
        loss = -xp.sum(y1 * logp) * w
        # -- backward
        g: dict[str, Any] = {}
        dlogits = (xp.exp(logp) - y1) * w
        dwte = xp.matmul(transpose(xp, dlogits), nf)
        dx, g["norm_f"] = rms_norm_back(xp, xp.reshape(xp.matmul(dlogits, P["wte"]), (B, T, C)), x, rf, P["norm_f"])
        for i in reversed(range(self.L)):
            x_in, n1, r1, q, k, v, att, o, x_mid, n2, r2, a, da = saved[i]
            # the MLP: x = x_mid + gelu(n2 @ fc) @ out
            dh = xp.reshape(dx, (BT, C))
            g[f"h{i}.out"] = xp.matmul(transpose(xp, a), dh)
            du = xp.matmul(dh, transpose(xp, P[f"h{i}.out"])) * da
            g[f"h{i}.fc"] = xp.matmul(transpose(xp, n2), du)
            dn2 = xp.reshape(xp.matmul(du, transpose(xp, P[f"h{i}.fc"])), (B, T, C))
            dxm, g[f"h{i}.norm2"] = rms_norm_back(xp, dn2, x_mid, r2, P[f"h{i}.norm2"])
            dx = dx + dxm
            # attention: x_mid = x_in + attention(n1) @ proj
            dh = xp.reshape(dx, (BT, C))
            g[f"h{i}.proj"] = xp.matmul(transpose(xp, o), dh)
            do = permute(xp, xp.reshape(xp.matmul(dh, transpose(xp, P[f"h{i}.proj"])), (B, T, H, D)), (0, 2, 1, 3))
            datt = xp.matmul(do, transpose(xp, v))
            dv = xp.matmul(transpose(xp, att), do)
            ds = att * (datt - xp.sum(datt * att, axis=-1, keepdims=True)) * scale
            dq = xp.matmul(ds, k)
            dk = xp.matmul(transpose(xp, ds), q)
            dqkv = xp.reshape(permute(xp, xp.stack([dq, dk, dv]), (1, 3, 0, 2, 4)), (BT, 3 * C))
            g[f"h{i}.qkv"] = xp.matmul(transpose(xp, n1), dqkv)
            dn1 = xp.reshape(xp.matmul(dqkv, transpose(xp, P[f"h{i}.qkv"])), (B, T, C))
            dxa, g[f"h{i}.norm1"] = rms_norm_back(xp, dn1, x_in, r1, P[f"h{i}.norm1"])
            dx = dx + dxa
        dwpe = xp.zeros(P["wpe"].shape, dtype=self.dtype)
        dwpe[:T] = xp.sum(dx, axis=0)
        g["wpe"] = dwpe
        # The embedding's gradient as a one-hot product: a fixed reduction order, where a scatter-add would
        # use atomics on a GPU.
        g["wte"] = dwte + xp.matmul(transpose(xp, x1), xp.reshape(dx, (BT, C)))
        return loss, {name: g[name] for name in P}


def learning_rate(p: dict[str, Any], step: int) -> float:
    """The learning rate of optimizer step ``step`` (1-based): linear warm-up, then cosine decay to lr / 10."""
    lr, warm, decay = p["lr"], p["warmup_steps"], p["decay_steps"]
    if step <= warm:
        return lr * step / warm
    progress = min(1.0, (step - warm) / max(1, decay - warm))
    return 0.1 * lr + 0.45 * lr * (1.0 + math.cos(math.pi * progress))


def blob_digest(arrays: list[Any], extra: str = "") -> str:
    """A digest of ``arrays``' bytes, bit for bit (reads device arrays back), and of ``extra``."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(to_host(a).tobytes())
    h.update(extra.encode())
    return h.hexdigest()


class Trainer:
    """The training run's state: the model, the AdamW moments, the step and the loader; :meth:`launch` takes
    one optimizer step."""

    def __init__(self, xp: ModuleType, p: dict[str, Any], loader: Loader):
        import numpy as np

        self.xp, self.p, self.loader = xp, p, loader
        self.model = Transformer(xp, p)
        dt = self.model.dtype
        self.m = {k: xp.zeros(a.shape, dtype=dt) for k, a in self.model.params.items()}
        self.v = {k: xp.zeros(a.shape, dtype=dt) for k, a in self.model.params.items()}
        self.decay = {k: len(a.shape) >= 2 for k, a in self.model.params.items()}
        self.step = 0
        self.loss: Any = None
        rows = p["batch_size"] * p["seq_len"]
        # The micro-batch's one-hot tokens, one buffer each, refilled every micro-batch (fixed shapes).
        self.x1 = xp.zeros((rows, p["vocab"]), dtype=dt)
        self.y1 = xp.zeros((rows, p["vocab"]), dtype=dt)
        self.host_dtype = np.dtype(p["dtype"])
        self.clip = xp.full((), float(p["clip_norm"]), dtype=dt)

    def load_batch(self, tokens: Any) -> None:
        """Copy one micro-batch of tokens (``[batch, seq_len + 1]``, NumPy) to the device as one-hot inputs and
        targets."""
        import numpy as np

        rows = np.arange(self.p["batch_size"] * self.p["seq_len"])
        for buf, ids in ((self.x1, tokens[:, :-1]), (self.y1, tokens[:, 1:])):
            host = np.zeros((rows.shape[0], self.p["vocab"]), dtype=self.host_dtype)
            host[rows, ids.reshape(-1)] = 1.0
            buf[...] = self.xp.asarray(host)

    def launch(self) -> None:
        """Enqueue one optimizer step: ``accum`` micro-batches, their gradients summed, clipped, then AdamW."""
        xp, p = self.xp, self.p
        loss, grads = None, None
        for _ in range(p["accum"]):
            self.load_batch(self.loader.next_batch())
            part, g = self.model.loss_and_grads(self.x1, self.y1, 1.0 / p["accum"])
            loss = part if loss is None else loss + part
            grads = g if grads is None else {k: grads[k] + g[k] for k in grads}
        assert grads is not None  # accum >= 1 (validate_params): at least one micro-batch
        if p["clip_norm"] > 0:
            total = None
            for g in grads.values():  # a fixed order: the parameters'
                s = xp.sum(g * g)
                total = s if total is None else total + s
            norm = xp.sqrt(total)
            factor = self.clip / xp.where(norm > self.clip, norm, self.clip)  # 1 unless the norm exceeds the clip
            grads = {k: g * factor for k, g in grads.items()}
        self.step += 1
        self.adamw(grads, learning_rate(p, self.step))
        self.loss = loss

    def adamw(self, grads: dict[str, Any], lr: float) -> None:
        """AdamW (PyTorch's formulation): decoupled weight decay, bias-corrected moments; in place."""
        xp, p = self.xp, self.p
        b1, b2 = p["beta1"], p["beta2"]
        bc1, bc2 = 1.0 - b1 ** self.step, 1.0 - b2 ** self.step
        for k, param in self.model.params.items():
            g, m, v = grads[k], self.m[k], self.v[k]
            if self.decay[k]:
                param *= 1.0 - lr * p["weight_decay"]
            m *= b1
            m += (1.0 - b1) * g
            v *= b2
            v += (1.0 - b2) * (g * g)
            param -= (lr / bc1) * (m / (xp.sqrt(v) * (1.0 / math.sqrt(bc2)) + 1e-8))

    def params_digest(self) -> str:
        """Digest of every parameter, bit for bit."""
        return blob_digest(list(self.model.params.values()))

    def state_digest(self) -> str:
        """Digest of the whole training state: parameters, moments, step, loader position."""
        return blob_digest([*self.model.params.values(), *self.m.values(), *self.v.values()],
                           json.dumps({"step": self.step, "loader": self.loader.state()}, sort_keys=True))

    def effect(self) -> str:
        """The last step's effect: the step, its loss's bits and the parameter digest (reads the device back)."""
        (bits,) = struct.unpack("<Q", struct.pack("<d", float(self.loss)))
        return json.dumps({"step": self.step, "loss": f"{bits:016x}", "params": self.params_digest()})

    def arrays(self) -> dict[str, Any]:
        """The buffers a checkpoint of the run holds: parameters and AdamW moments."""
        out = {f"param.{k}": a for k, a in self.model.params.items()}
        out.update({f"adam_m.{k}": a for k, a in self.m.items()})
        out.update({f"adam_v.{k}": a for k, a in self.v.items()})
        return out

    def header(self) -> dict[str, Any]:
        """The host half of a checkpoint: the step and the loader's generator state and cursor."""
        return {"step": self.step, "loader": self.loader.state()}

    def load_header(self, header: dict[str, Any]) -> None:
        """Take :meth:`header`'s step and loader position back."""
        self.step = int(header["step"])
        self.loader.restore(header["loader"])


# -- the workload ---------------------------------------------------------------


class TorchTraining(RecordedWorkload):
    """The ``torch_training`` workload (see module docstring)."""

    name: ClassVar[str] = "torch_training"
    phases: ClassVar[tuple[str, ...]] = PHASES
    arrays: ClassVar[tuple[str, ...]] = ("numpy", "cupy", "torch")
    features: ClassVar[frozenset[str]] = frozenset({"device_memory"})
    # torch.use_deterministic_algorithms needs it before cuBLAS starts.
    environment: ClassVar[dict[str, str]] = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    defaults: ClassVar[dict[str, Any]] = {
        **BaseWorkload.COMMON_DEFAULTS, "ops": 40,
        "vocab": 64, "d_model": 32, "heads": 4, "layers": 2, "context": 64, "dtype": "float32",
        "seq_len": 32, "batch_size": 8, "accum": 2, "corpus_sequences": 256, "loader_workers": 2,
        "lr": 3e-3, "warmup_steps": 10, "decay_steps": 200, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
        "clip_norm": 1.0, "cpt_every_ops": 0, "continue_from_cpt": False,
    }
    choices: ClassVar[dict[str, tuple[Any, ...]]] = {"dtype": ("float32", "float64")}

    @classmethod
    def check_params(cls, p: dict[str, Any]) -> None:
        """Model shape, sequence against context, batches, accumulation, optimizer, loader, checkpoint interval."""
        check_range("vocab", p["vocab"], 2, 1 << 16)
        check_range("d_model", p["d_model"], 2, 8192)
        check_range("heads", p["heads"], 1, p["d_model"])
        if p["d_model"] % p["heads"]:
            raise ValueError(f"parameter heads = {p['heads']}: d_model = {p['d_model']} is not a multiple of it "
                             "(each head gets d_model / heads dimensions)")
        check_range("layers", p["layers"], 1, 256)
        check_range("context", p["context"], 1, 1 << 16)
        check_range("seq_len", p["seq_len"], 1)
        if p["seq_len"] > p["context"]:
            raise ValueError(f"parameter seq_len = {p['seq_len']}: longer than the model's context "
                             f"(context = {p['context']}); raise context or shorten seq_len")
        check_range("corpus_sequences", p["corpus_sequences"], 1, 1 << 24)
        check_range("batch_size", p["batch_size"], 1, p["corpus_sequences"])
        check_range("accum", p["accum"], 1, 1 << 16)
        check_range("loader_workers", p["loader_workers"], 0, 64)
        check_range("warmup_steps", p["warmup_steps"], 0, 1 << 30)
        check_range("decay_steps", p["decay_steps"], 0, 1 << 30)
        for name, lo, hi in (("lr", 1e-8, 1.0), ("weight_decay", 0.0, 1.0), ("beta1", 0.0, 0.9999),
                             ("beta2", 0.0, 0.99999), ("clip_norm", 0.0, 1e6)):
            if isinstance(p[name], bool) or not isinstance(p[name], (int, float)) or not lo <= float(p[name]) <= hi:
                raise ValueError(f"parameter {name} = {p[name]!r}: expected a number in [{lo}, {hi}]")
        check_range("cpt_every_ops", p["cpt_every_ops"], 0, 1 << 30)
        if p["continue_from_cpt"] and not p["cpt_every_ops"]:
            raise ValueError("continue_from_cpt = true needs cpt_every_ops > 0: without its own checkpoint there is "
                             "nothing to resume from")

    @classmethod
    def domains_for(cls, params: dict[str, Any]) -> frozenset[str]:
        """Its own checkpoint file is state on disk."""
        return frozenset({"disk"}) if int(params.get("cpt_every_ops") or 0) > 0 else frozenset()

    def setup(self) -> None:
        """Build the model, the optimizer state and the loader (its workers start at the first batch)."""
        if backend_name(self.xp) == "torch":
            import torch

            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first matmul makes a handle
            torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmuls stay float32 (the default, made sure)
            torch.backends.cudnn.allow_tf32 = False
            torch.use_deterministic_algorithms(True)
        self.start_device()
        self.loader = Loader(self.p)
        self.trainer = Trainer(self.xp, self.p, self.loader)
        synchronize(self.xp)
        self.rt.mark_startup("model_build")
        self.pointers_initial = self.pointers()

    def pointers(self) -> dict[str, int]:
        """The addresses of the token embedding and of its first AdamW moment (both updated in place)."""
        t = self.trainer
        return {"embedding": pointer(t.model.params["wte"]), "adam_m_embedding": pointer(t.m["wte"])}

    def run_op(self, op: int) -> None:
        """One optimizer step through all seven phases; every ``cpt_every_ops`` steps, its own checkpoint."""
        self.step_through(op, self.trainer.launch, self.trainer.effect)
        every = self.p["cpt_every_ops"]
        if every and op % every == 0:
            self.write_cpt(str(self.rt.workdir / CPT_NAME))

    def write_cpt(self, path: str) -> None:
        """The training script's own checkpoint: one record written over the last in place, then fsync (never
        a second path: a cut inside the write leaves no renamed-away file for a restore to miss)."""
        overwrite_durably(path, state_bytes({"committed": self.committed, **self.trainer.header()}, self.trainer.arrays()))

    def finish(self) -> None:
        """Let the loader's workers go."""
        self.loader.close()

    def report(self) -> dict[str, Any]:
        """Committed step, the digest of the whole training state, the loader's position and buffer addresses."""
        t = self.trainer
        return {
            **self.report_frame(t.state_digest()),
            "step": t.step,
            "loader": {k: v for k, v in self.loader.state().items() if k != "rng"},
            "backend": backend_name(self.xp),
            "pointers_initial": self.pointers_initial,
            "pointers_final": self.pointers(),
        }

    def save_state(self, path: str) -> None:
        """Application-level checkpoint at a step boundary (the ``app`` baseline): what :meth:`write_cpt` holds."""
        save_state_file(path, {"committed": self.committed, **self.trainer.header()}, self.trainer.arrays())

    def continue_from_own_checkpoint(self) -> int:
        """The training script's resume (``--resume-from-checkpoint``), called in a process started afresh: with
        ``continue_from_cpt``, load ``train.cpt`` when the trial directory has one and return the step it holds
        (training goes on after it); 0 to start from step 1."""
        path = self.rt.workdir / CPT_NAME
        if not self.p["continue_from_cpt"] or not path.exists():
            return 0
        return self.load_state(str(path))

    def load_state(self, path: str) -> int:
        """Load :meth:`save_state`'s file (or ``train.cpt``, the same format) into the buffers :meth:`setup` made
        and put the loader back at its cursor; return the step to resume after."""
        header = load_state_into(path, self.xp, self.trainer.arrays())
        self.trainer.load_header(header)
        self.committed = int(header["committed"])
        return self.committed

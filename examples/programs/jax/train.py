"""A JAX training loop that knows nothing of cutbench.

    python train.py [--steps N] [--save-every K] [--step-ms MS] [--resume]

A small MLP regresses a fixed random teacher with plain SGD under ``jax.jit``; batch *i* comes from
``jax.random.fold_in(key, i)``, so a resume draws the batches it would have drawn. One metrics line per step on
stdout, ``step N loss HEX`` (the loss's exact bits); every ``--save-every`` steps it saves its parameters and step
(``numpy.savez`` to a temporary file, then renamed): ``--resume`` continues from that file. At the end it writes
``final.txt``, the SHA-256 of the parameters' bytes. Deterministic on a GPU with
``XLA_FLAGS=--xla_gpu_deterministic_ops=true`` (its scenario sets it), and it takes GPU memory as it needs it
(``XLA_PYTHON_CLIENT_PREALLOCATE=false``): a checkpoint of the GPU holds what it uses, not three quarters of it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

CHECKPOINT = "checkpoint.npz"
DIM, HIDDEN, BATCH = 64, 256, 32


def init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (DIM, HIDDEN)) * 0.05, "b1": jnp.zeros(HIDDEN),
            "w2": jax.random.normal(k2, (HIDDEN, 1)) * 0.05, "b2": jnp.zeros(1)}


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


@jax.jit
def step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads), loss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    key = jax.random.PRNGKey(1234)
    teacher = jax.random.normal(jax.random.PRNGKey(7), (DIM, 1))
    params, start = init(key), 0
    if args.resume and os.path.exists(CHECKPOINT):
        saved = np.load(CHECKPOINT)
        params = {k: jnp.asarray(saved[k]) for k in params}
        start = int(saved["step"])
        print(f"resumed from step {start}", file=sys.stderr, flush=True)
    for i in range(start, args.steps):
        x = jax.random.normal(jax.random.fold_in(key, i), (BATCH, DIM))
        y = jnp.tanh(x @ teacher)
        params, loss = step(params, x, y)
        bits = np.asarray(loss, dtype=np.float32).tobytes().hex()
        print(f"step {i + 1} loss {bits}", flush=True)
        if (i + 1) % args.save_every == 0:
            np.savez(CHECKPOINT + ".tmp.npz", step=i + 1, **{k: np.asarray(v) for k, v in params.items()})
            os.replace(CHECKPOINT + ".tmp.npz", CHECKPOINT)
        time.sleep(args.step_ms / 1000.0)
    digest = hashlib.sha256(b"".join(np.asarray(params[k]).tobytes() for k in sorted(params))).hexdigest()
    with open("final.txt", "w") as fh:
        fh.write(digest + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

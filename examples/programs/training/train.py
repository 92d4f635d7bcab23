"""A plain PyTorch training script that knows nothing of cutbench.

    python train.py [--steps N] [--save-every K] [--workers W] [--start fork|spawn] [--device cuda|cpu]
                    [--step-ms MS] [--resume]

A small MLP regresses a fixed random teacher on batches a ``DataLoader``
with worker processes draws from a synthetic dataset (batch *i* is made from
seed *i*: the same batches in every run, and a resume starts at the batch it
stopped at). AdamW with a cosine learning rate. One metrics line per step on
stdout, ``step N loss HEX`` (the loss's exact bits); every ``--save-every``
steps it saves model, optimiser and step with ``torch.save`` (to a temporary
file, then renamed): ``--resume`` continues from that file. At the end it
writes ``final.txt``: the SHA-256 of every parameter's bytes. Deterministic
(seeds, ``torch.use_deterministic_algorithms``): the same steps print the
same lines. ``--step-ms`` waits that long after each step (a bigger model's step
time, so that a cut lands mid-run on a fast GPU). ``--start``: how the loader starts
its workers (``fork``, PyTorch's default on Linux: after CUDA started in the
parent; or ``spawn``: fresh interpreters).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS needs, before CUDA starts

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

CHECKPOINT = "checkpoint.pt"
DIM, HIDDEN, BATCH = 64, 256, 32


class Batches(Dataset):
    """Batch ``i`` (from ``start``): inputs from seed ``i``, targets from the fixed teacher."""

    def __init__(self, steps: int, start: int):
        self.steps, self.start = steps, start
        teacher = torch.Generator().manual_seed(1234)
        self.w = torch.randn(DIM, 1, generator=teacher)

    def __len__(self) -> int:
        return self.steps - self.start

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.start + i)
        x = torch.randn(BATCH, DIM, generator=g)
        return x, torch.tanh(x @ self.w) + 0.01 * torch.randn(BATCH, 1, generator=g)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--start", choices=("fork", "spawn"), default="fork")
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    device = torch.device(args.device)
    model = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
                          nn.Linear(HIDDEN, 1)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    start = 0
    if args.resume and os.path.exists(CHECKPOINT):
        saved = torch.load(CHECKPOINT, map_location=device)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        start = saved["step"]
        print(f"resumed from step {start}", file=sys.stderr, flush=True)
    loader = DataLoader(Batches(args.steps, start), batch_size=None, shuffle=False, num_workers=args.workers,
                        multiprocessing_context=args.start if args.workers else None)
    step = start
    for x, y in loader:
        step += 1
        for group in opt.param_groups:  # a cosine schedule, a function of the step alone
            group["lr"] = 3e-3 * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item().hex()}", flush=True)
        if args.step_ms:
            time.sleep(args.step_ms / 1000.0)
        if step % args.save_every == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, CHECKPOINT + ".tmp")
            os.replace(CHECKPOINT + ".tmp", CHECKPOINT)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    with open("final.txt", "w") as fh:
        fh.write(h.hexdigest() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

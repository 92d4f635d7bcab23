"""How many receiver effects per second the oracle judges, on one core.

Builds one synthetic trial per size in the shape the receiver store writes
(``op_id``, ``attempt``, ``epoch`` int64; ``digest``, ``decision`` strings):
every op applied once, 1% of the rows an op applied again after the restore
(epoch 1), 0.5% redeliveries the receiver suppressed, 0.1% of the committed
ops never applied and a few effects carrying the previous op's payload. The
reference is a ``ReplayReference`` (the class most workloads use), replayed
to the last op before the clock starts: its replay is the workload's cost,
its look-ups the oracle's. Pins the process to one CPU
(``os.sched_setaffinity``), times the oracle, ``cutbench.api.judge`` (best of ``--repeat``), and
prints effects/s per size; up to ``--per-op-max`` effects it also times the
plain per-op finders (``tests/fixtures/per_op.py``) on the same trial, checks
both give the same verdict, and prints the ratio.

    .venv/bin/python benchmarks/oracle_speed.py [--sizes 100000,1000000] [--per-op-max 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from cutbench.api import judge  # noqa: E402
from tests.fixtures import per_op  # noqa: E402
from cutbench.workloads.common import ReplayReference  # noqa: E402

SEED = 7


class Model:
    """A stand-in workload model: the payload of op i is a hash of (seed, i)."""

    def __init__(self) -> None:
        self.op = 0

    def step(self, op: int) -> str:
        self.op = op
        return hashlib.blake2b(f"{SEED}:{op}".encode(), digest_size=16).hexdigest()

    def checksum(self) -> str:
        return hashlib.blake2b(f"state:{SEED}:{self.op}".encode(), digest_size=16).hexdigest()


def synthetic_trial(n: int, reference: ReplayReference, seed: int = SEED) -> tuple[dict[str, Any], pd.DataFrame]:
    """A completed one-restore trial record and ``n`` effect rows (see the module docstring for the mix)."""
    rng = np.random.default_rng(seed)
    n_dup, n_supp = n // 100, n // 200
    ops = n - n_dup - n_supp  # ops the workload committed
    lost = rng.choice(np.arange(1, ops + 1), size=ops // 1000, replace=False)
    once = np.setdiff1d(np.arange(1, ops + 1), lost)
    again = np.sort(rng.choice(once, size=n_dup, replace=False))
    suppressed = np.sort(rng.choice(once, size=n_supp + len(lost), replace=False))  # keeps the row count at n
    op_id = np.concatenate([once, again, suppressed])
    first = len(once)
    epoch = np.r_[np.zeros(first, dtype=np.int64), np.ones(len(op_id) - first, dtype=np.int64)]
    attempt = epoch + 1
    decision = np.array(["applied"] * (first + len(again)) + ["suppressed"] * len(suppressed), dtype=object)
    payloads = np.array([reference.payload(i) for i in range(ops + 1)], dtype=object)
    digest = payloads[op_id]
    stale = rng.choice(first, size=10, replace=False)
    digest[stale] = payloads[op_id[stale] - 1]  # mixed_epoch: the previous op's payload
    effects = pd.DataFrame({"arrival_seq": np.arange(len(op_id), dtype=np.int64), "op_id": op_id, "attempt": attempt,
                            "epoch": epoch, "digest": pd.array(digest, dtype="str"), "decision": pd.array(decision, dtype="str")})
    report = {"host_op": ops, "checksum": reference.checksum(ops), "pointers_initial": {"state": 0x7F00},
              "pointers_final": {"state": 0x7F00}}
    record = {"status": "completed", "error": "", "report": report, "marker_op": ops, "restores": 1,
              "cut_outcomes": [{"status": "restored", "stage": "", "error": ""}], "progress_op": ops,
              "workload_domains": ["cpu", "receiver"], "covered_domains": ["cpu", "ipc"]}
    return record, effects


def best_of(repeat: int, fn: Any) -> tuple[float, Any]:
    """The shortest of ``repeat`` timed calls of ``fn`` and its (last) result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000", help="effects per synthetic trial, comma-separated")
    ap.add_argument("--per-op-max", type=int, default=100_000,
                    help="also time the per-op finders up to this many effects (they judge ~10⁴ effects/s)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per size; the best counts")
    args = ap.parse_args()
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"cutbench.api.judge pinned to CPU {cpu}; best of {args.repeat}")
    for n in sizes:
        reference = ReplayReference(Model)
        record, effects = synthetic_trial(n, reference)
        seconds, verdict = best_of(args.repeat, lambda: judge(record, effects, reference))
        counts = {k: c for k, c in verdict.counts().items() if c}
        line = f"{n:>9} effects: oracle {seconds:7.3f} s = {n / seconds / 1e6:5.2f} M effects/s"
        if n <= args.per_op_max:
            plain_s, plain = best_of(1, lambda: judge(record, effects, reference, finders=per_op.FINDERS))
            if plain != verdict:
                raise SystemExit(f"{n} effects: the per-op finders disagree with the oracle: {plain.counts()} vs {verdict.counts()}")
            line += f"   per-op {plain_s:7.2f} s = {n / plain_s / 1e3:6.1f} k effects/s   ×{plain_s / seconds:.0f}"
        print(f"{line}   ({verdict.outcome}: {counts})", flush=True)


if __name__ == "__main__":
    main()

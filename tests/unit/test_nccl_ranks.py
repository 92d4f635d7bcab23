"""``nccl_ranks`` ground truth and rank file, on NumPy (the collective itself needs GPUs)."""

from __future__ import annotations

import numpy as np

from cutbench.workloads import api
from cutbench.workloads.counter import apply_op, initial_state
from cutbench.workloads.nccl_ranks import RANK_SEED, RankFile, contribution, final_digest, fold, op_digest, sums


def run_ranks(world: int, ops: int, lag: dict[int, int] | None = None) -> tuple[list[str], str]:
    """Every rank in lockstep (an in-process all-reduce); ``lag`` holds a rank back by some ops."""
    lag = lag or {}
    states = [initial_state(np, 512, 7 + RANK_SEED * r) for r in range(world)]
    payloads = []
    for op in range(1, ops + 1):
        reduced = np.zeros(3 * world, dtype=np.uint64)
        for r, st in enumerate(states):
            mine = max(op - lag.get(r, 0), 0)
            if mine:
                apply_op(np, st, 7 + RANK_SEED * r, mine)
            reduced += contribution(np, st, r, world, mine)
        for st in states:
            fold(np, st, reduced, world)
        payloads.append(op_digest(op, [int(x) for x in reduced]))
    return payloads, final_digest([tuple(int(x) for x in sums(np, st)) for st in states])


def test_reference_matches_ranks_in_lockstep():
    ref = api.load("nccl_ranks").reference({"seed": 7, "state_size": 512, "world_size": 3})
    payloads, final = run_ranks(3, 5)
    assert payloads == [ref.payload(op) for op in range(1, 6)]
    assert final == ref.checksum(5)


def test_a_rank_at_another_epoch_changes_every_later_payload():
    ref = api.load("nccl_ranks").reference({"seed": 7, "state_size": 512, "world_size": 2})
    payloads, final = run_ranks(2, 4, lag={1: 1})
    assert all(p != ref.payload(op) for op, p in enumerate(payloads, 1))
    assert final != ref.checksum(4)


def test_rank_file_holds_full_uint64(tmp_path):
    rf = RankFile(tmp_path / "ranks.ctl", create=True)
    rf.set_rank(1, "s1", (1 << 64) - 3)
    rf.set(0, 9)
    again = RankFile(tmp_path / "ranks.ctl")
    assert again.rank(1, "s1") == (1 << 64) - 3 and again.get(0) == 9

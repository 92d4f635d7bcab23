"""Kill test: SIGKILL the receiver 20 times while 8 clients publish; no acked effect may be lost."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from cutbench.receivers.client import ReceiverClient
from cutbench.receivers.process import start_receiver
from cutbench.receivers.stores import open_store
from tests.fixtures.receiver_fixtures import Publisher

CLIENTS = 8
KILLS = 20


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkill_loses_no_acked_effect(store_url: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("CUTBENCH_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    handle = start_receiver(store_url, tmp_path / "rcv")
    try:
        ctl = ReceiverClient(handle.address)
        modes = ["at_least_once", "idempotent"]
        trials = [f"kill-{i}" for i in range(CLIENTS)]
        for i, trial in enumerate(trials):
            ctl.open_trial(trial, modes[i % 2])
        ctl.close()
        pubs = [Publisher(handle.address, trial, ack_timeout=2.0, max_backoff=0.1) for trial in trials]
        for p in pubs:
            p.start()
        t0 = time.monotonic()
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.02, 0.3))  # a random moment: mid-batch, mid-fsync, between
            handle.kill()
            handle.restart()
        time.sleep(0.3)  # let every client get through at least one ack after the last restart
        for p in pubs:
            p.stop()
        elapsed = time.monotonic() - t0
        errors = [p.error for p in pubs if p.error is not None]
        assert not errors, f"publishers failed (seed {seed}): {errors!r}"
    finally:
        handle.stop()

    # The oracle's view: the store file/database itself, with the server stopped.
    with open_store(store_url) as store:
        df = store.export()
    applied = df[df.decision == "applied"]
    stored = set(zip(applied.trial, applied.op_id))
    by_seq = df.set_index("arrival_seq")
    acked = lost = mismatched = 0
    for p in pubs:
        for op, ack in p.acked.items():
            acked += 1
            if (p.trial, op) not in stored:
                lost += 1
            # The acked delivery itself is stored under the arrival_seq the ack named.
            row = by_seq.loc[ack["arrival_seq"]] if ack["arrival_seq"] in by_seq.index else None
            if row is None or row.trial != p.trial or row.op_id != op or row.decision != ack["decision"]:
                mismatched += 1
    dupes = int(applied.duplicated(["trial", "op_id"]).sum())
    resends = sum(p.client.resends for p in pubs)
    kind = store_url.split(":")[0]
    print(f"\nkill test [{kind}] seed={seed}: {KILLS} SIGKILLs in {elapsed:.1f}s, {CLIENTS} clients; "
          f"acked={acked} stored_rows={len(df)} lost={lost} ack_mismatch={mismatched} "
          f"resends={resends} visible_duplicates(at_least_once)={dupes}")
    assert handle.starts == KILLS + 1
    assert acked > KILLS * CLIENTS, "clients made too little progress for the test to mean anything"
    assert lost == 0, f"seed {seed}: {lost} acknowledged effects are missing from the store"
    assert mismatched == 0, f"seed {seed}: {mismatched} acks do not match their stored row"
    # idempotent trials never show a duplicate, even across kills and resends
    idem = applied[applied.trial.isin(trials[1::2])]
    assert not idem.duplicated(["trial", "op_id"]).any()

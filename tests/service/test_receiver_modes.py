"""Property tests of the delivery modes under concurrent duplicate deliveries, through a live receiver.

- ``idempotent`` applies each (trial, op_id) exactly once, whatever the interleaving;
- ``fenced`` never commits past the fence in force, and never commits an op twice.
Both are checked on the store's own export, as the oracle would read it.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutbench.receivers.client import ReceiverClient
from cutbench.receivers.process import start_receiver
from cutbench.receivers.stores import open_store
from tests.conftest import FULL_SUITE

# 25 examples by default, the full 100 with CUTBENCH_FULL_SUITE=1 (docs/development.md).
SETTINGS = settings(max_examples=100 if FULL_SUITE else 25, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    d = tmp_path_factory.mktemp("modes")
    handle = start_receiver(f"sqlite:{d / 'r.db'}", d)
    yield handle
    handle.stop()


def _run_threads(targets) -> None:
    errors: list[BaseException] = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    assert not errors, errors


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_idempotent_applies_each_op_once(live) -> None:
    @SETTINGS
    @given(st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=20), min_size=2, max_size=5))
    def check(schedules: list[list[int]]) -> None:
        trial = "idem-" + uuid.uuid4().hex[:8]
        with ReceiverClient(live.address) as c:
            c.open_trial(trial, "idempotent")
        acks: list[dict] = []

        def client(ops: list[int]):
            def run():
                with ReceiverClient(live.address) as c:
                    for op in ops:
                        acks.append(c.publish(trial, op, 0, f"d{op}"))
            return run

        _run_threads([client(ops) for ops in schedules])
        with open_store(live.store_url) as store:
            df = store.export(trial)
        sent = sorted(op for ops in schedules for op in ops)
        assert sorted(df.op_id) == sent  # every delivery recorded, once
        applied = df[df.decision == "applied"]
        assert sorted(applied.op_id) == sorted(set(sent))  # each op applied exactly once
        assert set(df.decision) <= {"applied", "suppressed"}
        assert sum(a["decision"] == "applied" for a in acks) == len(set(sent))
        # and the first arrival is the one applied
        first = df.sort_values("arrival_seq").drop_duplicates("op_id")
        assert (first.decision == "applied").all()

    check()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fenced_never_commits_past_the_fence(live) -> None:
    seen = {"committed": 0, "rejected": 0, "aborted": 0}

    @SETTINGS
    @given(
        prepares=st.lists(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 3)), min_size=1, max_size=15),
                          min_size=2, max_size=4),
        fences=st.lists(st.integers(0, 12), min_size=1, max_size=6).map(sorted),
        commits=st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=15), min_size=1, max_size=3),
        abort_from=st.one_of(st.none(), st.integers(0, 3)),
    )
    def check(prepares, fences, commits, abort_from) -> None:
        trial = "fen-" + uuid.uuid4().hex[:8]
        with ReceiverClient(live.address) as c:
            c.open_trial(trial, "fenced")
        commit_acks: list[dict] = []

        def preparer(items):
            def run():
                with ReceiverClient(live.address) as c:
                    for op, epoch in items:
                        c.prepare(trial, op, epoch, f"d{op}@{epoch}")
            return run

        def coordinator():
            with ReceiverClient(live.address) as c:
                for i, f in enumerate(fences):
                    c.fence(trial, f)
                    if abort_from is not None and i == len(fences) // 2:
                        c.abort(trial, from_epoch=abort_from)

        def committer(ops):
            def run():
                with ReceiverClient(live.address) as c:
                    for op in ops:
                        commit_acks.append(c.commit(trial, op))
            return run

        _run_threads([*map(preparer, prepares), coordinator, *map(committer, commits)])
        with open_store(live.store_url) as store:
            df = store.export(trial)
            fence_log = store.fences(trial)
        committed = df[df.decision == "committed"]
        assert not committed.op_id.duplicated().any(), "an op was committed twice"
        for row in committed.itertuples():
            in_force = fence_log[fence_log.arrival_seq < row.decided_seq].fence
            assert len(in_force) and row.op_id <= in_force.max(), (
                f"op {row.op_id} committed at seq {row.decided_seq} past fence "
                f"{in_force.max() if len(in_force) else None}")
        assert committed.op_id.max() <= max(fences) if len(committed) else True
        # acks agree with the store: a fresh commit names the row it committed
        fresh = [a for a in commit_acks if a["decision"] == "committed" and not a["already"]]
        assert sorted(a["committed_seq"] for a in fresh) == sorted(committed.arrival_seq)
        for a in commit_acks:
            if a["decision"] == "rejected":
                assert "fence" in a["reason"] or "prepared" in a["reason"]
        for k in seen:
            seen[k] += int((df.decision == k).sum())

    check()
    print(f"\nfenced property: rows over all examples {seen}")
    assert all(seen.values()), "the examples never exercised commit, rejection and abort"

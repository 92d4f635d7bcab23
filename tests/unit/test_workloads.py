"""The workload suite without CRIU, in this process: references, parameter checks, the ring protocol's
recovery, the pointer traversal, and the scenario plumbing (``[[variants]]``, GPU-only skips).

Every workload's uninterrupted run and its ``app`` hooks (a real receiver) are in tests/service/test_workloads.py.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.harness.runner.run import variant_specs
from cutbench.harness.runner.checks import check_backends
from cutbench.harness.model.scenario import load_scenario, parse_scenario
from cutbench.workloads import api
from cutbench.workloads.common import ExternalCursor, ReplayReference
from cutbench.workloads.control import ControlFile
from cutbench.workloads.ranks import RanksModel, allreduce, contribution, apply_sum, replica_digest
from cutbench.workloads.ring import Ring
from cutbench.workloads.runtime import Runtime, WorkloadConfig
from cutbench.workloads.stream_callbacks import HostStream

REPO = Path(__file__).resolve().parents[2]
SUITE = ["request_service", "training", "allocator_churn", "stream_callbacks", "ranks"]


def test_references_are_deterministic_and_seeded():
    """Two references of one parameter set agree op for op; another seed differs from op 1 on."""
    for name in SUITE:
        cls = api.load(name)
        p = api.resolve_params(cls, {"seed": 11})
        a, b = cls.reference(p), cls.reference(p)
        assert [a.payload(i) for i in range(1, 6)] == [b.payload(i) for i in range(5, 0, -1)][::-1]
        assert a.checksum(0) == b.checksum(0) and a.checksum(5) == b.checksum(5)
        c = cls.reference({**p, "seed": 12})
        assert all(a.payload(i) != c.payload(i) for i in range(1, 6)), name
        assert len({a.payload(i) for i in range(1, 6)}) == 5, f"{name}: payloads repeat"


@pytest.mark.parametrize(("name", "params", "field"), [
    ("request_service", {"queue": "kafka"}, "queue"),
    ("request_service", {"rows": 0}, "rows"),
    ("training", {"cursor": "disk"}, "cursor"),
    ("training", {"grad_shift": 64}, "grad_shift"),
    ("allocator_churn", {"min_elems": 64, "max_elems": 32}, "max_elems"),
    ("allocator_churn", {"table": "gpu"}, "table"),
    ("stream_callbacks", {"state_size": 0}, "state_size"),
    ("ranks", {"ranks": 5}, "ranks"),
    ("ranks", {"ranks": 2, "cut": "rank", "cut_rank": 2}, "cut_rank"),
    ("ranks", {"cut": "half"}, "cut"),
    ("ranks", {"ops": "8"}, "ops"),
])
def test_bad_parameters_name_the_field(name, params, field):
    with pytest.raises(api.WorkloadError, match=field):
        api.resolve_params(api.load(name), params)


def test_declared_domains_follow_the_parameters():
    assert api.declared_domains(api.load("request_service"), {"queue": "external"}) == {"cpu", "receiver", "disk"}
    assert api.declared_domains(api.load("request_service"), {"queue": "memory"}) == {"cpu", "receiver"}
    assert "shared_file" in api.declared_domains(api.load("allocator_churn"), {"table": "shared"})
    assert "peer" in api.declared_domains(api.load("ranks"), {"cut": "rank"})
    assert "peer" not in api.declared_domains(api.load("ranks"), {"cut": "tree"})


def _cupy_usable() -> bool:
    try:
        from cutbench.workloads.xp import get_xp

        get_xp("cupy")
        return True
    except ValueError:
        return False


class _GpuOnly:
    name = "gpu_only"
    arrays = ("cupy",)


def test_gpu_only_workload_is_skipped_with_a_reason_without_a_gpu():
    reason = api.unavailable_reason(_GpuOnly, "auto")
    if _cupy_usable():
        assert reason is None
        return
    assert reason and "needs a GPU" in reason
    assert "runs on cupy" in api.unavailable_reason(_GpuOnly, "numpy")
    assert api.unavailable_reason(api.load("ranks"), "numpy") is None
    # In a scenario: skipped arms carry the reason, or the run is refused when skipping is off.
    data = {"workload": {"name": "persistent_kernel", "array": "cupy"}, "pipeline": {"skip_unavailable": True}}
    arms, skipped = check_backends(parse_scenario(data))
    assert not arms and skipped and all("needs a GPU" in s["reason"] for s in skipped)
    data["pipeline"]["skip_unavailable"] = False
    with pytest.raises(Unavailable, match="persistent_kernel"):
        check_backends(parse_scenario(data))


# -- scenario variants ------------------------------------------------------------


def test_all_workloads_scenario_has_a_control_arm_for_every_variant():
    scen = load_scenario(REPO / "scenarios" / "all-workloads.toml")
    names = [v.variant for v in scen.variants]
    assert len(names) == len(set(names))
    assert {v.workload for v in scen.variants} >= set(SUITE) | {"counter", "persistent_kernel"}
    for v in scen.variants:
        labels = [a.label() for a in v.arms()]
        assert "criu/idempotent/none" in labels, v.variant
        assert any("leave_running" in label for label in labels) and any(label.endswith("/kill") for label in labels)


def test_variants_inherit_the_base_and_overrides_win():
    base = {
        "name": "v",
        "pipeline": {"faults": ["kill"]},
        "plan": {"ops": [2, 2]},
        "variants": [
            {"name": "a", "workload": {"name": "training", "params": {"ops": 4}}, "pipeline": {"faults": ["none"]}},
            {"name": "b", "workload": {"name": "ranks", "params": {"ranks": 2}}, "plan": {"ops": [3, 3]}},
        ],
    }
    scen = parse_scenario(base, overrides=["plan.source=random", "plan.trials=2"])
    a, b = scen.variants
    assert (a.variant, a.workload, a.faults, a.plan_ops) == ("a", "training", ("none",), (2, 2))
    assert (b.variant, b.workload, b.faults, b.plan_ops, b.params["ranks"]) == ("b", "ranks", ("kill",), (3, 3), 2)
    assert a.plan_source == b.plan_source == "random" and a.trials == 2
    specs, skipped = variant_specs([(v.variant, v) for v in scen.variants])
    assert not skipped and [s.variant for s in specs] == ["a", "a", "b", "b"]
    assert [s.trial_id for s in specs] == ["t0001", "t0002", "t0003", "t0004"]
    assert {s.workload for s in specs} == {"training", "ranks"}


@pytest.mark.parametrize(("variants", "message"), [
    ([{"workload": {"name": "training"}}], "name"),
    ([{"name": "x"}, {"name": "x"}], "used by an earlier variant"),
    ([{"name": "x", "receiver": {"store": "sqlite"}}], "one receiver store"),
    ([{"name": "x", "include": "other.toml"}], "unknown field"),
    ([{"name": "x", "workload": {"name": "ranks", "params": {"ranks": 9}}}], r"variants\[0\] \(x\).*ranks"),
    ([{"name": "x", "plan": {"source": "hypothesis"}}], "hypothesis"),
    ("not-a-list", "variants"),
])
def test_bad_variants_are_refused_naming_the_variant(variants, message):
    with pytest.raises(InvalidArgument, match=message):
        parse_scenario({"name": "v", "variants": variants})


# -- the ``app`` baseline's hooks ------------------------------------------------


# -- pieces --------------------------------------------------------------------


def test_external_cursor_survives_the_process_and_seeks():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        a = ExternalCursor(Path(d) / "c")
        assert [a.take(), a.take(), a.take()] == [1, 2, 3]
        b = ExternalCursor(Path(d) / "c")  # another process's view: the position is in the file
        assert b.position() == 3 and b.take() == 4
        b.seek(1)
        assert a.take() == 2


def test_replay_reference_only_advances():
    calls = []

    class Model:
        def step(self, op: int) -> str:
            calls.append(op)
            return f"p{op}"

        def checksum(self) -> str:
            return f"c{len(calls)}"

    ref = ReplayReference(Model)
    assert ref.payload(3) == "p3" and ref.checksum(2) == "c2" and ref.checksum(0) == "c0"
    assert calls == [1, 2, 3]
    with pytest.raises(ValueError):
        ref.payload(-1)


def test_host_stream_runs_in_order_and_synchronize_waits():
    stream = HostStream()
    seen: list[int] = []
    gate = threading.Event()
    stream.launch(gate.wait, 5)
    for i in range(5):
        stream.launch_host_func(seen.append, i)
    assert seen == []  # held behind the first item, as work queued on a stream is
    gate.set()
    stream.synchronize()
    assert seen == [0, 1, 2, 3, 4]
    assert stream._thread.name == "host-stream"
    stream.close()
    assert not stream._thread.is_alive()


def test_pointer_traversal_reports_bad_entries_without_dereferencing_them(tmp_path):
    """Entries that lead to another buffer or to no buffer at all fail the tag check; nothing crashes."""
    cls = api.load("allocator_churn")
    p = api.resolve_params(cls, {"slots": 4})
    control = ControlFile.create(tmp_path / "control")
    cfg = WorkloadConfig("allocator_churn", "t", p, str(tmp_path / "control"), str(tmp_path / "report.json"),
                         str(tmp_path / "marker"), str(tmp_path / "log"))
    w = cls(Runtime(config=cfg, control=control, xp=np, phases=tuple(cls.phases)), p)
    w.setup()
    assert w.traverse()[0::2] == [1, 1, 1, 1]
    assert w.traverse() == w.model.direct()
    w.table[1] = w.table[2]  # a stale entry that now leads to another live buffer
    w.table[3] = 8  # an address inside no buffer
    assert w.traverse()[0::2] == [1, 0, 1, 0]


# -- the ring protocol -----------------------------------------------------------


def _ring(n: int, idle_s: float = 20.0) -> list[Ring]:
    listeners = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        listeners.append(s)
    ports = [s.getsockname()[1] for s in listeners]
    return [Ring(r, n, listeners[r], ports, log=lambda m: None, idle_s=idle_s) for r in range(n)]


def _run_ranks(rings: list[Ring], ops: int, seed: int, hook: Any = None) -> list[Any]:
    """Every ring in its own thread runs ``ops`` all-reduce ops; return each rank's final replica (or its error).

    ``hook(ring, op, x)`` runs before each op; it may return ``(op, x)`` to rewind the rank.
    """
    size = 64
    results: list[Any] = [None] * len(rings)

    def body(ring: Ring) -> None:
        try:
            x = RanksModel(np, seed, size, ring.n).x
            op = 1
            while op <= ops:
                rewind = hook(ring, op, x) if hook else None
                if rewind:
                    op, x = rewind
                apply_sum(np, x, allreduce(np, ring, op, contribution(np, x, seed, ring.rank, op)))
                op += 1
            results[ring.rank] = x
        except BaseException as exc:
            results[ring.rank] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in rings]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_ring_allreduce_matches_the_model():
    ref = RanksModel(np, 3, 64, 3)
    for op in range(1, 6):
        ref.step(op)
    results = _run_ranks(_ring(3), 5, 3)
    assert all(replica_digest(np, x) == ref.checksum() for x in results), results


def test_ring_recovers_from_broken_links_by_resending():
    """Every link dropped at once at op 3 (what a restore with --tcp-close does to a coordinated image),
    and one link dropped again at op 5: reconnect, handshake, resend; the result is exact."""
    ref = RanksModel(np, 4, 64, 3)
    for op in range(1, 9):
        ref.step(op)
    rings = _ring(3)

    def hook(ring: Ring, op: int, x: Any) -> None:
        if op == 3 or (op == 5 and ring.rank == 1):
            ring._drop_right()
            ring._drop_left()

    results = _run_ranks(rings, 8, 4, hook)
    assert all(not isinstance(x, BaseException) for x in results), results
    assert all(replica_digest(np, x) == ref.checksum() for x in results)


def test_rank_rolled_back_past_the_resend_log_hangs():
    """Rank 1 goes back to its state after op 2 while rank 0 runs on (an uncoordinated restore): it asks for
    messages its neighbour no longer holds, the neighbour says it cannot serve, and the ring stops (the
    workload's deadlock)."""
    rings = _ring(2, idle_s=2.0)
    saved: dict[str, Any] = {}

    def hook(ring: Ring, op: int, x: Any) -> Any:
        if ring.rank != 1:
            return None
        if op == 3 and not saved:  # the image: ring and replica state after op 2
            saved.update(x=x.copy(), consumed=ring.consumed, sent=list(ring.sent))
        if op == 6 and "done" not in saved:  # crash and restore from that image
            saved["done"] = True
            ring.consumed, ring.sent, ring.inbox = saved["consumed"], list(saved["sent"]), {}
            ring._drop_left()
            ring._drop_right()
            return 3, saved["x"].copy()
        return None

    results = _run_ranks(rings, 8, 5, hook)
    assert all(isinstance(x, TimeoutError) for x in results), results
    assert rings[0].unserved >= 1


def test_the_commit_marker_is_rewritten_in_place_with_no_other_path_ever_open(tmp_path):
    """A process dumped inside the marker write holds only ``marker`` open, a path that still exists when a
    ``leave_running`` copy is restored (a temporary file renamed away made CRIU's restore fail)."""
    from cutbench.workloads.runtime import read_marker, write_marker

    marker = tmp_path / "marker"
    write_marker(marker, 7)
    inode = marker.stat().st_ino
    for op in (8, 123456, 9):
        write_marker(marker, op)
        assert read_marker(marker) == op and marker.stat().st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marker"]


def test_an_external_cursor_is_rewritten_in_place_too(tmp_path):
    """The same holds for an input cursor kept in a file (taken every op by ``training``, ``request_service``)."""
    from cutbench.workloads.common import ExternalCursor

    cursor = ExternalCursor(tmp_path / "cursor")
    inode = cursor.path.stat().st_ino
    assert [cursor.take() for _ in range(3)] == [1, 2, 3]
    cursor.seek(1)
    assert cursor.position() == 1 and cursor.path.stat().st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cursor"]
    assert ExternalCursor(tmp_path / "cursor").position() == 1  # a new process keeps what was taken

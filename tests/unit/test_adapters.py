"""Semantic adapters: the certificate's use of what they say (pure) and the control-file channel between
the coordinator and a workload's adapters (a real control file, the workload's desk answering from a thread,
as its cut points and park loop do); no CRIU, no GPU."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cutbench.errors import StageRefused
from cutbench.harness.model.certificate import Evidence, Position, certify, in_flight_candidates
from cutbench.harness.model.plan import Cut
from cutbench.harness.model.timeline import Timeline
from cutbench.harness.nemesis import adapters as channel
from cutbench.harness.nemesis.base import CutContext
from cutbench.workloads.adapters import AdapterDesk, ConsumerOffset, Ready, RequestLog
from cutbench.workloads.adapter_faults import SlowRequestLog
from cutbench.workloads.common import ExternalCursor
from cutbench.workloads.control import PHASES, REPLY_OFFSET, ControlFile


def evidence(**kw: Any) -> Evidence:
    base = dict(checkpoint=0, phases=PHASES, workload_domains=("cpu", "receiver", "request_log"), covers=("cpu",),
                receiver_mode="at_least_once", positions={"criu_freeze": Position(3, "publish")}, sent_through=3,
                acked_through=2, restore_decided=True)
    base.update(kw)
    return Evidence(**base)


# -- the rule ---------------------------------------------------------------------------


def test_a_domain_its_adapter_joined_is_covered_at_the_state_it_named():
    assert certify(evidence()).unknown == ("request_log",)
    cert = certify(evidence(adapters={"request_log": "committed_through(2)"}))
    assert cert.eligible and cert.unknown == ()
    assert cert.domains["request_log"] == "committed_through(2)@3/publish"


def test_effects_the_restored_process_will_not_send_again_are_handled_in_any_mode():
    joined = {"request_log": "committed_through(2)"}
    ev = evidence(adapters=joined, visible=(1, 2, 3, 4, 5))
    assert in_flight_candidates(ev) == [4, 5]
    assert not certify(ev).eligible  # no classification: escaped
    cert = certify(evidence(adapters=joined, visible=(1, 2, 3, 4, 5), classified={4: "committed", 5: "discard"}))
    assert cert.eligible and cert.in_flight == {4: "commit", 5: "discard"}


def test_a_replayed_effect_is_a_second_delivery_unless_the_receiver_dedups():
    ev = dict(adapters={"request_log": "committed_through(2)"}, visible=(1, 2, 3, 4, 5),
              classified={4: "committed", 5: "replay"})
    alo = certify(evidence(**ev))
    assert not alo.eligible and alo.in_flight == {4: "commit", 5: "escaped"} and "ops 5 " in alo.reason
    idem = certify(evidence(receiver_mode="idempotent", **ev))
    assert idem.eligible and idem.in_flight == {4: "commit", 5: "replay"}


def test_a_reconnecting_restore_asks_about_what_was_sent_unacknowledged():
    ev = evidence(visible=(1, 2, 3), reconnects=True, sent_through=3, acked_through=2)
    assert in_flight_candidates(ev) == [3]
    assert in_flight_candidates(evidence(visible=(1, 2, 3), reconnects=False)) == []


# -- the channel ----------------------------------------------------------------------------


@pytest.fixture
def control(tmp_path: Path) -> ControlFile:
    return ControlFile.create(tmp_path / "control")


class Workload:
    """A workload's side: the desk answering at its cut points (every 1 ms here) on a thread."""

    def __init__(self, control: ControlFile, *adapters: Any):
        self.desk = AdapterDesk(control)
        for a in adapters:
            self.desk.register(a)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            self.desk.answer()
            time.sleep(0.001)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def context(control: ControlFile, tmp_path: Path, **cut: Any) -> CutContext:
    return CutContext(images_dir=tmp_path / "img", timeline=Timeline("t0000"), cut_index=0,
                      cut=Cut(op=3, phase="publish", **cut), control=control)


def test_prepare_gathers_every_domains_state_and_restored_seeks_the_offset_back(control, tmp_path):
    cursor = ExternalCursor(tmp_path / "queue.offset")
    log = RequestLog(tmp_path / "request_log")
    for _ in range(3):
        cursor.take()
    log.delivered(2)
    wl = Workload(control, log, ConsumerOffset(cursor))
    try:
        ctx = context(control, tmp_path)
        joined = channel.prepare(ctx, 2.0)
        assert joined.states == joined.said == {"request_log": "committed_through(2)", "disk": "offset(3)"}
        assert ctx.adapters_open
        channel.commit(ctx, 2.0)
        assert not ctx.adapters_open
        cursor.take(), cursor.take()  # the crashed incarnation took two more
        log.delivered(4)
        back = channel.restored(ctx, 2.0, [3, 4, 5])
        assert back.failed == "" and back.classes == {3: "committed", 4: "committed", 5: "replay"}
        assert cursor.position() == 3
    finally:
        wl.close()
    stages = [s["stage"] for s in ctx.timeline.rows()]
    assert stages == ["prepare", "commit", "restored", "classify"]


@pytest.mark.parametrize("fault, words", [("garbage", "prepare returned 42"),
                                          ("raise", "RuntimeError: request log unavailable at epoch 1")])
def test_an_adapter_that_answers_garbage_or_raises_refuses_the_cut_in_its_own_words(control, tmp_path, fault, words):
    wl = Workload(control, SlowRequestLog(tmp_path / "log", 0.0, fault))
    try:
        with pytest.raises(StageRefused) as refused:
            channel.prepare(context(control, tmp_path), 2.0)
    finally:
        wl.close()
    assert refused.value.stage == "prepare" and "request_log" in refused.value.reason and words in refused.value.reason


def test_an_adapter_that_misses_the_deadline_is_aborted_within_a_bound(control, tmp_path):
    log = SlowRequestLog(tmp_path / "log", 1.5, "none")
    wl = Workload(control, log)
    try:
        ctx = context(control, tmp_path)
        with pytest.raises(StageRefused, match=r"no answer to prepare within 0\.3s"):
            channel.prepare(ctx, 0.3)
        # The abort was posted: the desk answers it once the late prepare returns, in order.
        deadline = time.monotonic() + 10
        while control.get("adapted_seq") < control.get("adapt_seq") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert control.get("adapted_seq") == control.get("adapt_seq") == 2
        assert '"verb": "abort"' in control.get_text(area=REPLY_OFFSET)
    finally:
        wl.close()
    assert [s["stage"] for s in ctx.timeline.rows()] == ["prepare", "abort"]


def test_a_workload_that_never_answers_and_a_corrupt_reply_are_refusals(control, tmp_path):
    control.set("adapters", 1)  # registered, but nobody answers
    ctx = context(control, tmp_path)
    with pytest.raises(StageRefused, match="no answer to prepare within 0.05s"):
        channel.prepare(ctx, 0.05)

    class Corrupt(threading.Thread):
        def run(self) -> None:
            while control.get("adapted_seq") < control.get("adapt_seq") or control.get("adapt_seq") < 3:
                seq = control.get("adapt_seq")
                if seq > control.get("adapted_seq"):
                    control.set_text("{not json", area=REPLY_OFFSET)
                    control.set("adapted_seq", seq)
                time.sleep(0.001)

    t = Corrupt(daemon=True)
    t.start()
    with pytest.raises(StageRefused, match="not JSON"):
        channel.prepare(ctx, 2.0)
    t.join(5)


def test_the_desk_refuses_a_second_adapter_per_domain_and_names_undeclared_domains(control, tmp_path):
    desk = AdapterDesk(control)
    desk.register(RequestLog(tmp_path / "a"))
    with pytest.raises(ValueError, match="second adapter for domain 'request_log'"):
        desk.register(RequestLog(tmp_path / "b"))
    with pytest.raises(ValueError, match="undeclared domain.s. request_log: the workload declares cpu, receiver"):
        desk.check_domains({"cpu", "receiver"})
    with pytest.raises(ValueError, match="lacks prepare"):
        desk.register(type("Half", (), {"domain": "disk"})())
    assert isinstance(RequestLog(tmp_path / "c").prepare(1, 0.0), Ready)


class Holding(RequestLog):
    """A request log that says it holds its domain at the cut by itself."""

    domain = "device_work"
    holds = True


def test_only_an_adapter_that_holds_its_domain_joins_a_cut_the_process_runs_through(control, tmp_path):
    wl = Workload(control, RequestLog(tmp_path / "log"), Holding(tmp_path / "held"))
    try:
        parked = channel.prepare(context(control, tmp_path), 2.0)
        split = channel.prepare(context(control, tmp_path, split_window_ms=20.0), 2.0)
        skewed = channel.prepare(context(control, tmp_path, mode="async"), 2.0)
    finally:
        wl.close()
    assert set(parked.states) == {"request_log", "device_work"}
    assert set(split.states) == set(skewed.states) == {"device_work"} and set(split.said) == {"request_log", "device_work"}


class FailsToRestore(ConsumerOffset):
    def restored(self, epoch: int) -> None:
        raise OSError("the broker is gone")


def test_a_failed_restored_takes_the_domains_out_of_the_cut_and_asks_no_classification(control, tmp_path):
    cursor = ExternalCursor(tmp_path / "queue.offset")
    wl = Workload(control, FailsToRestore(cursor))
    try:
        ctx = context(control, tmp_path)
        channel.prepare(ctx, 2.0)
        back = channel.restored(ctx, 2.0, [4])
    finally:
        wl.close()
    assert "disk: restored raised OSError: the broker is gone" in back.failed
    assert isinstance(back.classes, str) and back.classes.startswith("restored failed")
    assert "classify" not in [s["stage"] for s in ctx.timeline.rows()]


def test_a_restore_decision_waits_for_the_classification_only_when_the_restored_process_is_parked():
    from cutbench.harness.nemesis.adapters import Joined, Restored
    from cutbench.harness.runner.coordinator import TrialCoordinator

    class Control:
        def get(self, name: str) -> int:
            return {"sent_effect": 3, "acked_effect": 2, "progress_op": 3, "progress_phase": 4, "progress_count": 20}.get(name, 0)

    class Receiver:
        def export(self, trial: str) -> Any:
            import pandas as pd

            return pd.DataFrame({"op_id": [1, 2, 3, 4], "decision": ["applied"] * 4, "epoch": [0] * 4})

    def certifier(parked: bool) -> Any:
        co = TrialCoordinator(Receiver(), "t", "at_least_once", "enforce", Control(), PHASES,
                              ("cpu", "receiver", "request_log"), ("cpu",))
        c = co.for_cut(0, Cut(op=3, phase="publish", fault="kill"))
        c.joined(Joined(states={"request_log": "committed_through(2)"}, said={"request_log": "committed_through(2)"}),
                 parked=parked)
        c.captured("criu_freeze")
        return c

    waits = certifier(parked=True)
    assert waits.before_restore() is None and waits.in_flight() == [4]
    assert waits.after_restore(Restored(classes={4: "committed"})) is None
    assert waits.certificate is not None and waits.certificate.eligible
    declined = certifier(parked=True)
    declined.before_restore()
    assert "ops 4 " in (declined.after_restore(Restored(classes={4: "replay"})) or "")
    gone = certifier(parked=True)
    gone.before_restore()
    refusal = gone.after_restore(Restored(failed="request_log: no answer", classes="restored failed"))
    assert refusal is not None and "no checkpoint holds request_log" in refusal and gone.evidence.adapters == {}
    running = certifier(parked=False)
    assert (running.before_restore() or "").startswith("certificate: receiver: effects of ops 4")
    assert running.in_flight() == []


def test_the_ranks_pause_is_ready_only_with_every_rank_at_rank_0s_collective(control):
    from types import SimpleNamespace

    from cutbench.workloads.ranks import RankSet

    rank0 = SimpleNamespace(rt=SimpleNamespace(control=control), p={"ranks": 3}, collectives=3)
    pause = RankSet(rank0)  # type: ignore[arg-type]
    control.set("rank_op_1", 3)
    control.set("rank_op_2", 3)
    assert pause.prepare(1, time.time() + 1) == Ready("ranks {0,1,2} at op 3")
    control.set("rank_op_2", 5)  # where a crashed incarnation's rank got to, before a rollback
    assert pause.prepare(1, time.time() + 0.01) == "rank 2 at op 5, not at op 3's boundary"
    control.set("rank_op_2", 2)
    assert pause.prepare(1, time.time() + 0.01) == "rank 2 at op 2, not at op 3's boundary"

"""The workload suite through a harness session (a real receiver process): every workload's uninterrupted run
against its reference, and ``save_state``/``load_state`` in a fresh process publishing to that receiver.

Uninterrupted runs go through the real runner (a trial with an empty plan):
real workload processes, a real receiver, the real oracle.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import numpy as np
import pytest

from cutbench.harness.checker import oracle
from cutbench.workloads import api
from cutbench.workloads.control import ControlFile
from cutbench.workloads.runtime import Runtime, WorkloadConfig
from tests.fixtures.workload_cases import CASES, case_id, clean_spec


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_uninterrupted_run_matches_its_reference(session, case):
    """A run with no cut is valid: every effect carries the reference payload, the final checksum is the
    reference's, the self-check holds; judged against another seed's reference, the same run is invalid."""
    name, params = case
    result = session.run_trial(clean_spec(name, params, CASES.index(case)))
    record, report = result.record, result.record.report
    assert record.status == "completed", (record.error, record.log_tail)
    assert result.verdict.outcome == "valid", result.verdict.findings
    spec = result.spec
    ref = api.load(name).reference(spec.params)
    ops = spec.params["ops"]
    effects = result.effects.sort_values("op_id")
    assert list(effects["op_id"]) == list(range(1, ops + 1))
    assert list(effects["digest"]) == [ref.payload(op) for op in range(1, ops + 1)]
    assert report["host_op"] == ops and report["checksum"] == ref.checksum(ops)
    assert report["self_check"]["ok"], report
    assert len(set((report.get("domain_ops") or {"": 0}).values())) == 1
    # The reference is sensitive: another seed's ground truth rejects this run.
    other = api.load(name).reference({**spec.params, "seed": spec.params["seed"] + 1})
    verdict = oracle.judge(record, result.effects, other)
    assert verdict.outcome == "invalid" and {f.kind for f in verdict.findings} == {"mixed_epoch"}


def _round_trip(address: str, trial: str, tmp: str, name: str, params: dict[str, Any], split: int, out: Any) -> None:
    """In a fresh process: run ``split`` ops, save, then a second instance loads and runs to the end."""
    from cutbench.receivers.client import ReceiverClient

    try:
        cls = api.load(name)
        p = api.resolve_params(cls, params)

        def runtime(tag: str) -> Runtime:
            control = ControlFile.create(f"{tmp}/control-{tag}")
            cfg = WorkloadConfig(name, trial, p, control.path.as_posix(), f"{tmp}/report.json", f"{tmp}/marker",
                                 f"{tmp}/log", receiver=address, array_backend="numpy")
            rt = Runtime(config=cfg, control=control, xp=np, phases=tuple(cls.phases))
            rt.receiver = ReceiverClient(address)
            return rt

        first = cls(runtime("a"), p)
        first.setup()
        for op in range(1, split + 1):
            first.run_op(op)
        first.save_state(f"{tmp}/state")
        if callable(getattr(first, "finish", None)):
            first.finish()
        second = cls(runtime("b"), p)
        second.setup()
        resume = second.load_state(f"{tmp}/state")
        for op in range(resume + 1, p["ops"] + 1):
            second.run_op(op)
        if callable(getattr(second, "finish", None)):
            second.finish()
        out.put(("ok", resume, second.report()))
    except BaseException as exc:  # report to the test, whatever happened
        out.put(("error", repr(exc), None))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_save_and_load_resume_exactly(session, tmp_path, case):
    """``save_state`` after op 3 and ``load_state`` in a new instance: it resumes after op 3 and ends at the
    reference's final state, with every domain at the same op."""
    name, params = case
    trial = f"{session.run_id}/app-{CASES.index(case)}"
    session.control_client.open_trial(trial, "idempotent")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_round_trip, args=(session.receiver.address, trial, str(tmp_path), name, params, 3, out))
    proc.start()
    status, resume, report = out.get(timeout=120)
    proc.join(timeout=30)
    assert status == "ok", resume
    p = api.resolve_params(api.load(name), params)
    assert resume == 3
    assert report["host_op"] == p["ops"]
    assert report["checksum"] == api.load(name).reference(p).checksum(p["ops"])
    assert report["self_check"]["ok"], report



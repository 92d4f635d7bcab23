"""The workload suite without CRIU: every workload against its reference, the
``app`` hooks, parameter checks, the ring protocol's recovery, the pointer
traversal, and the scenario plumbing (``[[variants]]``, GPU-only skips).

Uninterrupted runs go through the real runner (a trial with an empty plan):
real workload processes, a real receiver, the real oracle.
"""

from __future__ import annotations


import pytest

from tests.fixtures.workload_cases import CASES, case_id, clean_spec


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_cupy_run_matches_the_numpy_reference(session, case):
    """On a GPU the same workload on CuPy reproduces the NumPy reference bit for bit."""
    name, params = case
    result = session.run_trial(clean_spec(name, params, 100 + CASES.index(case), array="cupy"))
    assert result.record.status == "completed", (result.record.error, result.record.log_tail)
    assert result.record.report["device"] == "cupy"
    assert "cuda" in result.record.workload_domains
    assert result.verdict.outcome == "valid", result.verdict.findings

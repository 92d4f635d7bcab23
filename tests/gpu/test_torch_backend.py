"""PyTorch as an array backend on the GPU: the xp helpers on CUDA tensors, and
``counter`` on ``array = "torch"`` reproducing its CuPy run and the NumPy
reference bit for bit. Skips (with the reason) where no GPU or no PyTorch is."""

from __future__ import annotations

import numpy as np
import pytest

from cutbench.workloads import api, xp
from tests.fixtures.workload_cases import clean_spec

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

# Report keys that name the run rather than the state: the process, the
# backend, buffer addresses, which each allocator picks for itself, and the start-up timings.
PER_RUN = {"pid", "device", "pointers_initial", "pointers_final", "startup"}


@pytest.fixture(scope="module")
def xt():
    """The namespace a torch workload gets as ``rt.xp``."""
    reason = xp.unusable_reason("torch")
    if reason:
        pytest.skip(reason)
    return xp.get_xp("torch")


def test_helpers_on_cuda_tensors(xt):
    cupy = xp.get_xp("cupy")
    a = xt.arange(5, dtype=xp.word_dtype(xt))
    assert a.device.type == "cuda" and xp.backend_name(xt) == "torch" and xp.is_device(xt)
    assert xp.pointer(a) == a.data_ptr() and xp.pointer(a[2:]) == a.data_ptr() + 16
    a *= xp.word(xt, 2**64 - 1)  # wraps: -a mod 2**64
    xp.synchronize(xt)
    host = xp.to_host(a)
    assert isinstance(host, np.ndarray) and host.dtype == np.int64 and host.tolist() == [0, -1, -2, -3, -4]
    assert xp.host_words(a) == [(-i) % 2**64 for i in range(5)]
    assert xp.host_words(xp.shift_right(xt, a, 60)) == [((-i) % 2**64) >> 60 for i in range(5)]
    assert xp.device_uuid(xt) == xp.device_uuid(cupy)
    xp.release_cached_memory(xt)
    with pytest.raises(xp.ArrayTypeError, match="pointer"):
        xp.pointer(object())


def test_word_arithmetic_on_torch_matches_numpy(xt):
    """uint64 arithmetic on torch's int64 words, CuPy and NumPy give the same bits (wrap-around, shifts, sums)."""
    from cutbench.workloads.common import sums
    from cutbench.workloads.counter import apply_op, initial_state

    cupy = xp.get_xp("cupy")
    states = {name: initial_state(ns, 10_000, 3) for name, ns in (("numpy", np), ("cupy", cupy), ("torch", xt))}
    for op in (1, 2, 3):
        for name, ns in (("numpy", np), ("cupy", cupy), ("torch", xt)):
            apply_op(ns, states[name], 3, op)
    words = {name: xp.host_words(s) for name, s in states.items()}
    assert words["torch"] == words["cupy"] == words["numpy"] and max(words["numpy"]) >= 2**63
    assert xp.host_words(sums(xt, states["torch"])) == xp.host_words(sums(np, states["numpy"]))


@pytest.mark.parametrize(("index", "params"), [(200, {"seed": 7}), (210, {"seed": 7, "state_size": 4099, "ballast_mib": 2})],
                         ids=["default", "ballast"])
def test_counter_on_torch_is_bit_identical_to_its_cupy_run(session, xt, index, params):
    runs = {array: session.run_trial(clean_spec("counter", params, index + i, array=array))
            for i, array in enumerate(("cupy", "torch"))}
    for array, result in runs.items():
        record = result.record
        assert record.status == "completed", (array, record.error, record.log_tail)
        assert record.report["device"] == array and "cuda" in record.workload_domains
        assert record.report["pointer_table_ok"] is True
        assert result.verdict.outcome == "valid", (array, result.verdict.findings)
    cupy_run, torch_run = runs["cupy"], runs["torch"]
    effects = {a: r.effects.sort_values("op_id")[["op_id", "digest"]].values.tolist() for a, r in runs.items()}
    assert effects["torch"] == effects["cupy"] and len(effects["torch"]) == torch_run.spec.params["ops"]
    strip = lambda report: {k: v for k, v in report.items() if k not in PER_RUN}  # noqa: E731
    assert strip(torch_run.record.report) == strip(cupy_run.record.report)
    ref = api.load("counter").reference(torch_run.spec.params)
    assert torch_run.record.report["checksum"] == ref.checksum(torch_run.spec.params["ops"])

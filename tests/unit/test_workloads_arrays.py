"""Array backends of the workload API without a GPU: a torch workload on a machine
that cannot run it is an arm skipped with the reason (not a load error), the
``xp`` helpers refuse what they do not know, and the NumPy path holds through
the array API standard's namespace (``array_api_compat.numpy``).

The torch and GPU halves run in ``tests/gpu/test_torch_backend.py``.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import array_api_compat
import array_api_compat.numpy as xnp
import numpy as np
import pytest

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.harness.model.scenario import parse_scenario
from cutbench.harness.runner.checks import check_backends
from cutbench.workloads import api, launch, xp
from cutbench.workloads.common import sums
from cutbench.workloads.control import PHASES, ControlFile
from cutbench.workloads.counter import Counter, apply_op, digest, initial_state
from cutbench.workloads.runtime import WorkloadConfig


def _usable(name: str) -> bool:
    return xp.unusable_reason(name) is None


needs_no_torch_gpu = pytest.mark.skipif(_usable("torch"), reason="PyTorch sees a CUDA device here: nothing is unavailable")
needs_no_gpu = pytest.mark.skipif(_usable("cupy") or _usable("torch"), reason="a GPU backend is usable here")


class TorchOnly:
    """A workload that runs on PyTorch alone (loaded by import path, as a user's would be)."""

    name: ClassVar[str] = "torch_only"
    domains: ClassVar[frozenset[str]] = frozenset({"cpu", "receiver"})
    phases: ClassVar[tuple[str, ...]] = PHASES
    defaults: ClassVar[dict[str, Any]] = {"ops": 2}
    arrays: ClassVar[tuple[str, ...]] = ("torch",)

    def run_op(self, op: int) -> None:
        """Never called here."""

    @classmethod
    def reference(cls, params: dict[str, Any]) -> Any:
        """Never called here."""


class TorchOrCupy(TorchOnly):
    name: ClassVar[str] = "torch_or_cupy"
    arrays: ClassVar[tuple[str, ...]] = ("cupy", "torch")


TORCH_ONLY = f"{__name__}:TorchOnly"


# -- a torch workload where torch cannot run ---------------------------------------


@needs_no_torch_gpu
def test_torch_workload_loads_and_is_unavailable_with_the_reason():
    cls = api.load(TORCH_ONLY)  # declaring torch is no load error
    for array in ("auto", "torch"):
        reason = api.unavailable_reason(cls, array)
        assert reason and "'torch_only' needs a GPU" in reason and "array backend 'torch' is not usable here" in reason
        assert "install the 'torch' extra" in reason
    assert api.unavailable_reason(cls, "numpy") == "workload 'torch_only' runs on torch, not 'numpy'"
    assert api.resolve_array(cls, "auto") == "torch"


@needs_no_torch_gpu
def test_torch_workload_arms_are_skipped_with_the_reason_or_the_run_refused():
    data = {"workload": {"name": TORCH_ONLY}, "pipeline": {"skip_unavailable": True}}
    arms, skipped = check_backends(parse_scenario(data))
    assert not arms and skipped
    assert all("needs a GPU" in s["reason"] and "'torch'" in s["reason"] for s in skipped)
    data["pipeline"]["skip_unavailable"] = False
    with pytest.raises(Unavailable, match="torch_only"):
        check_backends(parse_scenario(data))


def test_a_scenario_may_ask_for_torch_by_name():
    """``workload.array = "torch"`` is a scenario value like ``cupy``; an unknown name is refused, naming the field."""
    data = {"workload": {"name": "counter", "array": "torch"}, "pipeline": {"skip_unavailable": True}}
    assert parse_scenario(data).array == "torch"
    data["workload"]["array"] = "jax"
    with pytest.raises(InvalidArgument, match="workload.array.*torch"):
        parse_scenario(data)


@needs_no_gpu
def test_auto_without_any_gpu_names_every_device_backend_the_workload_runs_on():
    reason = api.unavailable_reason(TorchOrCupy, "auto")
    assert reason and "'cupy' is not usable" in reason and "'torch' is not usable" in reason


def test_an_unknown_array_backend_in_arrays_is_a_load_error(monkeypatch):
    monkeypatch.setattr(TorchOnly, "arrays", ("jax",))
    with pytest.raises(api.WorkloadError, match=r"arrays = \('jax',\).*'numpy', 'cupy', 'torch'"):
        api.load(TORCH_ONLY)
    monkeypatch.setattr(TorchOnly, "arrays", "torch")  # a string, not a tuple of names
    with pytest.raises(api.WorkloadError, match="arrays"):
        api.load(TORCH_ONLY)


def test_auto_keeps_counter_off_torch_unless_cupy_runs():
    """``auto`` never loads PyTorch for a workload that also runs on NumPy or CuPy."""
    assert api.declared_arrays(api.load("counter")) == ("numpy", "cupy", "torch")
    assert api.resolve_array(api.load("counter"), "auto") == ("cupy" if _usable("cupy") else "numpy")
    assert api.resolve_array(api.load("counter"), "torch") == "torch"


def test_counter_subclasses_do_not_inherit_torch():
    """A variant replaces the op's steps with NumPy/CuPy methods (``state.copy()``): it must opt in itself."""
    for name in ("resend", "outbox", "restore_hook", "echo_peer"):
        assert "torch" not in api.declared_arrays(api.load(name)), name
    assert api.declared_arrays(api.load("persistent_kernel")) == ("cupy",)


@needs_no_torch_gpu
def test_get_xp_torch_raises_the_reason_and_an_unknown_name_is_refused():
    with pytest.raises(xp.ArrayBackendUnavailable, match="array backend 'torch' is not usable here") as info:
        xp.get_xp("torch")
    assert isinstance(info.value, ValueError) and isinstance(info.value, Unavailable)
    with pytest.raises(InvalidArgument, match="'jax'.*auto, numpy, cupy, torch"):
        xp.get_xp("jax")
    with pytest.raises(InvalidArgument, match="'jax'"):
        xp.unusable_reason("jax")


@needs_no_torch_gpu
def test_launch_of_an_unusable_backend_logs_the_reason(tmp_path):
    """A workload process started on torch where torch cannot run exits 1 and says why in its log."""
    ControlFile.create(tmp_path / "control").close()
    config = WorkloadConfig(workload="counter", trial="t", params=api.resolve_params(Counter, {}),
                            control_path=str(tmp_path / "control"), report_path=str(tmp_path / "report.json"),
                            marker_path=str(tmp_path / "marker"), log_path=str(tmp_path / "log"), array_backend="torch")
    config.dump(tmp_path / "config.json")
    assert launch.main([str(tmp_path / "config.json")]) == 1
    assert "failed: array backend 'torch' is not usable here" in (tmp_path / "log").read_text()


# -- the helpers refuse what they do not know ----------------------------------------


@pytest.mark.parametrize("thing", [[1, 2, 3], memoryview(b"abcd"), bytearray(8), 3], ids=lambda t: type(t).__name__)
def test_array_helpers_refuse_an_unknown_array_type(thing):
    kind = f"{type(thing).__module__}.{type(thing).__qualname__}"
    for helper in (xp.pointer, xp.to_host):
        with pytest.raises(xp.ArrayTypeError, match=f"{helper.__name__}: {kind} is not a NumPy array, a CuPy array or a torch tensor"):
            helper(thing)


def test_pointer_refuses_a_numpy_scalar():
    with pytest.raises(xp.ArrayTypeError, match="NumPy scalar"):
        xp.pointer(np.uint64(7))


def test_namespace_helpers_refuse_an_unknown_namespace():
    for helper in (xp.synchronize, xp.is_device, xp.device_uuid, xp.release_cached_memory, xp.backend_name):
        with pytest.raises(xp.ArrayTypeError, match="array namespace 'json' is none of numpy, cupy, torch"):
            helper(json)
    for helper in (xp.word_dtype, lambda ns: xp.word(ns, 1), lambda ns: xp.shift_right(ns, np.zeros(1), 3)):
        with pytest.raises(xp.ArrayTypeError, match="'json'"):
            helper(json)


def test_host_words_refuses_what_is_not_a_64_bit_integer():
    for bad in (np.zeros(2), np.zeros(2, dtype=np.uint32)):
        with pytest.raises(xp.ArrayTypeError, match=f"host_words: dtype {bad.dtype} is not a 64-bit integer"):
            xp.host_words(bad)
    with pytest.raises(xp.ArrayTypeError, match="to_host"):
        xp.host_words([1, 2])


# -- NumPy through the array API namespace ---------------------------------------------


@pytest.mark.parametrize("namespace", [np, xnp], ids=["numpy", "array_api_compat.numpy"])
def test_numpy_helpers_work_on_the_module_and_its_compat_namespace(namespace):
    a = namespace.arange(4, dtype=namespace.uint64)
    assert xp.backend_name(namespace) == "numpy" and not xp.is_device(namespace)
    assert xp.pointer(a) == a.ctypes.data and xp.to_host(a) is a
    assert xp.device_uuid(namespace) is None
    xp.synchronize(namespace)
    xp.release_cached_memory(namespace)
    assert xp.word_dtype(namespace) is np.uint64
    w = xp.word(namespace, -1)  # mod 2**64
    assert type(w) is np.uint64 and int(w) == 2**64 - 1
    assert xp.shift_right(namespace, namespace.asarray([w]), 60).tolist() == [15]
    with pytest.raises(InvalidArgument, match="bits = 64"):
        xp.shift_right(namespace, a, 64)
    assert xp.host_words(np.array([-1, 2], dtype=np.int64)) == [2**64 - 1, 2]
    assert array_api_compat.array_namespace(a) is xnp


def test_counter_arithmetic_through_the_compat_namespace_matches_the_reference():
    """Counter's body on ``array_api_compat.numpy``, the way a torch run drives it, reproduces the
    NumPy reference and NumPy's own sums bit for bit (uint64 wrap-around included)."""
    params = api.resolve_params(Counter, {"seed": 9, "state_size": 257})
    ref = Counter.reference(params)
    state = initial_state(xnp, params["state_size"], params["seed"])
    assert digest(xnp, state) == ref.checksum(0)
    for op in range(1, 6):
        apply_op(xnp, state, params["seed"], op)
        assert digest(xnp, state) == ref.checksum(op) == ref.payload(op)
    assert xp.to_host(sums(xnp, state)).tolist() == sums(np, state).tolist()
    assert int(state.max()) >= 1 << 63  # the values exercise the full unsigned range

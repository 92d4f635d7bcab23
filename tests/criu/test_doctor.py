"""``cutbench doctor`` on this machine, with the project's CRIU: its verdict and exit code."""

from __future__ import annotations


import pytest

from cutbench.harness.environment import doctor
from tests.fixtures.doctor_checks import STATUSES, by_name


@pytest.mark.criu
def test_run_checks_on_this_machine():
    checks = doctor.run_checks()
    assert all(isinstance(c, doctor.Check) and c.status in STATUSES for c in checks)
    names = by_name(checks)
    for n in ("criu", "privileges", "kernel", "network lock", "gpu", "cuda checkpoint API", "cupy device",
              "cuda-checkpoint", "postgresql", "python: numpy", "python: cuda-bindings", "python: nvidia-ml-py"):
        assert n in names, n
    # CI provisions CRIU before the tests, so it must be found and pass `criu check`.
    assert names["criu"].status == "ok", names["criu"].detail
    assert "Looks good" in names["criu"].detail
    for c in checks:
        if c.status in ("missing", "fail"):
            assert c.fix, f"{c.name} is {c.status} but says no fix"

"""Suite-wide test policy.

- Tests live by tier: ``tests/unit`` (no CRIU, no GPU), ``tests/criu`` (real
  CRIU dumps and restores), ``tests/gpu`` (an NVIDIA GPU), with shared
  fixtures and helpers in ``tests/fixtures``. The fixtures come from the
  modules named in ``pytest_plugins`` below; plain helpers and constants are
  imported from ``tests/fixtures``; a test module never imports another test
  module. The tier folder adds its marker to every test in it, so ``-m criu``
  and ``-m gpu`` select the same tests as the folders.
- ``gpu`` tests skip, with the reason, where no usable GPU and driver
  checkpoint API exist (CI has none).
- ``criu`` tests never skip: the ``criu`` fixture raises when CRIU cannot be
  used, so a CI machine without CRIU fails loudly instead of reporting green.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ``CUTBENCH_FULL_SUITE=1``: the full example counts where a test runs fewer by default (docs/development.md).
FULL_SUITE = os.environ.get("CUTBENCH_FULL_SUITE") == "1"

# The shared fixtures reach every tier through pytest itself, never through an
# import into a test module: an imported fixture is registered again in each
# module that imports it, so a session fixture (a CRIU run, a PostgreSQL
# cluster, a dockerd) would be made once per module. `pytester`: the plugin
# tests (unit and criu tiers) drive pytest itself.
pytest_plugins = [
    "pytester",
    "tests.fixtures.container_fixtures",
    "tests.fixtures.doc_examples",
    "tests.fixtures.receiver_fixtures",
    "tests.fixtures.run_fixtures",
    "tests.fixtures.workload_cases",
]


@functools.lru_cache(maxsize=1)
def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    try:
        from cutbench.harness.environment import gpu_probe

        facts = gpu_probe.probe()
    except Exception as exc:  # a probe failure is a reason to skip, shown to the user
        return f"GPU probe failed: {exc}"
    if facts.get("usable"):
        return None
    return "no usable NVIDIA GPU with CuPy and the CUDA driver checkpoint API here"


TIERS = {"criu": pytest.mark.criu, "gpu": pytest.mark.gpu}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS and item.get_closest_marker(tier) is None:
            item.add_marker(TIERS[tier])
        if item.get_closest_marker("gpu") is not None:
            reason = reason or gpu_skip_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def criu():
    """The CRIU install the tests use; raises (fails the test) when CRIU is unusable."""
    from cutbench.harness.environment.criu import locate

    return locate.require_criu()


@pytest.fixture
def results_root(tmp_path: Path) -> Path:
    """A fresh results root for one test."""
    root = tmp_path / "results"
    root.mkdir()
    return root


def live_processes() -> list[tuple[int, str]]:
    """Every live (non-zombie) process but this one, with its command line."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append((int(proc.name), cmd.strip()))
    return found


def workload_processes() -> list[tuple[int, str]]:
    """Live (non-zombie) processes that are cutbench workloads (and their ranks) or receivers started by tests."""
    marks = ("cutbench.workloads.launch", "cutbench.workloads.ranks", "cutbench.receivers serve")
    return [(pid, cmd) for pid, cmd in live_processes() if any(m in cmd for m in marks)]

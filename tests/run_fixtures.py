"""Shared fixtures of the results, CLI and plugin tests: small real runs through CRIU.

Test modules import the fixtures they use (``from tests.run_fixtures import ...``).
The session's runs are made once and read by several modules; tests that
change a run work on a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

def counter_scenario(name: str, *, modes: list[str], faults: list[str], phases: list[str]) -> str:
    """A small scenario: the CPU counter (4 ops), CRIU cuts after ``phases`` of op 2, crashes 100 ms after the dump.

    Under ``at_least_once``, ``leave_running`` replays published effects
    (duplicates: invalid) while ``kill`` restores cleanly (valid). About a
    second per trial.
    """
    return f"""
name = "{name}"
description = "counter, CRIU cuts around op 2: {', '.join(faults)} under {', '.join(modes)}"

[workload]
name = "counter"
array = "numpy"
params = {{ ops = 4, state_size = 4096, seed = 5, op_interval_ms = 20.0 }}

[receiver]
modes = {json.dumps(modes)}

[pipeline]
backends = ["criu"]
faults = {json.dumps(faults)}
crash_after_ms = [100]

[plan]
source = "exhaustive"
ops = [2, 2]
phases = {json.dumps(phases)}

[run]
watchdog_s = 15
trial_timeout_s = 60
"""


# Four trials, two valid (kill) and two invalid (leave_running).
MIXED_SCENARIO = counter_scenario("mixed", modes=["at_least_once"], faults=["kill", "leave_running"], phases=["publish", "commit"])


def artifacts_dir() -> Path:
    """Where tests leave files for people to look at (``CUTBENCH_ARTIFACTS``, default build/test-artifacts)."""
    path = Path(os.environ.get("CUTBENCH_ARTIFACTS", REPO / "build" / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cli(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cutbench ARGS`` in a subprocess from the repository root."""
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


@pytest.fixture(scope="session")
def mixed_scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The path of :data:`MIXED_SCENARIO` written to a file."""
    path = tmp_path_factory.mktemp("scenarios") / "mixed.toml"
    path.write_text(MIXED_SCENARIO)
    return path


@pytest.fixture(scope="session")
def mixed_run(criu, mixed_scenario: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of :data:`MIXED_SCENARIO` made by ``cutbench run``; read it, do not change it."""
    out = tmp_path_factory.mktemp("mixed-results")
    proc = cli("run", str(mixed_scenario), "--out", str(out), "--json")
    assert proc.returncode == 1, f"expected invalid trials (exit 1), got {proc.returncode}\n{proc.stderr[-3000:]}"
    (out / "cli-stdout.json").write_text(proc.stdout)  # what `--json` printed, for the CLI tests
    return (out / "latest").resolve()


@pytest.fixture
def mixed_run_copy(mixed_run: Path, tmp_path: Path) -> Path:
    """A private copy of :func:`mixed_run` that a test may change."""
    dest = tmp_path / mixed_run.name
    shutil.copytree(mixed_run, dest)
    return dest

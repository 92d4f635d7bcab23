"""``--jobs`` and ``--cutbench-jobs`` checked at the boundary, through the ``cutbench`` command and pytest in subprocesses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fixtures.run_fixtures import MIXED_SCENARIO

QUICK = REPO / "scenarios" / "quick.toml"


def test_cli_jobs_is_checked_before_anything_runs(tmp_path: Path):
    for bad in ("0", "two", "-3"):
        proc = subprocess.run([sys.executable, "-m", "cutbench", "run", str(QUICK), "--out", str(tmp_path), "--jobs", bad],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert proc.returncode == 254, proc.stderr
        assert "--jobs = " in proc.stderr and '"auto"' in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir()), "a rejected --jobs must not create a run"


def test_plugin_jobs_option_is_checked(pytester: pytest.Pytester):
    (pytester.path / "mixed.toml").write_text(MIXED_SCENARIO)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--cutbench-scenario", "mixed.toml", "--cutbench-jobs", "0")
    assert result.ret != 0
    assert "--cutbench-jobs = 0" in result.stderr.str()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q", "--cutbench-scenario", "mixed.toml",
                                           "--cutbench-jobs", "auto")
    assert result.ret == 0 and "mixed.toml::mixed:criu/at_least_once/kill" in result.stdout.str()

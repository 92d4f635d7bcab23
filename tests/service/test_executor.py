"""``--executor`` and ``--ray-address`` checked at the boundary, through the ``cutbench`` command in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

QUICK = REPO / "scenarios" / "quick.toml"


def _cli(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """``cutbench ARGS`` in a fresh interpreter, after ``prelude``."""
    code = f"{prelude}\nfrom cutbench.harness.integrations.cli import main\nmain({list(args)!r})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_cli_executor_options_are_checked_before_anything_runs(tmp_path: Path):
    out = str(tmp_path / "out")
    for args, needle in ((["--executor", "dask"], "'dask' is not one of 'threads', 'ray'"),
                         (["--ray-address", "head:6379"], "only read with run.executor = \"ray\" (--executor ray)"),
                         (["--executor", "ray", "--ray-address", "ray://head:10001"], "Ray Client address")):
        proc = _cli("run", str(QUICK), "--out", out, *args)
        assert proc.returncode == 254, proc.stderr
        assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not Path(out).exists(), "a rejected option must not create a run"


def test_without_ray_the_ray_executor_names_the_install_command(tmp_path: Path):
    """``import ray`` fails in the child (as where the extra is not installed): exit 254, the install command, no run."""
    out = tmp_path / "out"
    proc = _cli("run", str(QUICK), "--out", str(out), "--executor", "ray",
                prelude="import sys\nsys.modules['ray'] = None  # Ray not installed")
    assert proc.returncode == 254, proc.stderr
    assert "needs Ray, an optional extra: pip install 'cutbench[ray]'" in proc.stderr, proc.stderr
    assert "--executor threads" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()



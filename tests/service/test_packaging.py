"""The built wheel: ``pip wheel`` of the package's sources, copied out of the checkout so that the build writes nothing into it."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.conftest import REPO


def test_an_installed_cutbench_adds_one_top_level_name(tmp_path):
    """The wheel holds ``cutbench`` and nothing else at its top level (no generic ``harness``/``workloads``)."""
    source, out = tmp_path / "src", tmp_path / "wheel"
    # setuptools builds in the source tree (build/, *.egg-info): a copy of what the wheel is made of, not the checkout.
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for name in ("cutbench", "harness", "workloads", "receivers"):
        shutil.copytree(REPO / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import zipfile

    [wheel] = out.glob("cutbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"cutbench"}, tops
    assert "cutbench/harness/model/plan.py" in names and "cutbench/workloads/api.py" in names
    assert "cutbench/receivers/client.py" in names



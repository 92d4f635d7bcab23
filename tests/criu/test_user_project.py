"""cutbench inside a user's project that has its own ``harness`` and ``workloads`` packages.

cutbench installs one import name (``cutbench``), so a project's own generic
package names cannot shadow it: the pytest plugin's ``cutbench_trial``
fixture runs a custom workload from the project's ``workloads`` package
through real CRIU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())


def test_plugin_and_custom_workload_in_a_project_with_its_own_workloads_package(criu, tmp_path):
    project = tmp_path / "project"
    # The project's own packages, named as cutbench's rooms are in its repository.
    write(project / "harness" / "__init__.py", '"""The user\'s own test harness."""\nNAME = "user harness"\n')
    write(project / "workloads" / "__init__.py", '"""The user\'s own workloads."""\n')
    write(project / "workloads" / "mine.py", '''
        """A workload of the user's: cutbench's counter under another name."""
        from cutbench.workloads.counter import Counter


        class Mine(Counter):
            name = "mine"
    ''')
    write(project / "tests" / "test_gate.py", '''
        import harness
        import workloads.mine


        def test_own_packages_are_the_projects():
            assert harness.NAME == "user harness"
            assert workloads.mine.Mine.name == "mine"


        def test_a_restore_of_my_workload_is_valid(cutbench_trial):
            result = cutbench_trial("2/publish", workload="workloads.mine:Mine", params={"ops": 4}, fault="kill")
            assert result.outcome == "valid", (result.outcome, result.findings)
    ''')
    # The workload process imports workloads.mine from the project, as a user's CI would arrange.
    env = {**os.environ, "PYTHONPATH": str(project)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout, proc.stdout[-2000:]

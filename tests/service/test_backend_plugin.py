"""A third-party backend, installed for real, found by entry point and run through one trial.

The package is ``examples/backend_plugin`` (shown in full in docs/backends.md):
pip installs it into a private prefix, and the ``cutbench`` command run with
that prefix on its path lists the backend and runs a trial through it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO

PLUGIN = REPO / "examples" / "backend_plugin"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("plugin-site")
    source = tmp_path_factory.mktemp("plugin-src") / "backend_plugin"
    shutil.copytree(PLUGIN, source)  # setuptools builds in the source tree: keep the checkout clean
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                           "--target", str(site), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return site


def cutbench(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-m", "cutbench", *args], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def test_docs_show_the_example_as_it_is():
    doc = (REPO / "docs" / "backends.md").read_text()
    blocks = re.findall(r"```(?:python|toml)\n(.*?)```", doc, flags=re.S)
    assert (PLUGIN / "cutbench_sigstop.py").read_text() in blocks
    assert (PLUGIN / "pyproject.toml").read_text() in blocks


def test_an_entry_point_backend_is_listed_and_runs_a_trial(plugin_site, tmp_path):
    listed = cutbench(plugin_site, "list", "backends", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    by_name = {b["name"]: b for b in json.loads(listed.stdout)}
    assert by_name["sigstop"]["available"], by_name["sigstop"]
    assert by_name["sigstop"]["target"] == "cutbench_sigstop:SigstopCheckpointer"

    out = tmp_path / "results"
    run = cutbench(plugin_site, "run", str(REPO / "scenarios" / "quick.toml"), "--out", str(out), "--json",
                   "--set", 'pipeline.backends=["sigstop"]', "--set", 'pipeline.faults=["none", "kill"]',
                   "--set", 'receiver.modes=["idempotent"]', "--set", 'plan.phases=["publish"]', cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    run_dir = (out / "latest").resolve()
    trials = pd.read_parquet(run_dir / "trials.parquet")
    assert list(trials["backend"]) == ["sigstop"] and list(trials["outcome"]) == ["valid"], trials.to_string()
    assert trials["sigstop_freeze_s"].notna().all() and trials["sigstop_thaw_s"].notna().all()
    # The kill arm is skipped because the backend declares it cannot restore, with that reason.
    skipped = json.loads(run.stdout).get("skipped_arms") or []
    assert any("does not support fault 'kill'" in s["reason"] for s in skipped), run.stdout[-2000:]

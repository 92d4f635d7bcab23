"""A bundled Slurm (`cutbench slurm install`): what makes one, what counts as one, and the errors before any
unpacking. Running one is tests/criu/test_slurm.py's."""

from __future__ import annotations

import json

import pytest

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.harness.provision import slurm as cluster
from cutbench.harness.provision import slurm_bundle


def test_download_only_and_from_exclude_each_other(tmp_path):
    with pytest.raises(InvalidArgument, match="exclude each other"):
        slurm_bundle.install(tmp_path / "p", download_only=tmp_path / "d", from_dir=tmp_path)


def test_a_folder_without_slurm_s_packages_is_refused_naming_them_and_the_fix(tmp_path):
    (tmp_path / "munge_0.5.15-2_amd64.deb").write_bytes(b"")
    with pytest.raises(Unavailable) as err:
        slurm_bundle.install(tmp_path / "p", from_dir=tmp_path)
    said = str(err.value)
    assert "slurmctld_*.deb, slurmd_*.deb, slurm-client_*.deb" in said and "munge_*" not in said
    assert "--download-only DIR" in said
    assert not (tmp_path / "p" / "root").exists()


def make_bundle(prefix, names=slurm_bundle.PROGRAMS):
    (prefix / "bin").mkdir(parents=True)
    for name in names:
        (prefix / "bin" / name).write_text("#!/bin/sh\n")
        (prefix / "bin" / name).chmod(0o755)
    (prefix / "install.json").write_text(json.dumps({"version": "22.05.8"}))


def test_a_bundle_counts_only_with_its_record_and_every_wrapper(tmp_path):
    assert slurm_bundle.bundled(tmp_path) is None
    make_bundle(tmp_path, [n for n in slurm_bundle.PROGRAMS if n != "slurmstepd"])
    assert slurm_bundle.bundled(tmp_path) is None
    (tmp_path / "bin" / "slurmstepd").write_text("")
    found = slurm_bundle.bundled(tmp_path)
    assert found is not None and found.version == "22.05.8" and found.stepd == tmp_path / "bin" / "slurmstepd"


def test_a_bundle_s_programs_come_first_on_the_path_of_the_cluster_and_its_jobs(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTBENCH_SLURM_PREFIX", str(tmp_path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert cluster.programs_env()["PATH"] == "/usr/bin:/bin"
    make_bundle(tmp_path)
    assert cluster.programs_env()["PATH"] == f"{tmp_path / 'bin'}:/usr/bin:/bin"
    assert cluster.which("sbatch") == str(tmp_path / "bin" / "sbatch")


def test_a_job_submitted_with_the_program_s_own_environment_still_finds_the_bundle(tmp_path, monkeypatch):
    # The backend submits with the program's environment (its own PATH among it): the bundle goes first on that.
    monkeypatch.setenv("CUTBENCH_SLURM_PREFIX", str(tmp_path))
    make_bundle(tmp_path)
    env = cluster.client_env({"PATH": "/opt/program/bin:/usr/bin", "PROGRAM_SETTING": "1"})
    assert env["PATH"] == f"{tmp_path / 'bin'}:/opt/program/bin:/usr/bin" and env["PROGRAM_SETTING"] == "1"

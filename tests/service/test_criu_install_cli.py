"""`cutbench criu install` as a user types it: the exit code and the words for arguments it refuses
(the command in a subprocess, so the process's exit code is what is checked)."""

from __future__ import annotations

from tests.fixtures.criu_debs import fake_criu_deb
from tests.fixtures.run_fixtures import cli


def test_cli_from_dir_without_the_source_exits_254_naming_the_file(tmp_path):
    debs = fake_criu_deb(tmp_path / "debs")
    proc = cli("criu", "install", "--prefix", str(tmp_path / "prefix"), "--from", str(debs), "--with-cuda-plugin")
    assert proc.returncode == 254, proc.stdout + proc.stderr
    assert "criu_4.2.1.orig.tar.xz" in proc.stdout + proc.stderr and "--with-cuda-plugin" in proc.stdout + proc.stderr


def test_cli_with_cuda_plugin_keeps_the_modes_exclusive(tmp_path):
    proc = cli("criu", "install", "--download-only", str(tmp_path / "a"), "--from", str(tmp_path),
               "--with-cuda-plugin")
    assert proc.returncode == 254 and "exclude each other" in proc.stdout + proc.stderr

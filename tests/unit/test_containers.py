"""The container backends' pure parts: the image, the mounts, the CRIU options, Podman's statistics."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from cutbench.errors import Unavailable
from cutbench.harness.nemesis.backends import containers
from cutbench.harness.nemesis.backends.podman import _CHECKPOINT_STATS, _stats


def test_the_image_holds_the_merged_usr_links_and_mount_points_only():
    with tarfile.open(fileobj=io.BytesIO(containers.rootfs_tarball())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert {n: m.linkname for n, m in members.items() if m.issym()} == {
        "bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
    assert all(m.isdir() for n, m in members.items() if not m.issym())
    assert {"usr", "tmp", "proc", "dev"} <= set(members)


def test_mounts_are_outermost_read_only_with_the_trial_directory_writable(tmp_path):
    mounts = containers.host_mounts(tmp_path)
    assert mounts[str(tmp_path.resolve())] == "rw"
    assert mounts["/usr"] == "ro"
    env = Path(sys.prefix).resolve()  # the workload's interpreter environment is visible inside
    assert any(env == Path(m) or Path(m) in env.parents for m in mounts)
    ro = [Path(m) for m, mode in mounts.items() if mode == "ro"]
    assert not any(a != b and b in a.parents for a in ro for b in ro), "a mount inside another"
    assert not any(Path("/usr") in m.parents for m in ro)


def test_the_engine_s_state_directory_is_never_mounted_into_a_container(tmp_path):
    state = tmp_path / "engine" / "data"
    state.mkdir(parents=True)
    with pytest.raises(Unavailable, match="holds the engine's state directory"):
        containers.host_mounts(tmp_path, forbidden=(state,))


@pytest.mark.parametrize("restore_after, tcp", [(None, "tcp-established"), ("kill", "tcp-established"),
                                                ("leave_running", "tcp-close")])
def test_criu_options_keep_the_receiver_connection_or_close_it_after_a_crash(tmp_path, restore_after, tcp):
    path = tmp_path / "criu" / "runc.conf"
    containers.criu_options(path, log=tmp_path / "x.log", restore_after=restore_after)
    lines = path.read_text().splitlines()
    assert containers.OPTIONS_HEADER in lines[0]
    assert tcp in lines and {"tcp-established", "tcp-close"} - {tcp} & set(lines) == set()
    assert f"log-file {tmp_path / 'x.log'}" in lines and any(ln.startswith("network-lock ") for ln in lines)


def test_podman_statistics_become_facts_in_seconds():
    out = json.dumps({"podman_checkpoint_duration": 251454, "container_statistics": [
        {"Id": "x", "runtime_checkpoint_duration": 211442,
         "criu_statistics": {"freezing_time": 100804, "frozen_time": 52631, "memdump_time": 3092, "memwrite_time": 1863}}]})
    facts = _stats(out.encode(), _CHECKPOINT_STATS)
    assert facts == pytest.approx({"podman_checkpoint_total_s": 0.251454, "podman_runtime_checkpoint_s": 0.211442,
                                   "podman_criu_freezing_s": 0.100804, "podman_criu_frozen_s": 0.052631,
                                   "podman_criu_memdump_s": 0.003092, "podman_criu_memwrite_s": 0.001863})
    assert _stats(b"not json", _CHECKPOINT_STATS) == {}


def test_container_names_are_valid_and_unique_per_trial():
    a = containers.container_name("/tmp/cutbench-20261201T1200Z-quick-ab12/t0001")
    b = containers.container_name("/tmp/cutbench-20261201T1200Z-quick-ab12/t0002")
    assert a != b and a.replace("-", "").replace(".", "").replace("_", "").isalnum()


def test_a_scenario_s_criu_options_go_into_the_options_file_as_it_spells_them(tmp_path):
    # pipeline.criu_options reach the CRIU runc runs for Docker and Podman through this file, at dump and restore.
    path = tmp_path / "runc.conf"
    containers.criu_options(path, log=tmp_path / "criu.log", restore_after="kill",
                            extra=("--file-locks", "--ghost-limit=64M"))
    lines = path.read_text().splitlines()
    assert lines[-2:] == ["file-locks", "ghost-limit 64M"] and "tcp-established" in lines

"""``benchmarks/bandwidth_reference.py``: sizes, file system types, rates, and a small real run on this host."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from cutbench.errors import InvalidArgument
from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("bandwidth_reference", REPO / "benchmarks" / "bandwidth_reference.py")
bw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bw)


@pytest.mark.parametrize("text, n", [("1GiB", 1 << 30), ("256MiB", 256 << 20), ("2GB", 2 * 10**9), ("1.5 GiB", 3 << 29),
                                     ("1048576", 1 << 20), ("4M", 4 * 10**6)])
def test_sizes_take_binary_and_decimal_units(text, n):
    assert bw.parse_size(text) == n


@pytest.mark.parametrize("text", ["1 TiB", "lots", "-1GiB", "1KiB"])
def test_a_size_that_is_not_one_is_named(text):
    with pytest.raises(InvalidArgument, match="^--size "):
        bw.parse_size(text)


def test_the_file_system_of_a_path_is_its_mounts():
    assert bw.fs_type("/proc/self") == "proc"
    assert bw.fs_type("/dev/shm") == "tmpfs"


def test_rates_are_bytes_over_wall_and_cpu_per_gib():
    r = bw.rates(2 << 30, {"wall_s": 0.5, "user_s": 0.1, "sys_s": 0.3, "cpu_s": 0.4})
    assert r["gb_s"] == pytest.approx((2 << 30) / 0.5 / 1e9) and r["cpu_s_per_gib"] == pytest.approx(0.2)


def test_a_small_run_measures_memcpy_and_tmpfs_and_writes_its_json(tmp_path, capsys):
    out = tmp_path / "bw.json"
    assert bw.main(["--size", "8MiB", "--repeat", "2", "--skip", "disk", "gpu", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"memcpy", "memcpy_fresh", "tmpfs_write", "tmpfs_read"}
    for r in data["results"].values():
        assert r["bytes"] == 8 << 20 and r["gb_s"] > 0 and r["cpu_s"] >= 0
    assert data["dirs"]["tmpfs_fs"] == "tmpfs" and data["gpu"] == "skipped"
    printed = capsys.readouterr().out
    assert "| memcpy " in printed and "CPU s/GiB" in printed
    assert not (Path("/dev/shm") / f"cutbench-bandwidth-{os.getpid()}.tmp").exists()  # its file is removed
    assert bw.main(["--size", "1KiB"]) != 0  # refused with the reason, nothing measured


def test_disk_is_measured_in_the_directory_given(tmp_path):
    results = bw.host_measurements(4 << 20, 1, {"disk"}, tmp_path, tmp_path)
    assert set(results) == {"disk_write", "disk_read"} and list(tmp_path.iterdir()) == []


def test_processes_make_the_copies_side_by_side_each_on_its_own_buffers_and_file(tmp_path):
    out = tmp_path / "bw.json"
    assert bw.main(["--size", "4MiB", "--repeat", "2", "--processes", "3", "--skip", "disk", "gpu", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    parallel = data["parallel"]
    assert parallel["processes"] == 3 and set(parallel["results"]) == {"memcpy_fresh", "tmpfs_write", "tmpfs_read"}
    for r in parallel["results"].values():
        assert r["bytes"] == 3 * (4 << 20) and r["processes"] == 3 and r["gb_s"] > 0 and r["cpu_s"] > 0
    assert "--processes 3" in data["command"]
    assert not list(Path("/dev/shm").glob("cutbench-bandwidth-*.tmp"))  # every process's file removed


def test_a_process_that_cannot_copy_is_named_and_the_others_are_not_left_waiting(tmp_path):
    with pytest.raises(OSError, match="^tmpfs_write with 2 processes: FileNotFoundError"):
        bw.parallel_measurements(1 << 20, 2, 1, {"tmpfs"}, tmp_path / "absent")
    with pytest.raises(InvalidArgument, match="^--processes 0: expected 1 to 256"):
        bw.parse_args(["--processes", "0"])

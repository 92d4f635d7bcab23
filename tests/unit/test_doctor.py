"""`cutbench doctor` and the GPU probe: sane on this (GPU-less) machine, correct on faked facts."""

from __future__ import annotations

import sys
import types

import pytest

from cutbench.harness.provision.criu import locate, plugin
from cutbench.harness.environment import doctor
from cutbench.harness.environment import gpu_probe
from tests.conftest import REPO
from tests.fixtures.doctor_checks import by_name


def test_missing_criu_is_a_problem_with_a_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    c, inst = doctor.check_criu(tmp_path / "no-prefix")
    assert inst is None and c.status == "missing"
    assert "cutbench criu install" in c.fix and "--from DIR" in c.fix
    assert doctor.problems([c]) == [c]
    assert doctor.check_network_lock(None).status == "missing"


def _status(cap_eff: int) -> str:
    return f"Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff:016x}\n"


def test_privileges_from_capabilities():
    assert doctor.check_privileges(_status(0x1FFFEFFFFFF), euid=0).status == "ok"
    both = (1 << doctor.CAP_SYS_ADMIN) | (1 << doctor.CAP_CHECKPOINT_RESTORE)
    assert doctor.check_privileges(_status(both), euid=1000).status == "ok"
    c = doctor.check_privileges(_status(1 << doctor.CAP_SYS_ADMIN), euid=1000)
    assert c.status == "fail" and "CAP_CHECKPOINT_RESTORE no" in c.detail and "root" in c.fix


def test_gpu_checks_without_gpu():
    facts = {"nvidia_smi": None, "gpus": [], "cuda_bindings": {"version": None, "checkpoint_api": False},
             "cupy": {"version": None, "device_count": 0}, "cuda_checkpoint": None}
    checks = by_name(doctor.check_gpu(facts))
    assert checks["gpu"].status == "missing" and checks["gpu"].fix
    assert all(c.status != "fail" for c in checks.values())  # no GPU is not a failure


def test_gpu_checks_with_gpu():
    facts = {"nvidia_smi": "/usr/bin/nvidia-smi", "driver_version": "580.159.04", "cuda_driver_version": "13.0",
             "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1234", "memory_mib": 143771}],
             "cuda_bindings": {"version": "13.3.1", "checkpoint_api": True},
             "cupy": {"version": "14.2.0", "device_count": 1}, "cuda_checkpoint": "/usr/bin/cuda-checkpoint"}
    checks = by_name(doctor.check_gpu(facts))
    assert all(c.status == "ok" for c in checks.values())
    assert "NVIDIA H200" in checks["gpu"].detail and "580.159.04" in checks["gpu"].detail


def test_gpu_present_but_cupy_blind_is_a_failure():
    facts = {"nvidia_smi": "/usr/bin/nvidia-smi", "gpus": [{"index": 0, "name": "X", "uuid": "U"}],
             "cuda_bindings": {"version": "13.3.1", "checkpoint_api": True},
             "cupy": {"version": "14.2.0", "device_count": 0, "error": "CUDARuntimeError"}, "cuda_checkpoint": None}
    assert by_name(doctor.check_gpu(facts))["cupy device"].status == "fail"


def test_format_checks_shows_fixes_and_problems():
    text = doctor.format_checks([
        doctor.Check("criu", "missing", "no criu\nsecond line", "cutbench criu install"),
        doctor.Check("kernel", "ok", "Linux 6.18"),
    ])
    assert "fix: cutbench criu install" in text and "second line" in text
    assert "1 problem(s): criu" in text
    assert doctor.format_checks([doctor.Check("kernel", "ok", "x")]).endswith("no problems")


# ----------------------------------------------------------------------------- gpu_probe


def test_probe_never_crashes_here():
    facts = gpu_probe.probe()
    for key in ("nvidia_smi", "gpus", "driver_version", "cuda_driver_version", "cuda_bindings", "cupy",
                "nvml", "cuda_checkpoint", "usable"):
        assert key in facts
    if facts["nvidia_smi"] is None:
        assert facts["gpus"] == [] and facts["usable"] is False


def test_pick_scenario_prints_nothing_without_gpu(monkeypatch, capsys):
    monkeypatch.setattr(gpu_probe, "probe", lambda: {"usable": False})
    assert gpu_probe.main(["--pick-scenario"]) == 1
    assert capsys.readouterr().out == ""


def test_pick_scenario_with_usable_gpu(monkeypatch, capsys):
    monkeypatch.setattr(gpu_probe, "probe", lambda: {"usable": True})
    assert (REPO / gpu_probe.GPU_SCENARIO).is_file()
    assert gpu_probe.main(["--pick-scenario"]) == 0
    assert capsys.readouterr().out == gpu_probe.GPU_SCENARIO + "\n"


def test_pick_scenario_survives_a_crashing_probe(monkeypatch, capsys):
    def boom():
        raise RuntimeError("driver exploded")
    monkeypatch.setattr(gpu_probe, "probe", boom)
    assert gpu_probe.main(["--pick-scenario"]) == 1
    assert capsys.readouterr().out == ""


def test_probe_with_fake_cuda_modules(monkeypatch):
    """A CuPy that cannot reach a driver and cuda-bindings with the checkpoint calls."""
    drv = types.ModuleType("cuda.bindings.driver")
    for name in gpu_probe.CHECKPOINT_CALLS:
        setattr(drv, name, lambda *a: None)
    drv.cuDriverGetVersion = lambda: (0, 13000)
    cuda, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    cuda.bindings, bindings.driver = bindings, drv

    cupy = types.ModuleType("cupy")
    cupy.__version__ = "14.2.0"

    def no_device():
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")
    cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_device))
    for name, mod in {"cuda": cuda, "cuda.bindings": bindings, "cuda.bindings.driver": drv, "cupy": cupy}.items():
        monkeypatch.setitem(sys.modules, name, mod)

    facts = gpu_probe.probe()
    assert facts["cuda_bindings"]["checkpoint_api"] is True
    assert facts["cupy"]["version"] == "14.2.0" and facts["cupy"]["device_count"] == 0
    assert "insufficient" in facts["cupy"]["error"]
    assert facts["usable"] is False


def test_criu_cuda_plugin_not_built_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.delenv(plugin.PLUGIN_ENV, raising=False)
    c = doctor.check_criu_cuda_plugin(tmp_path)
    assert c.status == "missing" and str(tmp_path / "lib" / "criu" / "cuda_plugin.so") in c.detail
    assert "cutbench criu install --with-cuda-plugin" in c.fix
    assert doctor.problems([c]) == []  # only the criu-cuda-plugin backend needs it


def test_criu_cuda_plugin_found_at_its_path_with_its_record(monkeypatch, tmp_path):
    monkeypatch.delenv(plugin.PLUGIN_ENV, raising=False)
    lib = tmp_path / "lib" / "criu"
    lib.mkdir(parents=True)
    (lib / "cuda_plugin.so").write_bytes(b"")
    (lib / "cuda_plugin.json").write_text('{"criu_version": "4.2.1", "source": "criu_4.2.1.orig.tar.xz"}')
    criu = locate.CriuInstall(("criu",), "4.2.1", "bundled", tmp_path)
    c = doctor.check_criu_cuda_plugin(tmp_path, criu)
    assert c.status == "ok" and c.detail.startswith(f"found at {lib / 'cuda_plugin.so'}")
    assert "built for CRIU 4.2.1 from criu_4.2.1.orig.tar.xz" in c.detail
    newer = locate.CriuInstall(("criu",), "4.3", "bundled", tmp_path)
    c = doctor.check_criu_cuda_plugin(tmp_path, newer)
    assert c.status == "warn" and "the CRIU found is 4.3" in c.detail
    assert "--with-cuda-plugin --force" in c.fix


def test_criu_cuda_plugin_variable_wins(monkeypatch, tmp_path):
    (tmp_path / "lib" / "criu").mkdir(parents=True)
    (tmp_path / "lib" / "criu" / "cuda_plugin.so").write_bytes(b"")
    monkeypatch.setenv(plugin.PLUGIN_ENV, str(tmp_path / "elsewhere"))
    c = doctor.check_criu_cuda_plugin(tmp_path)
    assert c.status == "missing" and f"{plugin.PLUGIN_ENV}={tmp_path / 'elsewhere'} holds no cuda_plugin.so" in c.detail
    assert "cutbench criu install --with-cuda-plugin" in c.fix
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "cuda_plugin.so").write_bytes(b"")
    c = doctor.check_criu_cuda_plugin(tmp_path)
    assert c.status == "ok" and str(tmp_path / "elsewhere") in c.detail and plugin.PLUGIN_ENV in c.detail


MOUNTS = """tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
/dev/vda / ext4 rw,relatime 0 0
cutbench-images /mnt/cutbench-images tmpfs rw,relatime,size=100663296k,huge=always 0 0
tmpfs /mnt/small tmpfs rw,huge=within_size 0 0
"""


@pytest.mark.parametrize("path, status, words", [
    ("/mnt/cutbench-images/run1", "ok", "huge=always"),
    ("/mnt/small", "ok", "huge=within_size"),
    ("/dev/shm", "warn", "without huge pages (huge=never)"),
    ("/var/tmp/images", "warn", "on ext4, not tmpfs"),
])
def test_the_images_dir_check_wants_a_tmpfs_with_huge_pages(path, status, words):
    c = doctor.check_images_dir(path, MOUNTS)
    assert c.status == status and words in c.detail
    if status == "warn":
        assert "pipeline.images_dir" in c.fix and c not in doctor.problems([c])  # advice, not a problem


def test_mount_of_takes_the_innermost_mount_and_nothing_for_unknown_text():
    assert doctor.mount_of("/mnt/cutbench-images/a/b", MOUNTS) == ("/mnt/cutbench-images", "tmpfs",
                                                                   ("rw", "relatime", "size=100663296k", "huge=always"))
    assert doctor.mount_of("/x", "") == ("", "", ())
    assert doctor.check_images_dir("/x", "").status == "warn"

"""CRIU provisioning end to end: Debian's packages downloaded and unpacked, then a real dump and restore.

The `criu` tests fail, never skip, when CRIU is not provisioned: CI runs
`cutbench criu install` first, so a missing CRIU there is a real failure.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cutbench.harness.provision.criu import install, locate, unpack

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37


@pytest.fixture(scope="module")
def debs(tmp_path_factory) -> Path:
    """criu and its dependencies downloaded once from the machine's Debian mirror."""
    d = tmp_path_factory.mktemp("debs")
    assert install.install(download_only=d) is None
    return d


@pytest.mark.criu
def test_download_only_fetches_criu_and_its_libraries(debs):
    names = [p.name for p in debs.glob("*.deb")]
    assert any(n.startswith("criu_") for n in names)
    assert any(n.startswith("libc6_") for n in names)  # the bundled loader comes from here
    assert any(n.startswith("libnftables") for n in names)  # network lock without iptables


@pytest.mark.criu
def test_install_from_dir_into_prefix(debs, tmp_path):
    prefix = tmp_path / "prefix"
    inst = install.install(prefix, from_dir=debs, force=True)
    assert inst is not None and inst.source == "bundled" and inst.prefix == prefix
    assert locate.version_ok(inst)
    assert inst.argv[0].startswith(str(prefix)) and "--library-path" in inst.argv
    ok, out = locate.check(inst)
    assert ok, out
    # The relocatable wrapper runs the same CRIU.
    p = subprocess.run([str(prefix / "bin" / "criu"), "--version"], capture_output=True, text=True)
    assert f"Version: {inst.version}" in p.stdout
    # Idempotent: a second call finds the working install and does not unpack again.
    mtime = (prefix / "root").stat().st_mtime_ns
    assert install.install(prefix, from_dir=debs) is not None
    assert (prefix / "root").stat().st_mtime_ns == mtime
    assert locate.find_criu(prefix) == inst


@pytest.mark.criu
def test_python_unpacker_matches_dpkg_deb(debs, tmp_path):
    deb = next(debs.glob("libcompel1_*.deb"))
    a, b = tmp_path / "a", tmp_path / "b"
    unpack.unpack_deb(deb, a)
    unpack._unpack_deb_python(deb, b)
    files = lambda r: sorted(str(p.relative_to(r)) for p in r.rglob("*"))  # noqa: E731
    assert files(a) == files(b) and files(a)


@pytest.mark.criu
def test_require_criu_passes_criu_check():
    inst = locate.require_criu()  # raises (test fails) when CRIU is not provisioned
    assert locate.version_ok(inst)
    ok, out = locate.check(inst)
    assert ok, out
    assert locate.require_criu() is inst  # cached per process


@pytest.mark.criu
def test_dump_and_restore_a_sleeping_process(tmp_path):
    inst = locate.require_criu()
    libc = ctypes.CDLL(None, use_errno=True)
    was = ctypes.c_int(0)
    libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    # The restored process is re-parented to us once `criu restore -d` exits.
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    images = tmp_path / "images"
    images.mkdir()
    child = subprocess.Popen(["sleep", "1000"], start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid = child.pid
    restored = False
    try:
        time.sleep(0.2)
        t0 = time.monotonic()
        d = subprocess.run(inst.command("dump", "-t", str(pid), "-D", str(images), "-o", "dump.log", "-v4"),
                           capture_output=True, text=True, timeout=120)
        dump_s = time.monotonic() - t0
        assert d.returncode == 0, (images / "dump.log").read_text()[-3000:]
        # Dump killed the process; reap the zombie or restore fails with "Can't fork ... File exists".
        assert child.wait(timeout=10) == -signal.SIGKILL
        t0 = time.monotonic()
        r = subprocess.run(inst.command("restore", "-D", str(images), "-d", "--pidfile", str(tmp_path / "pid"),
                                        "-o", "restore.log", "-v4"),
                           capture_output=True, text=True, timeout=120)
        restore_s = time.monotonic() - t0
        assert r.returncode == 0, (images / "restore.log").read_text()[-3000:]
        restored = True
        assert int((tmp_path / "pid").read_text()) == pid  # CRIU restores the same PID
        assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
        print(f"criu dump {dump_s:.3f} s, restore {restore_s:.3f} s")
    finally:
        if restored:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)  # ours to reap thanks to the subreaper bit
            assert os.WIFSIGNALED(status)
        elif child.poll() is None:
            child.kill()
            child.wait()
        libc.prctl(PR_SET_CHILD_SUBREAPER, was.value, 0, 0, 0)

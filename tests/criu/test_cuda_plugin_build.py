"""CRIU's CUDA plugin built for real: CRIU's source downloaded from the Debian mirror, compiled, loaded by CRIU.

The offline path end to end: ``--download-only DIR --with-cuda-plugin`` (network)
fills DIR, ``--from DIR --with-cuda-plugin`` builds from it. The build goes into a
prefix kept under the project's CRIU prefix (:data:`CACHE`), so the unpacked and
compiled source survives between runs: a fresh machine builds in a few seconds,
a repeated run only reruns make. No GPU is needed: CRIU loads the plugin, which
finds no GPU and stands aside.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from cutbench.errors import Unavailable
from cutbench.harness.provision.criu import apt, install, locate, plugin_build
from cutbench.harness.provision.criu import plugin as criu_plugin
from tests.fixtures.run_fixtures import cli

CACHE = locate.default_prefix() / "test-cuda-plugin"


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory) -> Path:
    """What an offline machine needs, downloaded once per run from the machine's Debian mirror."""
    d = tmp_path_factory.mktemp("offline")
    assert install.install(download_only=d, with_cuda_plugin=True) is None
    return d


def _dump_log_with(criu: locate.CriuInstall, libdir: Path, tmp_path: Path) -> str:
    """CRIU's -v4 log of a `criu dump --libdir LIBDIR --leave-running` of a sleeping process."""
    child = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p = subprocess.run(criu.command("dump", "-t", str(child.pid), "-D", str(tmp_path), "-o", "dump.log", "-v4",
                                        "--leave-running", "--libdir", str(libdir)),
                           capture_output=True, text=True, timeout=120)
    finally:
        child.kill()
        child.wait()
    log = (tmp_path / "dump.log").read_text()
    assert p.returncode == 0, log[-3000:]
    return log


def test_download_only_fetches_the_source_of_the_same_criu(source_dir):
    deb = next(source_dir.glob("criu_*.deb"))
    version = apt.upstream_version(deb.name.split("_")[1])
    assert (source_dir / f"criu_{version}.orig.tar.xz").is_file()
    assert list((source_dir / "build-deps").glob("libcap-dev_*.deb"))
    assert not list(source_dir.glob("libcap-dev_*.deb"))  # kept out of the CRIU tree --from unpacks


def test_install_from_dir_builds_a_plugin_that_criu_loads(source_dir, monkeypatch, tmp_path):
    monkeypatch.delenv(criu_plugin.PLUGIN_ENV, raising=False)
    t0 = time.monotonic()
    proc = cli("criu", "install", "--prefix", str(CACHE), "--from", str(source_dir), "--with-cuda-plugin", "--json")
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = json.loads(proc.stdout)
    plugin = CACHE / "lib" / "criu" / "cuda_plugin.so"
    assert said["cuda_plugin"] == str(plugin) and plugin.is_file()
    criu = locate.bundled(CACHE)
    assert criu is not None and said["version"] == criu.version
    record = criu_plugin.plugin_record(plugin.parent)
    assert record["criu_version"] == criu.version and record["source"] == f"criu_{criu.version}.orig.tar.xz"
    print(f"criu install --from DIR --with-cuda-plugin: {took:.1f} s (plugin: {record['took_s']} s)")
    # Found where the backend looks, without CUTBENCH_CRIU_PLUGIN_DIR.
    assert criu_plugin.plugin_dir(CACHE) == plugin.parent
    # CRIU itself loads it: the dump would fail on a plugin it cannot dlopen or verify.
    assert 'Plugin "cuda_plugin"' in _dump_log_with(criu, plugin.parent, tmp_path)


def _identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def test_a_second_install_keeps_the_plugin_and_force_rebuilds_from_the_cache(source_dir):
    plugin = plugin_build.install_cuda_plugin(CACHE, from_dir=source_dir)  # built by the test above
    before = _identity(plugin)
    assert install.install(CACHE, from_dir=source_dir, with_cuda_plugin=True) is not None
    assert _identity(plugin) == before  # untouched
    # The kept build: the source tree unpacked under PREFIX/build/<name>-<sha256 prefix>/src, and the plugin
    # make built in it (plugin_build.build_cuda_plugin's layout).
    tarball = plugin_build.plugin_source_in(source_dir, locate.bundled(CACHE).version)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()[:12]
    tree = CACHE / "build" / f"{tarball.name.split('.orig.tar')[0]}-{digest}" / "src"
    built = tree / "plugins" / "cuda" / criu_plugin.PLUGIN
    assert built.is_file(), f"no kept build at {built}"
    kept_tree, kept_built = tree.stat().st_ino, _identity(built)
    t0 = time.monotonic()
    assert plugin_build.install_cuda_plugin(CACHE, from_dir=source_dir, force=True) == plugin
    took = time.monotonic() - t0
    assert _identity(plugin) != before  # checked again and swapped in
    # The rebuild used the cache: the tree was not unpacked again, and make found the plugin up to date
    # (it neither relinked nor replaced it). Facts of the files, not a duration: a loaded host stretches that.
    assert tree.stat().st_ino == kept_tree
    assert _identity(built) == kept_built
    print(f"a rebuild from the kept source tree: {took:.1f} s")  # a figure, not a bound


def test_verify_rejects_a_plugin_criu_cannot_load(tmp_path):
    criu = locate.require_criu()
    (tmp_path / "cuda_plugin.so").write_bytes(b"not an ELF file\n")
    with pytest.raises(Unavailable, match="does not load"):
        plugin_build.verify_plugin(criu, tmp_path)

"""CRIU provisioning (harness/provision/criu/) without CRIU: apt config parsing, discovery and the CUDA plugin's argument checks (the
download, the real dump and restore are in tests/criu/test_criu_tool.py, the plugin's real build in
tests/criu/test_cuda_plugin_build.py).

The `criu` tests fail, never skip, when CRIU is not provisioned: CI runs
`cutbench criu install` first, so a missing CRIU there is a real failure.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile

import pytest

from cutbench.harness.nemesis import Backends
from cutbench.harness.provision.criu import apt, fetch, install, locate, plugin, plugin_build
from tests.conftest import REPO
from tests.fixtures.criu_debs import fake_criu_deb
from cutbench.errors import InvalidArgument, Unavailable

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""

SECURITY_FIRST = """\
Types: deb-src
URIs: http://src.example.org/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://security.example.org/debian-security
Suites: trixie-security
Components: main

Types: deb
URIs: http://disabled.example.org/debian
Suites: trixie
Enabled: no

Types: deb
URIs: http://embedded.example.org/debian
Suites: trixie
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBGPL0BUBEADmW5NdOOHwPIJlgPu6JDcKw/NZJPR8lsD9K7UgrF6nCc4uCm8L
 -----END PGP PUBLIC KEY BLOCK-----
"""

ONE_LINE = """\
# comment
deb-src http://src.example.org/debian bookworm main
deb http://archive.ubuntu.com/ubuntu noble main universe
deb [arch=amd64 signed-by=/etc/apt/keyrings/deb.gpg] http://ftp.example.org/debian/ bookworm main contrib # trailing
"""


# ----------------------------------------------------------------------------- apt config (unit)


def test_parse_deb822_reads_uri_suites_and_keyring():
    srcs = apt.parse_deb822(DEB822)
    assert [s.uri for s in srcs] == ["http://mirror.example.org/debian", "http://mirror.example.org/debian-security"]
    assert srcs[0].suites == ["bookworm", "bookworm-updates"]
    assert srcs[0].signed_by == "/usr/share/keyrings/debian-archive-keyring.gpg"
    assert srcs[0].is_debian and not srcs[1].is_debian


def test_parse_deb822_skips_disabled_and_keeps_embedded_key():
    srcs = apt.parse_deb822(SECURITY_FIRST)
    assert "http://disabled.example.org/debian" not in [s.uri for s in srcs]
    emb = [s for s in srcs if s.uri.startswith("http://embedded")][0]
    assert emb.signed_by.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINB")
    assert emb.signed_by.endswith("-----END PGP PUBLIC KEY BLOCK-----")


def test_parse_one_line_sources_list():
    srcs = apt.parse_one_line(ONE_LINE)
    assert [(s.types[0], s.uri) for s in srcs] == [
        ("deb-src", "http://src.example.org/debian"),
        ("deb", "http://archive.ubuntu.com/ubuntu"),
        ("deb", "http://ftp.example.org/debian/"),
    ]
    assert srcs[2].signed_by == "/etc/apt/keyrings/deb.gpg"
    assert srcs[2].components == ["main", "contrib"]
    assert not srcs[1].is_debian  # Ubuntu is not a Debian archive
    assert srcs[2].is_debian


def test_debian_mirror_first_binary_non_security(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("deb http://archive.ubuntu.com/ubuntu noble main\n")
    (tmp_path / "sources.list.d" / "a.sources").write_text(SECURITY_FIRST)
    (tmp_path / "sources.list.d" / "b.list").write_text(ONE_LINE)
    (tmp_path / "sources.list.d" / "c.list.disabled").write_text("deb http://no.example.org/debian sid main\n")
    src = apt.debian_mirror(tmp_path)
    assert src.uri == "http://embedded.example.org/debian"
    assert src.signed_by.startswith("-----BEGIN PGP")


def test_debian_mirror_from_one_line_sources_list(tmp_path):
    (tmp_path / "sources.list").write_text(ONE_LINE)
    src = apt.debian_mirror(tmp_path)
    assert (src.uri, src.signed_by) == ("http://ftp.example.org/debian/", "/etc/apt/keyrings/deb.gpg")


def test_no_debian_mirror_says_how_to_fix(tmp_path):
    (tmp_path / "sources.list").write_text("deb http://archive.ubuntu.com/ubuntu noble main\n")
    with pytest.raises(Unavailable, match="--from DIR"):
        apt.debian_mirror(tmp_path)


# ----------------------------------------------------------------------------- small pieces


def test_invocation_loads_no_provisioning_module():
    """What a run uses (locate, plugin) imports neither apt, download, unpack nor build code."""
    code = ("import sys\nfrom cutbench.harness.provision.criu import locate, plugin\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('cutbench.harness.provision.criu.'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    loaded = {m.rpartition(".")[2] for m in proc.stdout.split()}
    assert loaded == {"locate", "plugin", "tools"}, loaded


def test_parse_version():
    assert locate.parse_version("Version: 4.2.1\nGitID: v4.2.1\n") == (4, 2, 1)
    assert locate.parse_version("Version: 3.17\n") == (3, 17)
    assert locate.parse_version("garbage") is None


def test_version_ok():
    mk = lambda v: locate.CriuInstall(("criu",), v, "path", None)  # noqa: E731
    assert locate.version_ok(mk("4.2.1")) and locate.version_ok(mk("5.0"))
    assert not locate.version_ok(mk("3.17.1")) and not locate.version_ok(mk("4.1.1"))


def test_resolve_packages_drops_virtual_and_dependency_lines():
    out = "criu\n  Depends: libc6\n  Depends: <libfoo>\n    libfoo1\nlibc6\n<libfoo>\nlibfoo1\n"
    assert apt.resolve_packages(out) == ["criu", "libc6", "libfoo1"]


def test_default_prefix(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTBENCH_CRIU_PREFIX", str(tmp_path / "p"))
    assert locate.default_prefix() == tmp_path / "p"
    monkeypatch.delenv("CUTBENCH_CRIU_PREFIX")
    assert locate.default_prefix() == REPO / ".criu"


def test_install_rejects_both_modes(tmp_path):
    with pytest.raises(InvalidArgument, match="exclude each other"):
        install.install(tmp_path, download_only=tmp_path / "a", from_dir=tmp_path / "b")


def test_install_from_empty_dir_explains(tmp_path):
    (tmp_path / "debs").mkdir()
    with pytest.raises(Unavailable, match="no criu_.*deb.*--download-only"):
        install.install(tmp_path / "prefix", from_dir=tmp_path / "debs", force=True)


def test_download_without_apt_explains(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get here
    with pytest.raises(Unavailable, match="apt-get not found.*--from DIR"):
        fetch.download_debs(tmp_path / "debs")


def test_bad_suite_is_invalid_argument(tmp_path):
    with pytest.raises(InvalidArgument, match="suite"):
        fetch.download_debs(tmp_path, suite="unstable main; rm")


def test_nothing_found_explains(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(locate, "_required", {})
    with pytest.raises(Unavailable, match="(?s)no bundled CRIU.*cutbench criu install"):
        locate.require_criu(tmp_path / "empty")


# ----------------------------------------------------------------------------- the CUDA plugin (unit)


def test_upstream_version_drops_epoch_and_revision():
    assert apt.upstream_version("4.2.1-1") == "4.2.1"
    assert apt.upstream_version("1:4.2.1-1+b1") == "4.2.1"
    assert apt.upstream_version("4.2") == "4.2"


def test_with_cuda_plugin_still_rejects_both_modes(tmp_path):
    with pytest.raises(InvalidArgument, match="exclude each other"):
        install.install(tmp_path, download_only=tmp_path / "a", from_dir=tmp_path / "b", with_cuda_plugin=True)


def test_from_dir_without_the_source_names_the_file_and_the_fix(tmp_path):
    debs = fake_criu_deb(tmp_path / "debs")
    with pytest.raises(Unavailable) as err:
        install.install(tmp_path / "prefix", from_dir=debs, force=True, with_cuda_plugin=True)
    said = str(err.value)
    assert "no criu_4.2.1.orig.tar.xz there" in said
    assert "`cutbench criu install --download-only DIR --with-cuda-plugin`" in said
    assert "--from DIR --with-cuda-plugin" in said
    assert not (tmp_path / "prefix").exists()  # refused before unpacking anything


def test_plugin_source_must_match_the_criu_version(tmp_path):
    (tmp_path / "criu_4.2.orig.tar.xz").write_bytes(b"")
    assert plugin_build.plugin_source_in(tmp_path) == tmp_path / "criu_4.2.orig.tar.xz"
    with pytest.raises(Unavailable, match=r"no criu_4\.2\.1\.orig\.tar\.xz there .*for CRIU 4\.2\.1"):
        plugin_build.plugin_source_in(tmp_path, "4.2.1")


def test_installed_plugin_is_found_without_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(plugin.PLUGIN_ENV, raising=False)
    monkeypatch.setenv("CUTBENCH_CRIU_PREFIX", str(tmp_path / "prefix"))
    backend = Backends().new("criu-cuda-plugin")
    reason = backend.unavailable_reason()
    assert "`cutbench criu install --with-cuda-plugin`" in reason and plugin.PLUGIN_ENV in reason
    assert backend.extra_args == ()
    lib = tmp_path / "prefix" / "lib" / "criu"
    lib.mkdir(parents=True)
    (lib / "cuda_plugin.so").write_bytes(b"")
    assert plugin.plugin_dir() == lib
    assert backend.extra_args == ("--libdir", str(lib))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "cuda-checkpoint" in backend.unavailable_reason()
    # The variable wins when set, even over an installed plugin.
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv(plugin.PLUGIN_ENV, str(other))
    assert plugin.plugin_dir() is None
    assert "holds no cuda_plugin.so" in plugin.plugin_unavailable_reason()
    (other / "cuda_plugin.so").write_bytes(b"")
    assert backend.extra_args == ("--libdir", str(other))


def test_missing_toolchain_is_named_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc, no make
    with pytest.raises(Unavailable, match=r"needs gcc, make, missing here.*`apt-get install gcc make`"):
        plugin_build._ensure_toolchain(tmp_path, may_install=False)


def test_build_refuses_a_tarball_that_is_not_criu(tmp_path):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "README").write_text("not criu\n")
    tarball = tmp_path / "criu_4.2.1.orig.tar.xz"
    with tarfile.open(tarball, "w:xz") as tar:
        tar.add(junk, arcname="junk")
    with pytest.raises(Unavailable, match="holds no CRIU source tree with plugins/cuda"):
        plugin_build.build_cuda_plugin(tarball, None, tmp_path / "work")

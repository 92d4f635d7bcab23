"""CRIU provisioning without CRIU: apt config parsing and discovery (the download and the real dump and
restore are in tests/criu/test_criu_tool.py).

The `criu` tests fail, never skip, when CRIU is not provisioned: CI runs
`cutbench criu install` first, so a missing CRIU there is a real failure.
"""

from __future__ import annotations

import pytest

from cutbench.harness.environment import criu_tool
from tests.conftest import REPO
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
    srcs = criu_tool.parse_deb822(DEB822)
    assert [s.uri for s in srcs] == ["http://mirror.example.org/debian", "http://mirror.example.org/debian-security"]
    assert srcs[0].suites == ["bookworm", "bookworm-updates"]
    assert srcs[0].signed_by == "/usr/share/keyrings/debian-archive-keyring.gpg"
    assert srcs[0].is_debian and not srcs[1].is_debian


def test_parse_deb822_skips_disabled_and_keeps_embedded_key():
    srcs = criu_tool.parse_deb822(SECURITY_FIRST)
    assert "http://disabled.example.org/debian" not in [s.uri for s in srcs]
    emb = [s for s in srcs if s.uri.startswith("http://embedded")][0]
    assert emb.signed_by.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINB")
    assert emb.signed_by.endswith("-----END PGP PUBLIC KEY BLOCK-----")


def test_parse_one_line_sources_list():
    srcs = criu_tool.parse_one_line(ONE_LINE)
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
    src = criu_tool.debian_mirror(tmp_path)
    assert src.uri == "http://embedded.example.org/debian"
    assert src.signed_by.startswith("-----BEGIN PGP")


def test_debian_mirror_from_one_line_sources_list(tmp_path):
    (tmp_path / "sources.list").write_text(ONE_LINE)
    src = criu_tool.debian_mirror(tmp_path)
    assert (src.uri, src.signed_by) == ("http://ftp.example.org/debian/", "/etc/apt/keyrings/deb.gpg")


def test_no_debian_mirror_says_how_to_fix(tmp_path):
    (tmp_path / "sources.list").write_text("deb http://archive.ubuntu.com/ubuntu noble main\n")
    with pytest.raises(Unavailable, match="--from DIR"):
        criu_tool.debian_mirror(tmp_path)


def test_this_machine_mirror_comes_from_its_apt_config():
    src = criu_tool.debian_mirror()
    assert src.uri in {s.uri for s in criu_tool.read_apt_sources()}


# ----------------------------------------------------------------------------- small pieces


def test_parse_version():
    assert criu_tool.parse_version("Version: 4.2.1\nGitID: v4.2.1\n") == (4, 2, 1)
    assert criu_tool.parse_version("Version: 3.17\n") == (3, 17)
    assert criu_tool.parse_version("garbage") is None


def test_version_ok():
    mk = lambda v: criu_tool.CriuInstall(("criu",), v, "path", None)  # noqa: E731
    assert criu_tool.version_ok(mk("4.2.1")) and criu_tool.version_ok(mk("5.0"))
    assert not criu_tool.version_ok(mk("3.17.1")) and not criu_tool.version_ok(mk("4.1.1"))


def test_resolve_packages_drops_virtual_and_dependency_lines():
    out = "criu\n  Depends: libc6\n  Depends: <libfoo>\n    libfoo1\nlibc6\n<libfoo>\nlibfoo1\n"
    assert criu_tool.resolve_packages(out) == ["criu", "libc6", "libfoo1"]


def test_default_prefix(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTBENCH_CRIU_PREFIX", str(tmp_path / "p"))
    assert criu_tool.default_prefix() == tmp_path / "p"
    monkeypatch.delenv("CUTBENCH_CRIU_PREFIX")
    assert criu_tool.default_prefix() == REPO / ".criu"


def test_install_rejects_both_modes(tmp_path):
    with pytest.raises(InvalidArgument, match="exclude each other"):
        criu_tool.install(tmp_path, download_only=tmp_path / "a", from_dir=tmp_path / "b")


def test_install_from_empty_dir_explains(tmp_path):
    (tmp_path / "debs").mkdir()
    with pytest.raises(Unavailable, match="no criu_.*deb.*--download-only"):
        criu_tool.install(tmp_path / "prefix", from_dir=tmp_path / "debs", force=True)


def test_download_without_apt_explains(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get here
    with pytest.raises(Unavailable, match="apt-get not found.*--from DIR"):
        criu_tool.download_debs(tmp_path / "debs")


def test_bad_suite_is_invalid_argument(tmp_path):
    with pytest.raises(InvalidArgument, match="suite"):
        criu_tool.download_debs(tmp_path, suite="unstable main; rm")


def test_nothing_found_explains(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(criu_tool, "_required", {})
    with pytest.raises(Unavailable, match="(?s)no bundled CRIU.*cutbench criu install"):
        criu_tool.require_criu(tmp_path / "empty")

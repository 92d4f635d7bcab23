"""Downloading with apt: Debian's ``criu`` and every library it needs, and (for the CUDA plugin) CRIU's source.

apt runs from a private, throw-away state directory (:func:`apt_session`)
listing one suite of one mirror, so the host's package lists, cache and
installed packages are untouched and root is not needed. Owns what is
fetched (:data:`PACKAGE`, :data:`BUILD_DEBS`) and from which suite.

Must not unpack, install or build: it only fills a directory with files
(``install`` and ``plugin_build`` use them). The mirror comes from
``apt.mirror_and_keyring``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.harness.provision.criu.apt import mirror_and_keyring, resolve_packages, upstream_version
from cutbench.harness.provision.criu.tools import run, tail

PACKAGE = "criu"
DEFAULT_SUITE = "unstable"
# Beyond a C toolchain, cuda_plugin.c needs one header outside libc, <sys/capability.h>
# (CRIU's cr_options.h includes it). Only the header: the plugin links nothing, its
# symbols resolve against the criu binary that loads it. So the .deb is unpacked into
# the build tree rather than installed: no root needed, and it works offline.
BUILD_DEBS = ("libcap-dev",)
# A subdirectory, so `--from DIR` (which unpacks every DIR/*.deb into CRIU's tree) never sees them.
BUILD_DEBS_DIR = "build-deps"


def _arch() -> str:
    """The Debian architecture name of this machine (amd64, arm64, ...)."""
    if shutil.which("dpkg"):
        p = run(["dpkg", "--print-architecture"])
        if p.returncode == 0 and p.stdout.strip():
            return p.stdout.strip()
    m = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el"}.get(m, m)


def _apt_options(state: Path, arch: str) -> list[str]:
    """apt options for a private, throw-away apt state: the host's lists, cache and dpkg status are untouched."""
    return [
        "-o", f"Dir::Etc::SourceList={state / 'sources.list'}",
        "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", f"Dir::State::Lists={state / 'lists'}",
        "-o", f"Dir::Cache={state / 'cache'}",
        # An empty dpkg status: every dependency counts as "not installed", so all are fetched.
        "-o", "Dir::State::status=/dev/null",
        "-o", f"APT::Architecture={arch}",
        "-o", f"APT::Architectures={arch}",
        "-o", "Acquire::Languages=none",
        # As root apt would drop to _apt, who cannot write our temp dirs.
        "-o", "APT::Sandbox::User=root",
        "-q",
    ]


def _run_apt(args: list[str], what: str, *, cwd: Path | None = None, timeout: float = 600) -> str:
    """Run apt-get/apt-cache/apt-helper; returns its stdout. A failure raises Unavailable naming the step and apt's message."""
    p = run(args, cwd=cwd, timeout=timeout)
    if p.returncode != 0:
        raise Unavailable(f"{what} failed (exit {p.returncode}):\n{tail(p.stderr or p.stdout)}")
    return p.stdout


@contextmanager
def apt_session(
    suite: str, mirror: str | None, keyring: str | None, etc_apt: Path, *, sources: bool = False
) -> Iterator[tuple[list[str], str]]:
    """Yield (apt options, "MIRROR SUITE") of a private apt state listing ``suite`` of the mirror, already updated.

    ``mirror`` None: the machine's Debian mirror (:func:`apt.mirror_and_keyring`).
    With ``sources`` the state also lists the suite's source packages
    (``deb-src``), for :func:`download_plugin_source`. The state is removed on exit.
    """
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", suite):
        raise InvalidArgument(f"suite: {suite!r} is not a Debian suite name (e.g. unstable, trixie)")
    for tool in ("apt-get", "apt-cache"):
        if shutil.which(tool) is None:
            raise Unavailable(
                f"{tool} not found: fetching CRIU needs apt. Fix: run "
                "`cutbench criu install --download-only DIR` on a Debian/Ubuntu machine, copy DIR here, "
                "then `cutbench criu install --from DIR`"
            )
    mirror, keyring = mirror_and_keyring(mirror, keyring, etc_apt)
    arch = _arch()
    with tempfile.TemporaryDirectory(prefix="cutbench-apt-") as tmp:
        state = Path(tmp)
        for d in ("lists/partial", "cache/archives/partial"):
            (state / d).mkdir(parents=True)
        opts = []
        if keyring and "BEGIN PGP" in keyring:  # deb822 may embed the key itself
            (state / "keyring.asc").write_text(keyring.strip() + "\n")
            keyring = str(state / "keyring.asc")
        if keyring:
            opts.append(f"signed-by={keyring}")
        opt_text = f"[{' '.join(opts)}] " if opts else ""
        kinds = ("deb", "deb-src") if sources else ("deb",)
        (state / "sources.list").write_text("".join(f"{k} {opt_text}{mirror} {suite} main\n" for k in kinds))
        o = _apt_options(state, arch)
        _run_apt(["apt-get", *o, "update"], f"apt-get update from {mirror} {suite} (is the mirror reachable?)")
        yield o, f"{mirror} {suite}"


def download_debs(
    dest: Path,
    *,
    suite: str = DEFAULT_SUITE,
    mirror: str | None = None,
    keyring: str | None = None,
    etc_apt: Path = Path("/etc/apt"),
    cuda_plugin_source: bool = False,
    packages: tuple[str, ...] = (PACKAGE,),
) -> list[Path]:
    """Download ``packages`` (``criu``) and their recursive dependencies from ``suite`` into ``dest``; returns every
    .deb there, sorted.

    The mirror and keyring come from the machine's apt configuration unless
    given. apt runs with a private state directory, so the host's package
    lists and installed packages are untouched (and root is not needed).
    With ``cuda_plugin_source`` it also fetches what building the CUDA plugin
    offline takes (see :func:`download_plugin_source`): the upstream source of
    that same CRIU and the build-dependency .debs under ``dest/build-deps/``.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with apt_session(suite, mirror, keyring, etc_apt, sources=cuda_plugin_source) as (o, where):
        deps = _run_apt(
            ["apt-cache", *o, "depends", "--recurse", "--no-recommends", "--no-suggests",
             "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *packages],
            f"resolving the dependencies of {' '.join(packages)} in {suite}",
        )
        closure = resolve_packages(deps)
        absent = [name for name in packages if name not in closure]
        if absent:
            raise Unavailable(f"{where} has no {' '.join(absent)} package for {_arch()}")
        before = set(dest.glob("*.deb"))
        _run_apt(["apt-get", *o, "download", *closure], f"apt-get download of {len(closure)} packages", cwd=dest)
        if cuda_plugin_source:
            shown = _run_apt(["apt-cache", *o, "show", "--no-all-versions", PACKAGE], f"apt-cache show {PACKAGE}")
            m = re.search(r"^Version:\s*(\S+)", shown, re.M)
            if m is None:
                raise Unavailable(f"apt-cache show {PACKAGE} reports no version:\n{tail(shown)}")
            download_plugin_source(o, dest, upstream_version(m.group(1)), where)
    debs = sorted(dest.glob("*.deb"))
    if not set(debs) - before and not any(d.name.startswith(packages[0] + "_") for d in debs):
        raise Unavailable(f"apt-get download wrote no .deb files into {dest}")
    return debs


def download_plugin_source(o: list[str], dest: Path, version: str, where: str) -> Path:
    """Fetch CRIU ``version``'s upstream tarball into ``dest`` and the build .debs into ``dest/build-deps``.

    ``o`` selects a private apt state that lists the suite's sources
    (:func:`apt_session` with ``sources``), ``where`` names it in messages.
    Returns the tarball's path.
    """
    shown = _run_apt(["apt-cache", *o, "showsrc", "--only-source", PACKAGE], f"apt-cache showsrc {PACKAGE} in {where}")
    versions = re.findall(r"^Version:\s*(\S+)", shown, re.M)
    matching = [v for v in versions if upstream_version(v) == version]
    if not matching:
        raise Unavailable(
            f"{where} has no source of {PACKAGE} {version} (only {', '.join(versions) or 'none'}), so the CUDA "
            f"plugin cannot be built for the installed CRIU {version}. Fix: `cutbench criu install --force "
            "--with-cuda-plugin` installs the suite's current CRIU together with its plugin"
        )
    uris = _run_apt(["apt-get", *o, "source", "--print-uris", "--only-source", f"{PACKAGE}={matching[0]}"],
                    f"apt-get source --print-uris {PACKAGE}={matching[0]}")
    # Lines read: 'URI' NAME SIZE HASH (the hash from the Sources index, which apt verified against Release).
    want = re.compile(rf"{PACKAGE}_{re.escape(version)}\.orig\.tar\.[a-z0-9]+")
    picked = [(uri, name, digest) for uri, name, _size, digest in re.findall(r"^'([^']+)' (\S+) (\d+) (\S+)", uris, re.M)
              if want.fullmatch(name)]
    if not picked:
        raise Unavailable(f"{PACKAGE} {matching[0]} in {where} lists no {PACKAGE}_{version}.orig.tar.*:\n{tail(uris)}")
    uri, name, digest = picked[0]
    # apt's own fetcher checks the hash and honours the machine's apt proxy settings. Only the
    # orig tarball: Debian's packaging (the .debian.tar) does not touch plugins/cuda.
    helper = shutil.which("apt-helper") or "/usr/lib/apt/apt-helper"
    _run_apt([helper, *o, "download-file", uri, str(Path(dest) / name), digest], f"downloading {name} from {where}")
    build = Path(dest) / BUILD_DEBS_DIR
    build.mkdir(parents=True, exist_ok=True)
    _run_apt(["apt-get", *o, "download", *BUILD_DEBS], f"apt-get download {' '.join(BUILD_DEBS)}", cwd=build)
    return Path(dest) / name

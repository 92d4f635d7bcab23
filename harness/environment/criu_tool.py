"""Find, check and provision CRIU.

cutbench needs CRIU >= 4.2: older releases fail ``criu check`` on recent
kernels (vDSO bounds on 6.18) and cannot dump TCP sockets on Linux >= 6.16.
When no such CRIU is on PATH, :func:`install` fetches Debian's ``criu``
package and every library it depends on with ``apt-get download`` (mirror and
keyring taken from the machine's own apt configuration), unpacks them into a
project-local prefix, and runs CRIU through the *bundled* dynamic loader::

    PREFIX/root/usr/lib/<triple>/ld-linux-*.so.* --library-path PREFIX/root/usr/lib/<triple> PREFIX/root/usr/sbin/criu

so nothing is taken from the host's libc. ``--library-path`` (unlike
``LD_LIBRARY_PATH``) does not leak into programs CRIU executes.

Prefix layout::

    PREFIX/root/        the unpacked .debs
    PREFIX/bin/criu     a relocatable shell wrapper (for tools that want `criu` on PATH)
    PREFIX/install.json what was installed, from where
    PREFIX/lib/criu/    CRIU's CUDA plugin, ``cuda_plugin.so`` (``--with-cuda-plugin``), and its record
    PREFIX/build/       the unpacked CRIU source it was built in, kept so a rebuild is quick

Debian's package ships no CUDA plugin, so :func:`install_cuda_plugin` builds
it from the upstream source of the same CRIU release: the
``criu_<version>.orig.tar.*`` in the same mirror and suite (found with
``apt-get source --print-uris``, fetched and hash-checked by ``apt-helper``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import cutbench
from cutbench.errors import InvalidArgument, Unavailable

MIN_VERSION = (4, 2)
PACKAGE = "criu"
DEFAULT_SUITE = "unstable"

# How to tell the user to fix a missing CRIU; every error message ends with it.
FIX = (
    "run `cutbench criu install` (fetches Debian's CRIU >= 4.2 into a project-local prefix); "
    "on a machine without network run `cutbench criu install --download-only DIR` elsewhere, "
    "copy DIR over, then `cutbench criu install --from DIR`"
)


@dataclass(frozen=True)
class CriuInstall:
    """A runnable CRIU: ``argv`` is the command prefix, CRIU's own arguments follow."""

    argv: tuple[str, ...]
    version: str
    source: str  # "path" | "bundled"
    prefix: Path | None = None

    def command(self, *args: str) -> list[str]:
        """The full command line for ``criu ARGS...``."""
        return [*self.argv, *args]


# --------------------------------------------------------------------------- locating


def default_prefix() -> Path:
    """Where a bundled CRIU lives.

    ``$CUTBENCH_CRIU_PREFIX`` if set; else ``<repo>/.criu`` when running from a
    source checkout (:func:`cutbench.source_checkout`); else
    ``$XDG_DATA_HOME/cutbench/criu`` (``~/.local/share/cutbench/criu``).
    """
    env = os.environ.get("CUTBENCH_CRIU_PREFIX")
    if env:
        return Path(env).expanduser()
    repo = cutbench.source_checkout()
    if repo is not None:
        return repo / ".criu"
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "cutbench" / "criu"


def parse_version(text: str) -> tuple[int, ...] | None:
    """``(4, 2, 1)`` from ``criu --version`` output ("Version: 4.2.1"), else None."""
    m = re.search(r"Version:\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def _run(
    argv: list[str], *, timeout: float = 60, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run a command capturing text output; a missing or hanging program becomes Unavailable."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL, env=env
        )
    except FileNotFoundError as e:
        raise Unavailable(f"cannot run {argv[0]}: {e.strerror}") from e
    except subprocess.TimeoutExpired as e:
        raise Unavailable(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from e


def _version_of(argv: tuple[str, ...]) -> str | None:
    """The version string a CRIU command reports, or None if it does not run."""
    try:
        p = _run([*argv, "--version"], timeout=30)
    except Unavailable:
        return None
    v = parse_version(p.stdout + p.stderr)
    return ".".join(map(str, v)) if (p.returncode == 0 and v) else None


def _bundled_argv(root: Path) -> tuple[str, ...] | None:
    """The loader command line for a CRIU unpacked under ``root``, or None if incomplete."""
    criu = root / "usr" / "sbin" / "criu"
    loaders = sorted(root.glob("usr/lib/*/ld-linux*.so.*"))
    if not criu.is_file() or not loaders:
        return None
    loader = loaders[0]
    return (str(loader), "--library-path", str(loader.parent), str(criu))


def bundled(prefix: Path | None = None) -> CriuInstall | None:
    """The CRIU unpacked under ``prefix`` if it exists and reports a version (no ``criu check``)."""
    prefix = Path(prefix) if prefix is not None else default_prefix()
    argv = _bundled_argv(prefix / "root")
    if argv is None:
        return None
    version = _version_of(argv)
    return CriuInstall(argv, version, "bundled", prefix) if version else None


def on_path() -> CriuInstall | None:
    """``criu`` on PATH with its version (any version, no ``criu check``), or None."""
    exe = shutil.which("criu")
    if exe is None:
        return None
    version = _version_of((exe,))
    return CriuInstall((exe,), version, "path", None) if version else None


def version_ok(install: CriuInstall) -> bool:
    """Whether the install is at least :data:`MIN_VERSION`."""
    v = parse_version(f"Version: {install.version}")
    return v is not None and v >= MIN_VERSION


def check(install: CriuInstall) -> tuple[bool, str]:
    """Run ``criu check``; returns (passed, combined output).

    CRIU prints "Looks good." on success; its "Can't keep kdat cache on
    non-tempfs" warnings are harmless and stay in the output.
    """
    try:
        p = _run(install.command("check"), timeout=60)
    except Unavailable as e:
        return False, str(e)
    out = (p.stdout + p.stderr).strip()
    return (p.returncode == 0 and "Looks good" in out), out


def check_feature(install: CriuInstall, feature: str) -> bool:
    """Whether ``criu check --feature FEATURE`` says it is supported (e.g. ``network_lock_nftables``)."""
    try:
        p = _run(install.command("check", "--feature", feature), timeout=60)
    except Unavailable:
        return False
    return p.returncode == 0 and "is supported" in p.stdout + p.stderr


def find_criu(prefix: Path | None = None) -> CriuInstall | None:
    """A working CRIU >= 4.2, or None.

    A bundled install under ``prefix`` wins (so a project-local install beats a
    broken host CRIU); else ``criu`` on PATH. Either must pass ``criu check``.
    """
    for candidate in (lambda: bundled(prefix), on_path):  # probed in turn: the bundled one spares the host's
        cand = candidate()
        if cand is not None and version_ok(cand) and check(cand)[0]:
            return cand
    return None


_required: dict[Path, CriuInstall] = {}


def clear_cache() -> None:
    """Forget what :func:`require_criu` found (after an install)."""
    _required.clear()


def require_criu(prefix: Path | None = None) -> CriuInstall:
    """A working CRIU >= 4.2, cached per process; raises Unavailable saying what is wrong and the fix."""
    key = (Path(prefix) if prefix is not None else default_prefix()).resolve()
    if key in _required:
        return _required[key]
    found = find_criu(key)
    if found is not None:
        _required[key] = found
        return found
    raise Unavailable(diagnose(key))


def diagnose(prefix: Path | None = None) -> str:
    """Explain why no usable CRIU was found, ending with the fix."""
    prefix = Path(prefix) if prefix is not None else default_prefix()
    problems = []
    b = bundled(prefix)
    if b is None:
        if (prefix / "root").exists():
            problems.append(f"the CRIU under {prefix} is incomplete or does not run")
        else:
            problems.append(f"no bundled CRIU under {prefix}")
    else:
        ok, out = check(b)
        if not ok:
            problems.append(f"bundled CRIU {b.version} under {prefix} fails `criu check`:\n{tail(out)}")
    p = on_path()
    if p is None:
        problems.append("no `criu` on PATH")
    elif not version_ok(p):
        problems.append(f"`criu` on PATH ({p.argv[0]}) is {p.version}, cutbench needs >= 4.2")
    else:
        ok, out = check(p)
        if not ok:
            problems.append(f"`criu` on PATH ({p.argv[0]}) fails `criu check`:\n{tail(out)}")
    if os.geteuid() != 0:
        problems.append("not running as root (CRIU needs root or CAP_SYS_ADMIN + CAP_CHECKPOINT_RESTORE)")
    return "CRIU is unavailable: " + "; ".join(problems) + ".\nFix: " + FIX + "."


def tail(text: str, lines: int = 15) -> str:
    """The last ``lines`` lines of ``text`` (for error messages)."""
    return "\n".join(text.strip().splitlines()[-lines:])


# --------------------------------------------------------------------------- apt configuration

# Debian code names and suite aliases; a source whose suite is one of these
# (optionally with -updates/-backports) is a Debian archive. Security archives
# carry only security updates, never `criu` from unstable, so they are skipped.
DEBIAN_SUITES = {
    "sid", "unstable", "experimental", "testing", "stable", "oldstable", "oldoldstable",
    "stretch", "buster", "bullseye", "bookworm", "trixie", "forky", "duke",
}


@dataclass
class AptSource:
    """One apt source entry (one URI) from sources.list or a deb822 .sources file."""

    uri: str
    suites: list[str]
    components: list[str] = field(default_factory=list)
    signed_by: str | None = None  # a keyring path, or an embedded ASCII-armoured key
    types: list[str] = field(default_factory=lambda: ["deb"])
    origin: str = ""

    @property
    def is_debian(self) -> bool:
        """Whether this looks like a Debian archive (not security, not Ubuntu or a third party)."""
        if "security" in self.uri or any(s.endswith("-security") or "/updates" in s for s in self.suites):
            return False
        if not self.uri.startswith(("http://", "https://", "mirror+", "file:")):
            return False
        bases = {re.sub(r"-(updates|backports|backports-sloppy|proposed-updates)$", "", s) for s in self.suites}
        return bool(bases & DEBIAN_SUITES) or self.uri.rstrip("/").endswith("/debian")


def parse_deb822(text: str, origin: str = "") -> list[AptSource]:
    """Parse a deb822 ``.sources`` file; stanzas with ``Enabled: no`` are dropped."""
    out = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:  # continuation line ("." is an empty line)
                cont = line.strip()
                fields[key] += "\n" + ("" if cont == "." else cont)
            elif ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if "uris" not in fields or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields["uris"].split():
            out.append(AptSource(
                uri=uri,
                suites=fields.get("suites", "").split(),
                components=fields.get("components", "").split(),
                signed_by=fields.get("signed-by", "").strip() or None,
                types=fields.get("types", "deb").split(),
                origin=origin,
            ))
    return out


def parse_one_line(text: str, origin: str = "") -> list[AptSource]:
    """Parse one-line-style ``sources.list`` text (``deb [opts] URI SUITE COMP...``)."""
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        m = re.match(r"^(deb|deb-src)\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s*(.*)$", line)
        if not m:
            continue
        opts = dict(o.split("=", 1) for o in (m.group(2) or "").split() if "=" in o)
        out.append(AptSource(
            uri=m.group(3),
            suites=[m.group(4)],
            components=m.group(5).split(),
            signed_by=opts.get("signed-by"),
            types=[m.group(1)],
            origin=origin,
        ))
    return out


def read_apt_sources(etc_apt: Path = Path("/etc/apt")) -> list[AptSource]:
    """All apt sources in the order apt reads them: sources.list, then sources.list.d/ by name."""
    files = [etc_apt / "sources.list"]
    parts = etc_apt / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    out: list[AptSource] = []
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        out += parse_deb822(text, str(f)) if f.suffix == ".sources" else parse_one_line(text, str(f))
    return out


def debian_mirror(etc_apt: Path = Path("/etc/apt")) -> AptSource:
    """The first Debian binary mirror in the machine's apt configuration; Unavailable if none."""
    for src in read_apt_sources(etc_apt):
        if "deb" in src.types and src.is_debian:
            return src
    raise Unavailable(
        f"no Debian mirror found in {etc_apt}/sources.list or {etc_apt}/sources.list.d/ "
        "(needed to fetch Debian's criu package). Fix: pass a Debian mirror explicitly "
        "(`cutbench criu install --mirror http://<debian mirror>/debian`), or run "
        "`cutbench criu install --download-only DIR` on a Debian machine and `--from DIR` here"
    )


# --------------------------------------------------------------------------- download


def _arch() -> str:
    """The Debian architecture name of this machine (amd64, arm64, ...)."""
    if shutil.which("dpkg"):
        p = _run(["dpkg", "--print-architecture"])
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


def _apt(args: list[str], what: str, *, cwd: Path | None = None, timeout: float = 600) -> str:
    """Run apt-get/apt-cache; a failure raises Unavailable naming the step and apt's own message."""
    p = _run(args, cwd=cwd, timeout=timeout)
    if p.returncode != 0:
        raise Unavailable(f"{what} failed (exit {p.returncode}):\n{tail(p.stderr or p.stdout)}")
    return p.stdout


def resolve_packages(apt_cache_output: str) -> list[str]:
    """Package names from ``apt-cache depends --recurse`` output (virtual ``<pkg>`` entries dropped)."""
    names = {ln.strip() for ln in apt_cache_output.splitlines() if ln and not ln[0].isspace()}
    return sorted(n for n in names if not n.startswith("<"))


@contextmanager
def _apt_session(
    suite: str, mirror: str | None, keyring: str | None, etc_apt: Path, *, sources: bool = False
) -> Iterator[tuple[list[str], str]]:
    """Yield (apt options, "MIRROR SUITE") of a private apt state listing ``suite`` of the mirror, already updated.

    With ``sources`` the state also lists the suite's source packages
    (``deb-src``), for :func:`_download_plugin_source`.
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
    if mirror is None:
        src = debian_mirror(etc_apt)
        mirror, keyring = src.uri, keyring or src.signed_by
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
        _apt(["apt-get", *o, "update"], f"apt-get update from {mirror} {suite} (is the mirror reachable?)")
        yield o, f"{mirror} {suite}"


def download_debs(
    dest: Path,
    *,
    suite: str = DEFAULT_SUITE,
    mirror: str | None = None,
    keyring: str | None = None,
    etc_apt: Path = Path("/etc/apt"),
    cuda_plugin_source: bool = False,
) -> list[Path]:
    """Download ``criu`` and its recursive dependencies from ``suite`` into ``dest``; returns the .deb paths.

    The mirror and keyring come from the machine's apt configuration unless
    given. apt runs with a private state directory, so the host's package
    lists and installed packages are untouched (and root is not needed).
    With ``cuda_plugin_source`` it also fetches what building the CUDA plugin
    offline takes (see :func:`download_plugin_source`): the upstream source of
    that same CRIU and the build-dependency .debs under ``dest/build-deps/``.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with _apt_session(suite, mirror, keyring, etc_apt, sources=cuda_plugin_source) as (o, where):
        deps = _apt(
            ["apt-cache", *o, "depends", "--recurse", "--no-recommends", "--no-suggests",
             "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", PACKAGE],
            f"resolving the dependencies of {PACKAGE} in {suite}",
        )
        packages = resolve_packages(deps)
        if PACKAGE not in packages:
            raise Unavailable(f"{where} has no {PACKAGE} package for {_arch()}")
        before = set(dest.glob("*.deb"))
        _apt(["apt-get", *o, "download", *packages], f"apt-get download of {len(packages)} packages", cwd=dest)
        if cuda_plugin_source:
            shown = _apt(["apt-cache", *o, "show", "--no-all-versions", PACKAGE], f"apt-cache show {PACKAGE}")
            m = re.search(r"^Version:\s*(\S+)", shown, re.M)
            if m is None:
                raise Unavailable(f"apt-cache show {PACKAGE} reports no version:\n{tail(shown)}")
            _download_plugin_source(o, dest, upstream_version(m.group(1)), where)
    debs = sorted(dest.glob("*.deb"))
    if not set(debs) - before and not any(d.name.startswith(PACKAGE + "_") for d in debs):
        raise Unavailable(f"apt-get download wrote no .deb files into {dest}")
    return debs


# --------------------------------------------------------------------------- unpack


def unpack_deb(deb: Path, dest: Path) -> None:
    """Extract a .deb's files into ``dest`` (dpkg-deb when present, else a pure-Python reader)."""
    if shutil.which("dpkg-deb"):
        p = _run(["dpkg-deb", "-x", str(deb), str(dest)], timeout=300)
        if p.returncode != 0:
            raise Unavailable(f"dpkg-deb -x {deb.name} failed: {tail(p.stderr)}")
        return
    _unpack_deb_python(deb, dest)


def _unpack_deb_python(deb: Path, dest: Path) -> None:
    """Read the ar archive by hand and extract data.tar.{xz,gz,bz2,} (hosts without dpkg)."""
    with open(deb, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise Unavailable(f"{deb} is not a .deb (no ar header)")
        while True:
            header = f.read(60)
            if len(header) < 60:
                raise Unavailable(f"{deb} has no data.tar member")
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            if name.startswith("data.tar"):
                data = f.read(size)
                break
            f.seek(size + (size & 1), os.SEEK_CUR)  # ar members are 2-byte aligned
    mode = {"data.tar.xz": "r:xz", "data.tar.gz": "r:gz", "data.tar.bz2": "r:bz2", "data.tar": "r:"}.get(name)
    if mode is None:
        raise Unavailable(f"{deb}: {name} needs dpkg-deb (install dpkg) to unpack")
    import io

    with tarfile.open(fileobj=io.BytesIO(data), mode=mode) as tar:  # type: ignore[call-overload]  # a read mode above
        # The "tar" filter keeps symlinks but refuses paths that escape dest.
        tar.extractall(dest, filter="tar") if hasattr(tarfile, "tar_filter") else tar.extractall(dest)


# --------------------------------------------------------------------------- install


def _write_wrapper(prefix: Path, argv: tuple[str, ...]) -> None:
    """PREFIX/bin/criu: a relocatable wrapper, for tools (docker) that exec `criu` from PATH."""
    root = prefix / "root"
    rel = [str(Path(a).relative_to(root)) if a.startswith(str(root)) else a for a in argv]
    loader, _, lib, criu = rel
    text = (
        "#!/bin/sh\n"
        "# Written by `cutbench criu install`: runs the bundled CRIU through its bundled loader.\n"
        'R="$(dirname "$(readlink -f "$0")")/../root"\n'
        f'exec "$R/{loader}" --library-path "$R/{lib}" "$R/{criu}" "$@"\n'
    )
    (prefix / "bin").mkdir(exist_ok=True)
    w = prefix / "bin" / "criu"
    w.write_text(text)
    w.chmod(0o755)


def install(
    prefix: Path | None = None,
    *,
    download_only: Path | None = None,
    from_dir: Path | None = None,
    suite: str = DEFAULT_SUITE,
    force: bool = False,
    mirror: str | None = None,
    with_cuda_plugin: bool = False,
) -> CriuInstall | None:
    """Provision CRIU >= 4.2; returns the working install (None with ``download_only``).

    - ``download_only=DIR``: only download the .debs into DIR (for an offline machine).
    - ``from_dir=DIR``: unpack the .debs found in DIR, no network.
    - otherwise download into a temporary directory and unpack.
    - ``with_cuda_plugin``: also build CRIU's CUDA plugin (:func:`install_cuda_plugin`);
      with ``download_only`` also download its source and build .debs, with
      ``from_dir`` build from the source found there.

    Idempotent: a working CRIU (bundled under ``prefix`` or >= 4.2 on PATH) is
    returned as is unless ``force``. The new tree is unpacked beside the old
    one and replaces it only after ``criu check`` passes; on failure the
    Unavailable error carries CRIU's output.
    """
    if download_only is not None and from_dir is not None:
        raise InvalidArgument("--download-only and --from exclude each other: pick one")
    if with_cuda_plugin and from_dir is not None:
        # Before any unpacking: a DIR filled without --with-cuda-plugin lacks the source.
        plugin_source_in(from_dir, _deb_upstream_version(from_dir))
    if download_only is not None:
        download_debs(Path(download_only), suite=suite, mirror=mirror, cuda_plugin_source=with_cuda_plugin)
        return None
    prefix = Path(prefix) if prefix is not None else default_prefix()
    result = _install_criu(prefix, from_dir=from_dir, suite=suite, force=force, mirror=mirror)
    if with_cuda_plugin:
        install_cuda_plugin(prefix, result, from_dir=from_dir, suite=suite, mirror=mirror, force=force)
    return result


def _install_criu(prefix: Path, *, from_dir: Path | None, suite: str, force: bool, mirror: str | None) -> CriuInstall:
    """The CRIU part of :func:`install`: reuse a working one unless ``force``, else unpack under the prefix lock."""
    if not force:
        existing = find_criu(prefix)
        if existing is not None:
            return existing

    prefix.mkdir(parents=True, exist_ok=True)
    # Two installs at once (parallel make, two shells) would race on PREFIX/root.
    with open(prefix / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force:
            existing = find_criu(prefix)  # another process may have finished while we waited
            if existing is not None:
                return existing
        return _install_locked(prefix, from_dir=from_dir, suite=suite, mirror=mirror)


def _install_locked(prefix: Path, *, from_dir: Path | None, suite: str, mirror: str | None) -> CriuInstall:
    """The unpack-check-replace part of :func:`install`, run under the prefix lock."""
    with tempfile.TemporaryDirectory(prefix=".staging-", dir=prefix) as tmp_name:
        tmp = Path(tmp_name)
        if from_dir is not None:
            debs = sorted(Path(from_dir).glob("*.deb"))
            if not any(d.name.startswith(PACKAGE + "_") for d in debs):
                raise Unavailable(
                    f"--from {from_dir}: no {PACKAGE}_*.deb there. "
                    "Fix: fill it with `cutbench criu install --download-only DIR` on a machine with network"
                )
            origin = str(from_dir)
        else:
            keyring = None
            if mirror is None:
                src = debian_mirror()
                mirror, keyring = src.uri, src.signed_by
            debs = download_debs(tmp / "debs", suite=suite, mirror=mirror, keyring=keyring)
            origin = f"{mirror} {suite}"
        staged = tmp / "root"
        staged.mkdir()
        for deb in debs:
            unpack_deb(deb, staged)
        argv = _bundled_argv(staged)
        if argv is None:
            raise Unavailable(f"the unpacked packages lack usr/sbin/criu or a dynamic loader ({len(debs)} .debs)")
        version = _version_of(argv)
        if version is None:
            raise Unavailable("the unpacked CRIU does not run (`criu --version` failed through its bundled loader)")
        ok, out = check(CriuInstall(argv, version, "bundled", prefix))
        if not ok:
            raise Unavailable(
                f"CRIU {version} unpacked but `criu check` fails:\n{tail(out)}\n"
                + ("" if os.geteuid() == 0 else "CRIU needs root: run this as root.\n")
                + f"The previous install under {prefix} (if any) is kept."
            )
        # Only now replace the old tree: a failed install never breaks a working one.
        final = prefix / "root"
        if final.exists():
            old = tmp / "old"
            final.rename(old)
        staged.rename(final)
    result = bundled(prefix)
    if result is None:
        raise Unavailable(f"CRIU passed `criu check` in staging but does not run from {prefix / 'root'}")
    _write_wrapper(prefix, result.argv)
    (prefix / "install.json").write_text(json.dumps({
        "version": result.version,
        "from": origin,
        "packages": sorted(d.name for d in debs),
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }, indent=2) + "\n")
    clear_cache()
    return result


# -- CRIU's CUDA plugin (the `criu-cuda-plugin` backend) -----------------------
#
# CRIU's plugins/cuda is CRIUgpu's design: CRIU itself drives NVIDIA's
# cuda-checkpoint utility from plugin hooks (lock before the freeze, checkpoint
# after it, restore and unlock after the restore). Debian builds CRIU without
# it, so it is built here from the upstream source of the installed release.

PLUGIN_ENV = "CUTBENCH_CRIU_PLUGIN_DIR"
PLUGIN = "cuda_plugin.so"
PLUGIN_SUBDIR = Path("lib") / "criu"
# Beside the plugin, never named *.so: CRIU loads every *.so in its --libdir.
PLUGIN_RECORD = "cuda_plugin.json"
PLUGIN_FIX = "run `cutbench criu install --with-cuda-plugin` (builds cuda_plugin.so from CRIU's own source)"
# Beyond a C toolchain, cuda_plugin.c needs one header outside libc, <sys/capability.h>
# (CRIU's cr_options.h includes it). Only the header: the plugin links nothing, its
# symbols resolve against the criu binary that loads it. So the .deb is unpacked into
# the build tree rather than installed: no root needed, and it works offline.
BUILD_DEBS = ("libcap-dev",)
BUILD_DEBS_DIR = "build-deps"
# The compiler must suit this machine's libc, so it comes from the host, not the suite.
TOOLCHAIN = ("gcc", "make", "libc6-dev")
# CRIU's ARCH names (its Makefile's SUBARCH) for os.uname().machine.
CRIU_ARCH = {"x86_64": "x86", "aarch64": "aarch64", "ppc64le": "ppc64", "s390x": "s390", "riscv64": "riscv64"}


def upstream_version(debian_version: str) -> str:
    """The upstream part of a Debian version: ``4.2.1`` from ``4.2.1-1`` or ``1:4.2.1-1+b1``."""
    v = debian_version.split(":", 1)[-1]
    return v.rsplit("-", 1)[0] if "-" in v else v


def installed_plugin_dir(prefix: Path | None = None) -> Path:
    """Where ``cutbench criu install --with-cuda-plugin`` puts the plugin: ``PREFIX/lib/criu``."""
    return (Path(prefix) if prefix is not None else default_prefix()) / PLUGIN_SUBDIR


def plugin_dir(prefix: Path | None = None) -> Path | None:
    """The directory holding the CUDA plugin, for CRIU's ``--libdir``; None when there is none.

    ``$CUTBENCH_CRIU_PLUGIN_DIR`` wins when set (None if it holds no plugin);
    else the one :func:`install_cuda_plugin` put under the prefix.
    """
    value = os.environ.get(PLUGIN_ENV)
    path = Path(value) if value else installed_plugin_dir(prefix)
    return path if (path / PLUGIN).is_file() else None


def plugin_record(directory: Path) -> dict:
    """What :func:`install_cuda_plugin` recorded about the plugin in ``directory`` ({} if nothing)."""
    try:
        return json.loads((Path(directory) / PLUGIN_RECORD).read_text())
    except (OSError, ValueError):
        return {}


def plugin_missing(prefix: Path | None = None) -> tuple[str, str] | None:
    """Why no CUDA plugin is found, and the fix, as ``(problem, fix)``; None once :func:`plugin_dir` finds one."""
    value = os.environ.get(PLUGIN_ENV)
    if plugin_dir(prefix) is not None:
        return None
    if value:
        return f"{PLUGIN_ENV}={value} holds no {PLUGIN}", f"point it at a directory holding {PLUGIN}, or unset it and {PLUGIN_FIX}"
    return (f"no CRIU CUDA plugin: {installed_plugin_dir(prefix) / PLUGIN} is not built and {PLUGIN_ENV} is not set",
            f"{PLUGIN_FIX}, or set {PLUGIN_ENV} to a directory holding {PLUGIN}")


def plugin_unavailable_reason(prefix: Path | None = None) -> str | None:
    """Why the CUDA plugin cannot be used (with the fix), or None."""
    missing = plugin_missing(prefix)
    if missing:
        return f"{missing[0]}. Fix: {missing[1]}"
    found = plugin_dir(prefix)
    assert found is not None  # plugin_missing found it
    if shutil.which("cuda-checkpoint") is None:
        return f"the CRIU CUDA plugin ({found / PLUGIN}) needs NVIDIA's cuda-checkpoint utility on PATH"
    return None


def _deb_upstream_version(directory: Path) -> str | None:
    """The upstream version of the ``criu_*.deb`` in ``directory`` (from its file name), or None."""
    debs = sorted(Path(directory).glob(f"{PACKAGE}_*.deb"))
    return upstream_version(urllib.parse.unquote(debs[-1].name.split("_")[1])) if debs else None


def plugin_source_in(directory: Path, version: str | None = None) -> Path:
    """CRIU's source tarball ``criu_VERSION.orig.tar.*`` in ``directory`` (any version when None).

    Raises Unavailable naming the missing file and how to fill the directory.
    """
    found = sorted(Path(directory).glob(f"{PACKAGE}_{version or '*'}.orig.tar.*"))
    if found:
        return found[-1]
    name = f"{PACKAGE}_{version or '<version>'}.orig.tar.xz"
    raise Unavailable(
        f"--from {directory}: no {name} there (CRIU's source, needed to build {PLUGIN}"
        + (f" for CRIU {version}" if version else "") + "). "
        "Fix: on a machine with network run `cutbench criu install --download-only DIR --with-cuda-plugin`, "
        "copy DIR here, then `cutbench criu install --from DIR --with-cuda-plugin`"
    )


def _download_plugin_source(o: list[str], dest: Path, version: str, where: str) -> Path:
    """Fetch CRIU ``version``'s upstream tarball into ``dest`` and the build .debs into ``dest/build-deps``.

    ``o`` selects a private apt state that lists the suite's sources. Returns the tarball.
    """
    shown = _apt(["apt-cache", *o, "showsrc", "--only-source", PACKAGE], f"apt-cache showsrc {PACKAGE} in {where}")
    versions = re.findall(r"^Version:\s*(\S+)", shown, re.M)
    matching = [v for v in versions if upstream_version(v) == version]
    if not matching:
        raise Unavailable(
            f"{where} has no source of {PACKAGE} {version} (only {', '.join(versions) or 'none'}), so the CUDA "
            f"plugin cannot be built for the installed CRIU {version}. Fix: `cutbench criu install --force "
            "--with-cuda-plugin` installs the suite's current CRIU together with its plugin"
        )
    uris = _apt(["apt-get", *o, "source", "--print-uris", "--only-source", f"{PACKAGE}={matching[0]}"],
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
    _apt([helper, *o, "download-file", uri, str(Path(dest) / name), digest], f"downloading {name} from {where}")
    build = Path(dest) / BUILD_DEBS_DIR
    build.mkdir(parents=True, exist_ok=True)
    _apt(["apt-get", *o, "download", *BUILD_DEBS], f"apt-get download {' '.join(BUILD_DEBS)}", cwd=build)
    return Path(dest) / name


def _missing_toolchain(scratch: Path) -> list[str]:
    """The packages of :data:`TOOLCHAIN` this machine lacks (gcc without libc headers compiles nothing)."""
    missing = [tool for tool in ("gcc", "make") if shutil.which(tool) is None]
    if "gcc" not in missing:
        probe = Path(scratch) / "probe.c"
        probe.write_text("#include <stdio.h>\n#include <sys/ptrace.h>\n#include <linux/types.h>\n")
        if _run(["gcc", "-fsyntax-only", str(probe)]).returncode != 0:
            missing.append("libc6-dev")
    return missing


def _ensure_toolchain(scratch: Path, *, may_install: bool) -> None:
    """Make sure gcc, make and the C headers are there; installs them with the host's apt as root when allowed."""
    missing = _missing_toolchain(scratch)
    if missing and may_install and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "-q", "update"], ["apt-get", "-q", "-y", "install", "--no-install-recommends", *missing]):
            p = _run(argv, timeout=900, env=env)
            if p.returncode != 0:
                raise Unavailable(
                    f"`{' '.join(argv)}` failed (exit {p.returncode}):\n{tail(p.stderr or p.stdout)}\n"
                    f"Fix: install {' '.join(missing)} yourself, then rerun `cutbench criu install --with-cuda-plugin`"
                )
        missing = _missing_toolchain(scratch)
    if missing:
        raise Unavailable(
            f"building {PLUGIN} needs {', '.join(missing)}, missing here"
            + ("" if os.geteuid() == 0 else " (not root, so not installed automatically)") + ". "
            f"Fix: `apt-get install {' '.join(missing)}` as root, then rerun `cutbench criu install --with-cuda-plugin`"
        )


def build_cuda_plugin(tarball: Path, build_debs: Path | None, work: Path) -> Path:
    """Build ``cuda_plugin.so`` from CRIU's source tarball; returns the built file (inside ``work``).

    The tree is unpacked into ``work/<name>-<sha256 prefix>/`` and kept: building
    the same tarball again only reruns make, which finds nothing to do.
    ``build_debs`` holds libcap-dev's .deb for ``<sys/capability.h>``; without
    it the host's own header must be installed.
    """
    machine = os.uname().machine
    arch = CRIU_ARCH.get(machine)
    if arch is None:
        raise Unavailable(f"CRIU's CUDA plugin does not build on {machine} (CRIU supports {', '.join(CRIU_ARCH)})")
    tarball, work = Path(tarball), Path(work)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()[:12]
    key = work / f"{tarball.name.split('.orig.tar')[0]}-{digest}"
    tree = key / "src"
    if not (tree / "plugins" / "cuda" / "Makefile").is_file():
        shutil.rmtree(key, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=work))
        try:
            with tarfile.open(tarball) as tar:
                tar.extractall(staging, filter="tar") if hasattr(tarfile, "tar_filter") else tar.extractall(staging)
            tops = [d for d in staging.iterdir() if (d / "plugins" / "cuda" / "Makefile").is_file()]
            if len(tops) != 1:
                raise Unavailable(f"{tarball} holds no CRIU source tree with plugins/cuda/Makefile")
            key.mkdir(parents=True)
            tops[0].rename(tree)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    env = dict(os.environ)
    debs = sorted(Path(build_debs).glob("libcap-dev_*.deb")) if build_debs is not None else []
    if debs:
        headers = key / BUILD_DEBS_DIR
        if not (headers / "usr" / "include" / "sys" / "capability.h").is_file():
            unpack_deb(debs[-1], headers)
        # gcc searches C_INCLUDE_PATH after -I/-iquote and before the system directories.
        env["C_INCLUDE_PATH"] = os.pathsep.join(filter(None, [str(headers / "usr" / "include"),
                                                              env.get("C_INCLUDE_PATH")]))
    elif not Path("/usr/include/sys/capability.h").is_file():
        raise Unavailable(
            f"no libcap-dev_*.deb in {build_debs} and no <sys/capability.h> on this machine ({PLUGIN} needs it). "
            "Fix: `apt-get install libcap-dev`, or fill DIR with `cutbench criu install --download-only DIR "
            "--with-cuda-plugin`"
        )
    # compel-host is the one part of CRIU the plugin's Makefile runs (`compel includes` for its
    # -I flags); building CRIU itself would need protobuf, libnet and libnl for nothing.
    steps = (["make", "-j", str(os.cpu_count() or 1), "compel/compel-host"], ["make", f"ARCH={arch}", "-C", "plugins/cuda"])
    for argv in steps:
        p = _run(argv, cwd=tree, timeout=600, env=env)
        if p.returncode != 0:
            raise Unavailable(f"`{' '.join(argv)}` in {tree} failed (exit {p.returncode}):\n{tail(p.stdout + p.stderr, 25)}")
    built = tree / "plugins" / "cuda" / PLUGIN
    if not built.is_file():
        raise Unavailable(f"make finished but wrote no {built}")
    return built


def verify_plugin(criu: CriuInstall, libdir: Path) -> list[str]:
    """Prove that ``criu`` loads the plugin in ``libdir``; returns CRIU's log lines about it.

    ``criu check`` loads no plugin (only dump, pre-dump and restore do), and a
    dlopen from Python proves nothing: the plugin's symbols (``opts``, the log,
    the seize helpers) come from the criu binary itself. So the proof is a
    real ``criu dump --libdir`` of a throwaway process: it fails when dlopen or
    CRIU's plugin version check fails, and at ``-v4`` CRIU logs ``Plugin
    "cuda_plugin"`` once it registered the plugin's hooks. ``--leave-running``
    keeps the process alive; it is ours to kill.
    """
    with tempfile.TemporaryDirectory(prefix="cutbench-plugin-check-") as tmp:
        child = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            p = _run(criu.command("dump", "-t", str(child.pid), "-D", tmp, "-o", "dump.log", "-v4",
                                  "--leave-running", "--libdir", str(libdir)), timeout=120)
        finally:
            child.kill()
            child.wait()
        log_file = Path(tmp) / "dump.log"
        log = log_file.read_text(errors="replace") if log_file.is_file() else p.stdout + p.stderr
    lines = [ln for ln in log.splitlines() if "cuda_plugin" in ln]
    if p.returncode != 0 or not any('Plugin "cuda_plugin"' in ln for ln in lines):
        raise Unavailable(
            f"CRIU {criu.version} does not load {Path(libdir) / PLUGIN} (`criu dump --libdir` exit {p.returncode}):\n"
            f"{tail(log)}" + ("" if os.geteuid() == 0 else "\nCRIU needs root: run this as root.")
        )
    return lines


def _plugin_current(directory: Path, criu: CriuInstall) -> bool:
    """Whether ``directory`` holds a plugin this module built for ``criu``'s version."""
    return (directory / PLUGIN).is_file() and plugin_record(directory).get("criu_version") == criu.version


def install_cuda_plugin(
    prefix: Path | None = None,
    criu: CriuInstall | None = None,
    *,
    from_dir: Path | None = None,
    suite: str = DEFAULT_SUITE,
    mirror: str | None = None,
    force: bool = False,
) -> Path:
    """Build CRIU's CUDA plugin for ``criu`` and install it in ``PREFIX/lib/criu``; returns the plugin's path.

    The source is ``criu_<criu.version>.orig.tar.*``: from ``from_dir`` (no
    network), else from ``suite`` of the machine's Debian mirror (or
    ``mirror``). The plugin is proved loadable by ``criu`` (:func:`verify_plugin`)
    before it replaces an older one. A plugin already built for this CRIU
    version is returned as is unless ``force``; the unpacked source stays in
    ``PREFIX/build`` so a forced rebuild of the same release is quick.
    """
    prefix = Path(prefix) if prefix is not None else default_prefix()
    criu = criu if criu is not None else require_criu(prefix)
    dest = installed_plugin_dir(prefix)
    if not force and _plugin_current(dest, criu):
        return dest / PLUGIN
    prefix.mkdir(parents=True, exist_ok=True)
    with open(prefix / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and _plugin_current(dest, criu):  # another process may have built it while we waited
            return dest / PLUGIN
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=".staging-", dir=prefix) as tmp_name:
            tmp = Path(tmp_name)
            if from_dir is not None:
                tarball = plugin_source_in(from_dir, criu.version)
                build_debs, origin = Path(from_dir) / BUILD_DEBS_DIR, str(from_dir)
                _ensure_toolchain(tmp, may_install=False)  # offline: apt could not fetch them
            else:
                _ensure_toolchain(tmp, may_install=True)
                with _apt_session(suite, mirror, None, Path("/etc/apt"), sources=True) as (o, origin):
                    tarball = _download_plugin_source(o, tmp, criu.version, origin)
                build_debs = tmp / BUILD_DEBS_DIR
            built = build_cuda_plugin(tarball, build_debs, prefix / "build")
            trial = tmp / "lib"
            trial.mkdir()
            shutil.copy2(built, trial / PLUGIN)
            verify_plugin(criu, trial)
            dest.mkdir(parents=True, exist_ok=True)
            os.replace(trial / PLUGIN, dest / PLUGIN)  # tmp is under prefix: one file system, an atomic swap
            (dest / PLUGIN_RECORD).write_text(json.dumps({
                "criu_version": criu.version,
                "source": tarball.name,
                "sha256": hashlib.sha256(tarball.read_bytes()).hexdigest(),
                "from": origin,
                "took_s": round(time.monotonic() - t0, 1),  # download, build and check
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }, indent=2) + "\n")
    return dest / PLUGIN

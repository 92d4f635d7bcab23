"""Finding the CRIU to run: the one bundled under the prefix, else ``criu`` on PATH, at least 4.2.

Owns where the prefix is (:func:`default_prefix`), the minimum version, the
probes (``criu --version``, ``criu check``, ``criu check --feature``), the
per-process cache of the CRIU found (:func:`require_criu`) and the message
that says why none was found and how to fix it (:func:`diagnose`).

Must not provision: it never downloads, unpacks, builds or writes anything,
and imports none of the provisioning modules (``install`` and what it uses),
so a trial that only needs CRIU's command line loads none of them.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import cutbench
from cutbench.errors import Unavailable
from cutbench.harness.provision.criu.tools import run, tail

MIN_VERSION = (4, 2)

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

    @property
    def executable(self) -> str:
        """One executable that runs this CRIU, for a program that runs ``criu`` itself (runc from ``PATH``, a job
        script): a bundled one's wrapper ``PREFIX/bin/criu``, else the ``criu`` on ``PATH``."""
        if self.source == "bundled" and self.prefix is not None:
            return str(self.prefix / "bin" / "criu")
        return shutil.which("criu") or self.argv[0]


def default_prefix() -> Path:
    """Where a bundled CRIU lives.

    ``$CUTBENCH_CRIU_PREFIX`` if set; else ``<repo>/.criu`` when running from a
    source checkout (:func:`cutbench.source_checkout`); else
    ``$XDG_DATA_HOME/cutbench/criu`` (``~/.local/share/cutbench/criu``).
    """
    return cutbench.tool_prefix("criu", "CUTBENCH_CRIU_PREFIX")


def prefix_or_default(prefix: Path | str | None) -> Path:
    """Return ``prefix`` as a Path, or :func:`default_prefix` when None: what every ``prefix=None`` argument means."""
    return Path(prefix) if prefix is not None else default_prefix()


def parse_version(text: str) -> tuple[int, ...] | None:
    """Return ``(4, 2, 1)`` from ``criu --version`` output ("Version: 4.2.1"), else None."""
    m = re.search(r"Version:\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def version_of(argv: tuple[str, ...]) -> str | None:
    """The version string a CRIU command line reports (``"4.2.1"``), or None if it does not run."""
    try:
        p = run([*argv, "--version"], timeout=30)
    except Unavailable:
        return None
    v = parse_version(p.stdout + p.stderr)
    return ".".join(map(str, v)) if (p.returncode == 0 and v) else None


def bundled_argv(root: Path) -> tuple[str, ...] | None:
    """The loader command line for a CRIU unpacked under ``root``, or None if criu or the loader is missing."""
    criu = root / "usr" / "sbin" / "criu"
    loaders = sorted(root.glob("usr/lib/*/ld-linux*.so.*"))
    if not criu.is_file() or not loaders:
        return None
    loader = loaders[0]
    return (str(loader), "--library-path", str(loader.parent), str(criu))


def bundled(prefix: Path | None = None) -> CriuInstall | None:
    """The CRIU unpacked under ``prefix`` if it exists and reports a version (no ``criu check``), else None."""
    prefix = prefix_or_default(prefix)
    argv = bundled_argv(prefix / "root")
    if argv is None:
        return None
    version = version_of(argv)
    return CriuInstall(argv, version, "bundled", prefix) if version else None


def on_path() -> CriuInstall | None:
    """Return ``criu`` on PATH with its version (any version, no ``criu check``), or None."""
    exe = shutil.which("criu")
    if exe is None:
        return None
    version = version_of((exe,))
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
        p = run(install.command("check"), timeout=60)
    except Unavailable as e:
        return False, str(e)
    out = (p.stdout + p.stderr).strip()
    return (p.returncode == 0 and "Looks good" in out), out


def check_feature(install: CriuInstall, feature: str) -> bool:
    """Whether ``criu check --feature FEATURE`` says it is supported (e.g. ``network_lock_nftables``)."""
    try:
        p = run(install.command("check", "--feature", feature), timeout=60)
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
    """Forget what :func:`require_criu` found (after an install); returns nothing."""
    _required.clear()


def require_criu(prefix: Path | None = None) -> CriuInstall:
    """A working CRIU >= 4.2, cached per process; raises Unavailable saying what is wrong and the fix."""
    key = prefix_or_default(prefix).resolve()
    if key in _required:
        return _required[key]
    found = find_criu(key)
    if found is not None:
        _required[key] = found
        return found
    raise Unavailable(diagnose(key))


def diagnose(prefix: Path | None = None) -> str:
    """Why no usable CRIU was found: every problem seen, ending with the fix (:data:`FIX`)."""
    prefix = prefix_or_default(prefix)
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

"""Building CRIU's CUDA plugin, ``cuda_plugin.so``, and installing it in ``PREFIX/lib/criu``.

Debian's package ships no CUDA plugin, so :func:`install_cuda_plugin` builds it
from the upstream source of the same CRIU release: the
``criu_<version>.orig.tar.*`` in the same mirror and suite (found with
``apt-get source --print-uris``, fetched and hash-checked by ``apt-helper``:
``fetch.download_plugin_source``), or in a ``--from DIR``.

Owns the C toolchain check, the build (unpacked source kept under
``PREFIX/build``), the proof that CRIU loads the result (:func:`verify_plugin`)
and the plugin's record. Must not decide where a run finds the plugin: that
is ``plugin.plugin_dir``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from cutbench.errors import Unavailable
from cutbench.harness.provision.criu.fetch import BUILD_DEBS_DIR, DEFAULT_SUITE, PACKAGE, apt_session, download_plugin_source
from cutbench.harness.provision.criu.locate import CriuInstall, prefix_or_default, require_criu
from cutbench.harness.provision.criu.plugin import PLUGIN, PLUGIN_RECORD, installed_plugin_dir, plugin_record
from cutbench.harness.provision.criu.prefix import provision, swap_in, write_record
from cutbench.harness.provision.criu.tools import run, tail
from cutbench.harness.provision.criu.unpack import extract_tar, unpack_deb

# The compiler must suit this machine's libc, so it comes from the host, not the suite.
TOOLCHAIN = ("gcc", "make", "libc6-dev")
# CRIU's ARCH names (its Makefile's SUBARCH) for os.uname().machine.
CRIU_ARCH = {"x86_64": "x86", "aarch64": "aarch64", "ppc64le": "ppc64", "s390x": "s390", "riscv64": "riscv64"}


def plugin_source_in(directory: Path, version: str | None = None) -> Path:
    """CRIU's source tarball ``criu_VERSION.orig.tar.*`` in ``directory`` (any version when None); returns its path.

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


def _missing_toolchain(scratch: Path) -> list[str]:
    """The packages of :data:`TOOLCHAIN` this machine lacks (gcc without libc headers compiles nothing)."""
    missing = [tool for tool in ("gcc", "make") if shutil.which(tool) is None]
    if "gcc" not in missing:
        probe = Path(scratch) / "probe.c"
        probe.write_text("#include <stdio.h>\n#include <sys/ptrace.h>\n#include <linux/types.h>\n")
        if run(["gcc", "-fsyntax-only", str(probe)]).returncode != 0:
            missing.append("libc6-dev")
    return missing


def _ensure_toolchain(scratch: Path, *, may_install: bool) -> None:
    """Make sure gcc, make and the C headers are there; installs them with the host's apt as root when allowed."""
    missing = _missing_toolchain(scratch)
    if missing and may_install and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "-q", "update"], ["apt-get", "-q", "-y", "install", "--no-install-recommends", *missing]):
            p = run(argv, timeout=900, env=env)
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


def _source_tree(tarball: Path, work: Path) -> tuple[Path, Path]:
    """``(key, tree)``: CRIU's source from ``tarball`` unpacked at ``work/<name>-<sha256 prefix>/src``.

    An earlier unpacking of the same tarball is reused as it is (make then
    finds its objects up to date); a half-made one is replaced.
    """
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()[:12]
    key = work / f"{tarball.name.split('.orig.tar')[0]}-{digest}"
    tree = key / "src"
    if not (tree / "plugins" / "cuda" / "Makefile").is_file():
        shutil.rmtree(key, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=work))
        try:
            with tarfile.open(tarball) as tar:
                extract_tar(tar, staging)
            tops = [d for d in staging.iterdir() if (d / "plugins" / "cuda" / "Makefile").is_file()]
            if len(tops) != 1:
                raise Unavailable(f"{tarball} holds no CRIU source tree with plugins/cuda/Makefile")
            key.mkdir(parents=True)
            tops[0].rename(tree)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return key, tree


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
    key, tree = _source_tree(Path(tarball), Path(work))
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
        p = run(argv, cwd=tree, timeout=600, env=env)
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
            p = run(criu.command("dump", "-t", str(child.pid), "-D", tmp, "-o", "dump.log", "-v4",
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
    prefix = prefix_or_default(prefix)
    target = criu if criu is not None else require_criu(prefix)
    dest = installed_plugin_dir(prefix)

    def current() -> Path | None:
        """The installed plugin if this module built it for ``target``'s version, else None."""
        fresh = (dest / PLUGIN).is_file() and plugin_record(dest).get("criu_version") == target.version
        return dest / PLUGIN if fresh else None

    def build(staging: Path) -> Path:
        """Fetch or find the source, build, prove, swap in and record; returns the installed plugin."""
        t0 = time.monotonic()
        if from_dir is not None:
            tarball = plugin_source_in(from_dir, target.version)
            build_debs, origin = Path(from_dir) / BUILD_DEBS_DIR, str(from_dir)
            _ensure_toolchain(staging, may_install=False)  # offline: apt could not fetch them
        else:
            _ensure_toolchain(staging, may_install=True)
            with apt_session(suite, mirror, None, Path("/etc/apt"), sources=True) as (o, origin):
                tarball = download_plugin_source(o, staging, target.version, origin)
            build_debs = staging / BUILD_DEBS_DIR
        built = build_cuda_plugin(tarball, build_debs, prefix / "build")
        trial = staging / "lib"
        trial.mkdir()
        shutil.copy2(built, trial / PLUGIN)
        verify_plugin(target, trial)
        dest.mkdir(parents=True, exist_ok=True)
        swap_in(trial / PLUGIN, dest / PLUGIN, staging)
        write_record(dest / PLUGIN_RECORD, {
            "criu_version": target.version,
            "source": tarball.name,
            "sha256": hashlib.sha256(tarball.read_bytes()).hexdigest(),
            "from": origin,
            "took_s": round(time.monotonic() - t0, 1),  # download, build and check
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        })
        return dest / PLUGIN

    return provision(prefix, current, build, force=force)

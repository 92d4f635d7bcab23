"""``cutbench criu install``: provision CRIU >= 4.2 into a prefix (and, when asked, its CUDA plugin).

Owns the command's modes (download only, ``--from DIR``, download and
unpack), the checks it makes before touching the prefix, the unpacked tree's
``criu check`` before it replaces a working one, ``PREFIX/bin/criu`` and
``PREFIX/install.json``. Must not parse apt, download, unpack or build itself:
``fetch``, ``unpack`` and ``plugin_build`` do, under ``prefix``'s lock.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from pathlib import Path

from cutbench.errors import InvalidArgument, Unavailable
from cutbench.harness.provision.criu.apt import mirror_and_keyring, upstream_version
from cutbench.harness.provision.criu.fetch import DEFAULT_SUITE, PACKAGE, download_debs
from cutbench.harness.provision.criu.locate import (
    CriuInstall,
    bundled,
    bundled_argv,
    check,
    clear_cache,
    find_criu,
    prefix_or_default,
    version_of,
)
from cutbench.harness.provision.criu.plugin_build import install_cuda_plugin, plugin_source_in
from cutbench.harness.provision.criu.prefix import provision, swap_in, write_record, write_wrapper
from cutbench.harness.provision.criu.tools import tail
from cutbench.harness.provision.criu.unpack import unpack_deb


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
    - ``with_cuda_plugin``: also build CRIU's CUDA plugin
      (``plugin_build.install_cuda_plugin``); with ``download_only`` also
      download its source and build .debs, with ``from_dir`` build from the
      source found there.

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
    prefix = prefix_or_default(prefix)
    result = provision(
        prefix,
        lambda: find_criu(prefix),
        lambda staging: _stage_and_swap(prefix, staging, from_dir=from_dir, suite=suite, mirror=mirror),
        force=force,
    )
    if with_cuda_plugin:
        install_cuda_plugin(prefix, result, from_dir=from_dir, suite=suite, mirror=mirror, force=force)
    return result


def _deb_upstream_version(directory: Path) -> str | None:
    """The upstream version of the ``criu_*.deb`` in ``directory`` (from its file name), or None."""
    debs = sorted(Path(directory).glob(f"{PACKAGE}_*.deb"))
    return upstream_version(urllib.parse.unquote(debs[-1].name.split("_")[1])) if debs else None


def _stage_and_swap(prefix: Path, staging: Path, *, from_dir: Path | None, suite: str, mirror: str | None) -> CriuInstall:
    """Unpack the .debs in ``staging``, check the CRIU there, swap it in as ``PREFIX/root``; returns it, run from there.

    Runs under the prefix's lock (``prefix.provision``).
    """
    if from_dir is not None:
        debs = sorted(Path(from_dir).glob("*.deb"))
        if not any(d.name.startswith(PACKAGE + "_") for d in debs):
            raise Unavailable(
                f"--from {from_dir}: no {PACKAGE}_*.deb there. "
                "Fix: fill it with `cutbench criu install --download-only DIR` on a machine with network"
            )
        origin = str(from_dir)
    else:
        # Looked up here, not left to download_debs, because install.json names the mirror used.
        mirror, keyring = mirror_and_keyring(mirror, None)
        debs = download_debs(staging / "debs", suite=suite, mirror=mirror, keyring=keyring)
        origin = f"{mirror} {suite}"
    staged = staging / "root"
    staged.mkdir()
    for deb in debs:
        unpack_deb(deb, staged)
    argv = bundled_argv(staged)
    if argv is None:
        raise Unavailable(f"the unpacked packages lack usr/sbin/criu or a dynamic loader ({len(debs)} .debs)")
    version = version_of(argv)
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
    swap_in(staged, prefix / "root", staging)
    result = bundled(prefix)
    if result is None:
        raise Unavailable(f"CRIU passed `criu check` in staging but does not run from {prefix / 'root'}")
    _write_wrapper(prefix, result.argv)
    write_record(prefix / "install.json", {
        "version": result.version,
        "from": origin,
        "packages": sorted(d.name for d in debs),
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })
    clear_cache()
    return result


def _write_wrapper(prefix: Path, argv: tuple[str, ...]) -> None:
    """PREFIX/bin/criu: a relocatable wrapper, for tools (docker) that exec `criu` from PATH."""
    root = prefix / "root"
    loader, _, lib, criu = (str(Path(a).relative_to(root)) if a.startswith(str(root)) else a for a in argv)
    write_wrapper(prefix / "bin" / "criu", loader=loader, libraries=[lib], program=criu, what="cutbench criu install")

"""Slurm carried to a machine that has none: Debian's packages unpacked into a prefix, run through their own loader.

``cutbench slurm install`` does for Slurm what ``cutbench criu install`` does for CRIU, with its pieces (``fetch``,
``unpack``, ``prefix``): Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` of :data:`DEFAULT_SUITE`
(the release the project's cluster is measured with) and every library they need, downloaded with apt
(``--download-only DIR`` on a machine with network), unpacked into a prefix (``--from DIR`` on one without), each
program run through the packages' own dynamic loader::

    PREFIX/root/lib/<triple>/ld-linux-*.so.* --library-path <the packages' library folders> PREFIX/root/usr/sbin/slurmd-wlm

so nothing is taken from the host's libc or libraries, and a host without Debian's (a GPU machine's Ubuntu, say)
runs the same Slurm as the project's tests. ``--library-path`` (unlike ``LD_LIBRARY_PATH``) does not leak into what
Slurm executes: the job scripts and their programs run with the host's own libraries.

Prefix layout::

    PREFIX/root/          the unpacked .debs
    PREFIX/bin/<program>  a relocatable wrapper for each of :data:`PROGRAMS` (the cluster puts PREFIX/bin on PATH)
    PREFIX/install.json   what was installed, from where

Debian installs ``slurmd``, ``slurmctld`` and ``slurmstepd`` as alternatives of ``*-wlm`` files, made by maintainer
scripts that unpacking does not run: the wrappers name the real files. The binaries' built-in paths point into
``/usr``: the local cluster (:mod:`cutbench.harness.provision.slurm`) tells ``slurm.conf`` the bundle's
``PluginDir`` and ``slurmd`` its ``slurmstepd`` (``-d``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import cutbench
from cutbench.errors import InvalidArgument, Unavailable

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
# Slurm 22.05, the one `make test`'s cluster runs (Debian 12's): its configuration and its measured behaviour hold.
DEFAULT_SUITE = "bookworm"
PREFIX_ENV = "CUTBENCH_SLURM_PREFIX"
# Each program the cluster and its job scripts run, by the file Debian's packages hold it in.
PROGRAMS = {
    "munged": "usr/sbin/munged",
    "slurmctld": "usr/sbin/slurmctld-wlm",
    "slurmd": "usr/sbin/slurmd-wlm",
    "slurmstepd": "usr/sbin/slurmstepd-wlm",
    **{client: f"usr/bin/{client}" for client in
       ("sbatch", "srun", "salloc", "squeue", "scontrol", "scancel", "sinfo", "sacct", "sstat")},
}
FIX = ("run `cutbench slurm install` (Debian's Slurm into a prefix); on a machine without network run "
       "`cutbench slurm install --download-only DIR` elsewhere, copy DIR over, then `cutbench slurm install --from DIR`")


@dataclass(frozen=True)
class SlurmBundle:
    """A Slurm unpacked under ``prefix`` by ``cutbench slurm install``."""

    prefix: Path
    version: str

    @property
    def bin_dir(self) -> Path:
        """The folder of its wrappers, one per program (on PATH, they are the cluster's ``sbatch``, ``slurmd``…)."""
        return self.prefix / "bin"

    @property
    def plugin_dir(self) -> Path:
        """Its plugins (``PluginDir`` in ``slurm.conf``: the binaries' built-in one is under ``/usr``)."""
        return next(iter(sorted((self.prefix / "root").glob("usr/lib/*/slurm-wlm"))), self.prefix / "root")

    @property
    def stepd(self) -> Path:
        """Its ``slurmstepd`` (``slurmd -d``: the built-in one is ``/usr/sbin/slurmstepd``)."""
        return self.bin_dir / "slurmstepd"


def default_prefix() -> Path:
    """Where a bundled Slurm lives: ``$CUTBENCH_SLURM_PREFIX``, else ``<checkout>/.slurm`` in a source checkout,
    else ``$XDG_DATA_HOME/cutbench/slurm``."""
    return cutbench.tool_prefix("slurm", PREFIX_ENV)


def bundled(prefix: Path | None = None) -> SlurmBundle | None:
    """The Slurm installed under ``prefix`` (default :func:`default_prefix`), or None where none is. Runs nothing:
    a complete install (its record and every wrapper) is taken as working, as the install checked it."""
    prefix = Path(prefix) if prefix is not None else default_prefix()
    try:
        record = json.loads((prefix / "install.json").read_text())
    except (OSError, ValueError):
        return None
    if not all((prefix / "bin" / name).is_file() for name in PROGRAMS):
        return None
    return SlurmBundle(prefix, str(record.get("version", "?")))


def install(
    prefix: Path | None = None,
    *,
    download_only: Path | None = None,
    from_dir: Path | None = None,
    suite: str = DEFAULT_SUITE,
    force: bool = False,
    mirror: str | None = None,
) -> SlurmBundle | None:
    """Provision a bundled Slurm; returns it (None with ``download_only``, which only fills that folder with the
    .debs). ``from_dir``: unpack the .debs there, no network; else download them first. An install already there is
    returned as is unless ``force``. The new tree replaces the old only once its ``slurmd -V`` runs; a
    failure raises :class:`Unavailable` with what it said, the old install kept."""
    # Imported here: a trial finds the bundle (bundled()) without loading apt's or the prefix's code.
    from cutbench.harness.provision.criu.fetch import download_debs
    from cutbench.harness.provision.criu.prefix import provision

    if download_only is not None and from_dir is not None:
        raise InvalidArgument("--download-only and --from exclude each other: pick one")
    if download_only is not None:
        download_debs(Path(download_only), suite=suite, mirror=mirror, packages=PACKAGES)
        return None
    prefix = Path(prefix) if prefix is not None else default_prefix()
    return provision(prefix, lambda: bundled(prefix),
                     lambda staging: _stage_and_swap(prefix, staging, from_dir, suite, mirror), force=force)


def _stage_and_swap(prefix: Path, staging: Path, from_dir: Path | None, suite: str, mirror: str | None) -> SlurmBundle:
    """Unpack the .debs in ``staging``, write the wrappers, check them, swap both in; returns the bundle."""
    from cutbench.harness.provision.criu.apt import mirror_and_keyring
    from cutbench.harness.provision.criu.fetch import download_debs
    from cutbench.harness.provision.criu.prefix import write_record
    from cutbench.harness.provision.criu.tools import run, tail
    from cutbench.harness.provision.criu.unpack import unpack_deb

    if from_dir is not None:
        debs = sorted(Path(from_dir).glob("*.deb"))
        missing = [name for name in PACKAGES if not any(d.name.startswith(name + "_") for d in debs)]
        if missing:
            raise Unavailable(f"--from {from_dir}: no {', '.join(f'{m}_*.deb' for m in missing)} there. Fix: fill it "
                              "with `cutbench slurm install --download-only DIR` on a machine with network")
        origin = str(from_dir)
    else:
        mirror, keyring = mirror_and_keyring(mirror, None)
        debs = download_debs(staging / "debs", suite=suite, mirror=mirror, keyring=keyring, packages=PACKAGES)
        origin = f"{mirror} {suite}"
    root = staging / "root"
    root.mkdir()
    for deb in debs:
        unpack_deb(deb, root)
    _write_wrappers(root, staging / "bin")
    said = run([str(staging / "bin" / "slurmd"), "-V"], timeout=60)  # the clients need a cluster to say it
    version = said.stdout.strip().split()[-1] if said.returncode == 0 and said.stdout.strip() else None
    if version is None:
        raise Unavailable(f"the unpacked Slurm does not run (`slurmd -V` through its bundled loader, exit "
                          f"{said.returncode}):\n{tail(said.stderr or said.stdout)}\nThe install under {prefix} (if "
                          "any) is kept.")
    for part in ("root", "bin"):  # the old ones into staging, which provision() removes
        if (prefix / part).exists():
            (prefix / part).rename(staging / f"old-{part}")
        os.replace(staging / part, prefix / part)
    write_record(prefix / "install.json", {
        "version": version, "from": origin, "packages": sorted(d.name for d in debs),
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })
    found = bundled(prefix)
    if found is None:
        raise Unavailable(f"the Slurm installed under {prefix} is incomplete (a wrapper in {prefix / 'bin'} missing)")
    return found


def _write_wrappers(root: Path, bin_dir: Path) -> None:
    """``bin_dir/<program>`` for each of :data:`PROGRAMS`: runs it from ``root`` (found beside ``bin_dir``, so the
    prefix may move) through the bundled loader; returns nothing. Raises :class:`Unavailable` naming what the
    packages lack."""
    from cutbench.harness.provision.criu.prefix import write_wrapper

    loaders = sorted(root.glob("lib/*/ld-linux*.so.*")) + sorted(root.glob("usr/lib/*/ld-linux*.so.*"))
    absent = [path for path in PROGRAMS.values() if not (root / path).is_file()]
    if not loaders or absent:
        raise Unavailable(f"the unpacked packages lack {', '.join(absent) or 'a dynamic loader'}")
    loader = loaders[0].relative_to(root)
    triple = loader.parent.name
    libraries = [f"lib/{triple}", f"usr/lib/{triple}", f"usr/lib/{triple}/slurm-wlm"]
    for name, path in PROGRAMS.items():
        write_wrapper(bin_dir / name, loader=str(loader), libraries=libraries, program=path,
                      what="cutbench slurm install")

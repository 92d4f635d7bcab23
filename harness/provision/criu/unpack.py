"""Unpacking archives: a .deb's files (with dpkg-deb, or by hand where there is none) and tarballs.

Owns the one safe tar extraction (:func:`extract_tar`) both a .deb's
``data.tar`` and CRIU's source tarball go through. Must not decide where
things go or whether they are complete: callers give the destination and
check what landed there.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

from cutbench.errors import Unavailable
from cutbench.harness.provision.criu.tools import run, tail


def extract_tar(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract every member of ``tar`` into ``dest``; returns nothing.

    The "tar" filter keeps symlinks (a CRIU tree and its libraries need them)
    but refuses paths that escape ``dest``; a Python without extraction
    filters (before 3.11.4) extracts as it always did.
    """
    tar.extractall(dest, filter="tar") if hasattr(tarfile, "tar_filter") else tar.extractall(dest)


def unpack_deb(deb: Path, dest: Path) -> None:
    """Extract a .deb's files into ``dest`` (dpkg-deb when present, else a pure-Python reader); returns nothing."""
    if shutil.which("dpkg-deb"):
        p = run(["dpkg-deb", "-x", str(deb), str(dest)], timeout=300)
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
    with tarfile.open(fileobj=io.BytesIO(data), mode=mode) as tar:  # type: ignore[call-overload]  # a read mode above
        extract_tar(tar, dest)

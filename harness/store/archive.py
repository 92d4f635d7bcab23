"""The trial archive: a run's per-trial records packed into one compressed file, ``trials.tar.xz``.

A run writes one JSON file per trial (``trials/<id>.json``) and per
recorded reference (``references/<key>.json``); ``cutbench pack``
(:mod:`~cutbench.harness.store.pack`) moves them into this archive, and
:class:`~cutbench.harness.store.rundir.RunDir` reads a record from the
archive exactly as from its file. This module owns the format only: which
members an archive may hold, reading them back (a damaged archive raises
:class:`~cutbench.errors.InvalidArgument` naming it), and writing one
atomically. It does not know what a record holds and removes nothing.

The archive is a tar file compressed with xz (LZMA, the standard library's
``tarfile`` and ``lzma``): on the committed reference runs, 1,735 records of
6.8 MB pack into 250 kB with xz against 330 kB with gzip at level 9. The same
records always give the same bytes (members in plan order, no time stamps
or owners), so packing a run again changes nothing.
"""

from __future__ import annotations

import io
import lzma
import os
import tarfile
from pathlib import Path

from cutbench.errors import InvalidArgument
from cutbench.files import atomic_open

# The archive's name in a run directory, and the folders whose records it holds (``<folder>/<name>.json``).
ARCHIVE = "trials.tar.xz"
FOLDERS = ("trials", "references")


def member_order(name: str) -> tuple[int, int, str]:
    """Sort key of a member: trials first, in plan order (t0001 … t9999, then t10000 …), then references."""
    folder, _, file = name.partition("/")
    return FOLDERS.index(folder) if folder in FOLDERS else len(FOLDERS), len(file), file


def _check_name(archive: Path, name: str) -> None:
    folder, _, file = name.partition("/")
    if folder not in FOLDERS or not file.endswith(".json") or "/" in file or file.startswith("."):
        raise InvalidArgument(f"{archive}: holds {name!r}, which is not a trial or reference record "
                              "(trials/<id>.json or references/<key>.json): a damaged or foreign archive")


def read(archive: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every member of ``archive`` by name (``trials/t0001.json``) with its bytes, in :func:`member_order`.

    :class:`InvalidArgument` naming the archive when it is not a readable
    xz-compressed tar file (truncated, corrupt, empty), or holds anything but
    regular ``trials/*.json`` and ``references/*.json`` files, or one twice.
    """
    path = Path(archive)
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:xz") as tar:
            for info in tar:
                _check_name(path, info.name)
                if not info.isfile():
                    raise InvalidArgument(f"{path}: member {info.name!r} is not a regular file (a damaged or foreign archive)")
                if info.name in members:
                    raise InvalidArgument(f"{path}: holds {info.name!r} twice (a damaged archive)")
                fh = tar.extractfile(info)
                assert fh is not None  # a regular file always has content
                members[info.name] = fh.read()
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as exc:
        raise InvalidArgument(f"{path}: not a readable trial archive ({type(exc).__name__}: {exc}); "
                              "a damaged run directory") from None
    return dict(sorted(members.items(), key=lambda item: member_order(item[0])))


def write(archive: str | os.PathLike[str], members: dict[str, bytes]) -> Path:
    """Write ``members`` (name: bytes) as the xz-compressed tar file ``archive``, atomically; return its path.

    Reproducible: members in :func:`member_order`, time stamp 0, no owner,
    mode 0644. Readers see the old archive or the new one, never a torn one.
    """
    path = Path(archive)
    for name in members:
        _check_name(path, name)
    with atomic_open(path, "wb") as fh, tarfile.open(fileobj=fh, mode="w:xz", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members, key=member_order):
            data = members[name]
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return path

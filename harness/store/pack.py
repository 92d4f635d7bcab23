"""Packing a run directory in place: its per-trial records into one ``trials.tar.xz`` (``cutbench pack``).

A run keeps one JSON file per trial and per recorded reference; nobody reads
them one by one, and a run of hundreds of trials is hundreds of small files.
:func:`pack` checks the run as every reader does (:func:`~cutbench.harness.store.analysis.check_run`),
writes every record into the archive (:mod:`~cutbench.harness.store.archive`, atomically),
reads the archive back and compares it byte for byte, and only then removes the
loose files. Tables, ``run.toml``, the summary, plots and report stay as they
are; every reader reads a packed run as it read the files.

A damaged run is refused with :class:`~cutbench.errors.InvalidArgument` naming
the file, and nothing is changed. Packing a packed run changes nothing; a packed
run that gained loose records (resumed after packing, or a pack interrupted
before its removals) is packed again with them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutbench.errors import InvalidArgument
from cutbench.harness.store import archive as _archive
from cutbench.harness.store.analysis import check_run
from cutbench.harness.store.rundir import RunDir


@dataclass(frozen=True)
class Packed:
    """What :func:`pack` did to one run directory."""

    run_dir: Path
    archive: Path
    records: int  # records the archive holds
    moved: int  # loose files this call packed and removed (0: the run was already packed, or has no record)
    loose_bytes: int  # their size
    archive_bytes: int  # the archive's size (0: none)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``cutbench pack --json`` prints)."""
        return {"run_dir": str(self.run_dir), "archive": str(self.archive) if self.archive_bytes else None,
                "records": self.records, "moved": self.moved, "loose_bytes": self.loose_bytes,
                "archive_bytes": self.archive_bytes}

    def text(self) -> str:
        """One line for the terminal."""
        if not self.records:
            return f"{self.run_dir}: no trial or reference records to pack"
        if not self.moved:
            return f"{self.archive}: already packed ({self.records} records, {self.archive_bytes:,} bytes); nothing to do"
        return (f"{self.archive}: {self.moved} files ({self.loose_bytes:,} bytes) packed into {self.archive_bytes:,} bytes, "
                f"{self.records} records in all; the loose files are removed")


def pack(path: str | Path) -> Packed:
    """Pack the run directory at ``path`` in place; return what was done (see the module's docstring).

    Raises :class:`InvalidArgument` naming the file when the run is damaged
    (a table, a record, the archive, ``run.toml``) or still being written
    (``status = "running"``); the directory is then left as it was.
    """
    run = RunDir.open(path)
    if run.meta().get("status") == "running":
        raise InvalidArgument(f"{run.path / 'run.toml'}: status 'running': a harness is writing this run, or was "
                              f"killed (then `cutbench run --resume {run.path}` finishes it); pack it once it ends")
    check_run(run)  # every table, record and the archive, named when damaged: nothing written yet
    members = {f"{folder}/{name}": raw for folder in _archive.FOLDERS
               for name, (_, raw) in run.record_files(folder).items()}
    run.references()  # a damaged recorded reference is refused too
    loose = run.loose_records()
    archive = run.archive_path
    if loose:
        _archive.write(archive, members)
        if _archive.read(archive) != members:  # never remove a file the archive does not give back whole
            raise InvalidArgument(f"{archive}: does not read back as the {len(members)} records written into it; "
                                  "the loose files are kept")
        for p in loose:
            p.unlink()
        for folder in _archive.FOLDERS:
            with contextlib.suppress(OSError):  # kept when something else is in it (or never made)
                (run.path / folder).rmdir()
    return Packed(run.path, archive, len(members), len(loose), sum(len(members[f"{p.parent.name}/{p.name}"]) for p in loose),
                  archive.stat().st_size if archive.exists() else 0)

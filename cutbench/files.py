"""Atomic file writes: a reader sees the old content or the new, never a torn file.

One writer for every write-then-rename in cutbench (results, reports,
workload state and markers, the receiver's ready file). The temporary file is
a sibling of the target (a rename never crosses file systems) named after
the writing process, and it is closed before the rename, so no file stays
open across a cut.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from cutbench.errors import InvalidArgument


def _tmp(path: Path) -> Path:
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb", *, durable: bool = False) -> Iterator[IO[Any]]:
    """A file to write ``path``'s new content into; it replaces ``path`` when the block ends without error.

    ``durable``: fsync before the rename (markers a restore relies on). On an
    error the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    try:
        with open(tmp, mode) as fh:
            yield fh
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, durable: bool = False) -> Path:
    """Replace ``path`` with ``data`` (text or bytes) atomically; return the path."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", durable=durable) as fh:
        fh.write(data)
    return Path(path)


# A number a process keeps in a file and rewrites as it runs (a commit marker, an
# input cursor) is one fixed-width record rewritten in place. Why not
# write-then-rename: a process dumped inside the write holds the temporary file
# open, and after ``leave_running`` the original renames it away, so CRIU cannot
# restore the copy ("can't open file"). In place, the only path ever open is the
# file itself, and its size never changes (CRIU also refuses a file that grew).
NUMBER_WIDTH = 20


def write_number(path: str | os.PathLike[str], value: int, *, durable: bool = False) -> None:
    """Record integer ``value`` in ``path``: one fixed-width ``pwrite`` at offset 0 (then fsync if ``durable``).

    A 20-byte write at offset 0 is never seen half done by a later reader, and
    a process killed around it leaves the old or the new number. The first
    write creates the file whole, by rename; create it beforehand (with this
    function) where even that one rename must not meet a cut.
    """
    record = f"{int(value):>{NUMBER_WIDTH}d}"
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        atomic_write(path, record, durable=durable)
        return
    try:
        os.pwrite(fd, record.encode(), 0)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def overwrite_durably(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` over ``path`` in place (created if absent), cut to its length, then fsync: a workload's own
    checkpoint record. Never a second path: a cut inside the write leaves no renamed-away file for a restore to
    miss."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def read_number(path: str | os.PathLike[str]) -> int:
    """The integer :func:`write_number` keeps in ``path``; 0 when there is none."""
    try:
        return int(Path(path).read_text().strip() or 0)
    except FileNotFoundError:
        return 0


def atomic_symlink(target: str, link: str | os.PathLike[str]) -> None:
    """Point symlink ``link`` at ``target`` in one step (a reader never finds it missing)."""
    link = Path(link)
    tmp = _tmp(link)
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def read_document(path: str | os.PathLike[str], parse: Any, *, what: str, fmt: str, errors: tuple[type[Exception], ...]) -> Any:
    """Return ``parse(text of path)``; a missing file or a parse error (one of ``errors``) raises
    :class:`~cutbench.errors.InvalidArgument` naming ``what`` (e.g. "scenario file") and the path."""
    try:
        return parse(Path(path).read_text())
    except FileNotFoundError:
        raise InvalidArgument(f"{what} {str(path)!r} does not exist") from None
    except errors as exc:
        raise InvalidArgument(f"{what} {str(path)!r} is not valid {fmt}: {exc}") from None

"""The harness's own storage: whether a directory it writes can take what it will write, and whether a
failure was that storage running out.

A full or unwritable images directory, work directory or results directory is the harness's problem,
never a finding about a checkpoint tool: a CRIU dump that fails with "No space left on device" into a
3 MB tmpfs says nothing about CRIU. The runner checks before a run (:func:`room_problem`) and the
nemesis asks of each failed stage (:func:`exhausted`); both name the directory and what it has left.
It must not decide anything else about a stage.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

# Words of the C library's strerror for the errors that mean "this storage is out": what a tool prints.
FULL_WORDS: tuple[str, ...] = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))
FULL_ERRNOS: frozenset[int] = frozenset({errno.ENOSPC, errno.EDQUOT})
# Below this much free space a file system counts as full whatever a tool said: the files a failed dump
# left fill it to the last blocks (they are removed after the stage, so the check is made before).
NEARLY_FULL_BYTES = 1 << 20


def _existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (what a ``mkdir -p`` of ``path`` would write into)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | os.PathLike[str]) -> tuple[int, int]:
    """Return ``(free, total)`` bytes of the file system ``path`` is (or would be made) on."""
    usage = shutil.disk_usage(_existing(Path(path)))
    return usage.free, usage.total


def mib(n: float) -> str:
    """Return ``n`` bytes as mebibytes with one decimal."""
    return f"{n / (1 << 20):.1f} MiB"


def room_problem(path: str | os.PathLike[str], need_bytes: int, what: str) -> str | None:
    """Why directory ``path`` (``what`` it is for, e.g. ``pipeline.images_dir``) cannot take ``need_bytes``:
    not a directory, not writable by this process, or too little free space; None when it can."""
    target = Path(path)
    base = _existing(target)
    if not base.is_dir():
        return f"{what} {target}: {base} is not a directory"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{what} {target}: {base} is not writable by this process (uid {os.getuid()})"
    free, total = free_bytes(base)
    if free < need_bytes:
        return (f"{what} {target} has {mib(free)} free of {mib(total)}, and this run needs at least {mib(need_bytes)} "
                "there: free space, or name a larger directory")
    return None


def exhausted(path: str | os.PathLike[str], words: str = "") -> str | None:
    """Whether a failure whose message is ``words`` was directory ``path``'s storage running out: a sentence
    naming the directory and its free space, else None. Full when its file system has less than
    :data:`NEARLY_FULL_BYTES` left, or the words say "No space left" of a path in it; unwritable when this
    process may not write it."""
    target = Path(path)
    base = _existing(target)
    try:
        free, total = free_bytes(base)
    except OSError:
        return None
    # A tool's "No space left" about another file system (its own staging area) is not the directory's.
    if free < NEARLY_FULL_BYTES or (str(target) in words and any(w in words for w in FULL_WORDS)):
        return f"{target} is full ({mib(free)} free of {mib(total)})"
    if base.is_dir() and not os.access(base, os.W_OK | os.X_OK):
        return f"{target} is not writable by this process (uid {os.getuid()})"
    return None


def is_full_error(exc: BaseException) -> bool:
    """True for an ``OSError`` that is a file system running out of space or quota."""
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS

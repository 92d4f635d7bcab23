"""Changing a prefix: one process at a time, the new thing built beside the old, swapped in only once it works.

Owns the protocol both CRIU's tree (``install``) and the CUDA plugin
(``plugin_build``) are installed by: :func:`provision` (take ``PREFIX/.lock``,
look again for what another process may have finished meanwhile, hand out a
staging directory under the prefix) and :func:`swap_in` (the rename that
replaces the old with the new), how a record of what was installed is
written (:func:`write_record`), and the wrapper that runs a bundled program
through its bundled loader (:func:`write_wrapper`; a carried Slurm's too).

Must not know what is installed: callers say what counts as already there and
how to build it. Where the prefix is: ``locate.default_prefix``.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def provision(prefix: Path, current: Callable[[], T | None], make: Callable[[Path], T], *, force: bool) -> T:
    """What ``current()`` finds, else what ``make(staging)`` builds; returns it.

    Unless ``force``, ``current()`` is asked first, and asked again once
    ``PREFIX/.lock`` is held: two installs at once (parallel make, two shells)
    would race on the prefix, and the one that waited finds the other's work.
    ``make`` runs under the lock with a fresh staging directory under the
    prefix (one file system with what it replaces, so :func:`swap_in` is a
    rename); the directory and whatever was swapped out into it are removed
    afterwards.
    """
    if not force:
        found = current()
        if found is not None:
            return found
    prefix.mkdir(parents=True, exist_ok=True)
    with open(prefix / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force:
            found = current()  # another process may have finished while we waited
            if found is not None:
                return found
        with tempfile.TemporaryDirectory(prefix=".staging-", dir=prefix) as staging:
            return make(Path(staging))


def swap_in(new: Path, final: Path, staging: Path) -> None:
    """Move ``new`` (built in ``staging``) to ``final``, replacing what is there; returns nothing.

    A file is replaced in one atomic rename. A directory cannot be renamed over
    a non-empty one, so the old directory first moves into ``staging``, which
    :func:`provision` removes.
    """
    if new.is_dir() and final.exists():
        final.rename(staging / "old")
    os.replace(new, final)


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` as indented JSON to ``path`` (``install.json``, ``cuda_plugin.json``); returns nothing."""
    path.write_text(json.dumps(record, indent=2) + "\n")


def write_wrapper(path: Path, *, loader: str, libraries: Sequence[str], program: str, what: str) -> None:
    """Write ``path``: a shell wrapper that runs ``program`` through ``loader`` with ``--library-path``
    ``libraries``, each a path under the ``root`` folder beside the wrapper's own (found from the wrapper, so the
    prefix may move); ``what`` names the command that wrote it. Returns nothing."""
    library_path = ":".join(f"$R/{d}" for d in libraries)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\n"
        f"# Written by `{what}`: runs the bundled {path.name} through the bundled loader.\n"
        'R="$(dirname "$(readlink -f "$0")")/../root"\n'
        f'exec "$R/{loader}" --library-path "{library_path}" "$R/{program}" "$@"\n')
    path.chmod(0o755)

"""Running the outside programs the CRIU modules call: criu, apt, dpkg-deb, gcc, make.

Owns the one way this package runs a program (text captured, no stdin, a
time limit) and how much of its output an error message quotes. Must not
judge a result: whether an exit status or an output means success is the
caller's to say.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from cutbench.errors import Unavailable


def run(
    argv: list[str], *, timeout: float = 60, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``argv`` capturing text output; returns the finished process, whatever its exit status.

    A missing program, or one still running after ``timeout`` seconds, raises
    Unavailable: the callers turn every failure into a message with a fix.
    """
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL, env=env
        )
    except FileNotFoundError as e:
        raise Unavailable(f"cannot run {argv[0]}: {e.strerror}") from e
    except subprocess.TimeoutExpired as e:
        raise Unavailable(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from e


def tail(text: str, lines: int = 15) -> str:
    """The last ``lines`` lines of ``text``, stripped: what an error message quotes of a tool's output."""
    return "\n".join(text.strip().splitlines()[-lines:])

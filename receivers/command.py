"""The receiver's command line, defined once for both doors.

``python -m cutbench.receivers serve`` (what ``process.start_receiver`` runs)
and ``cutbench receiver serve`` are the same click command, ``serve_command``:
the options, their help and their checks exist only here. The service itself
is imported when the command runs, so ``cutbench --help`` stays fast.
"""

from __future__ import annotations

import logging
import sys

import click

from cutbench.errors import CutbenchError, Unavailable

from . import protocol as P

PROG = "python -m cutbench.receivers"


@click.command("serve")
@click.option("--store", required=True, metavar="URL",
              help="sqlite:PATH, or a PostgreSQL connection URI such as postgresql://USER:PASSWORD@HOST:5432/DB "
                   "(needs psycopg: pip install 'cutbench[pg]').")
@click.option("--listen", default="127.0.0.1:0", show_default=True, metavar="ADDR",
              help="HOST:PORT (PORT 0 picks a free one) or unix:PATH.")
@click.option("--token", envvar=P.TOKEN_ENV, show_envvar=True, default=None, metavar="SECRET",
              help="Shared secret every client must present in its hello.")
@click.option("--allow-remote", is_flag=True, help="Permit a non-loopback address (needs --token).")
@click.option("--ready-file", type=click.Path(dir_okay=False), default=None,
              help="File to write the actual address to once listening.")
@click.option("--max-frame", type=click.IntRange(P.MIN_FRAME, 1 << 30), default=P.MAX_FRAME, show_default=True,
              metavar="BYTES", help="Largest frame body accepted from clients and sent to them.")
@click.option("--exit-with", "exit_with", type=click.IntRange(1), default=None, metavar="PID",
              help="Shut down cleanly (as on SIGTERM) once process PID is gone: the harness that started it.")
def serve_command(store: str, listen: str, token: str | None, allow_remote: bool, ready_file: str | None,
                  max_frame: int, exit_with: int | None) -> None:
    """Run the receiver service in the foreground until SIGTERM or SIGINT (or --exit-with's process ends)."""
    from .server import serve

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s receiver[%(process)d] %(levelname)s %(message)s")
    if exit_with is not None:
        _exit_with(exit_with)
    try:
        serve(store, listen, token=token, allow_remote=allow_remote, ready_file=ready_file, max_frame=max_frame)
    except OSError as exc:
        raise Unavailable(f"cannot listen on {listen}: {exc}") from None


def _exit_with(pid: int) -> None:
    """Send this process SIGTERM (the clean shutdown) once ``pid`` is gone, checked every second.

    A harness killed outright (SIGKILL, a lost machine) cannot stop its
    receiver; without this the receiver would outlive it, holding its port
    and store. A zombie counts as gone: a harness whose parent does not reap
    it (a subreaper that waits only for its own) is dead all the same.
    """
    import os
    import signal
    import threading
    import time

    from cutbench.procs import is_zombie_or_gone

    def watch() -> None:
        while not is_zombie_or_gone(pid):
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with", daemon=True).start()


@click.group(PROG)
def _commands() -> None:
    """The cutbench receiver service."""


_commands.add_command(serve_command)


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m cutbench.receivers serve --store URL ...``; returns the exit code (2: bad arguments)."""
    try:
        _commands.main(args=argv, prog_name=PROG, standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return 2
    except click.exceptions.Abort:
        return 130
    except CutbenchError as exc:
        print(f"receiver: error: {exc}", file=sys.stderr)
        return 2
    return 0

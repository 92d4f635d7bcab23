"""What the command line shows on the terminal: the console, plain lines, errors, a run's progress, the exit code
of an interrupted command. Shared by :mod:`~cutbench.harness.integrations.cli` and the commands it gathers.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.text import Text

from cutbench.errors import EXIT_BAD_ARGUMENTS, EXIT_INTERRUPTED, EXIT_SIGNAL_BASE

console = Console(stderr=True, soft_wrap=True)
# The signal that interrupted the run (SIGINT, SIGTERM or SIGHUP): the exit code is 128 + its number,
# as a shell reports a process a signal stopped (130, 143, 129).
INTERRUPTED_BY = [0]


def interrupted_code() -> int:
    """Return the exit code of an interrupted command: 128 + the signal (130 for Ctrl-C)."""
    return EXIT_SIGNAL_BASE + INTERRUPTED_BY[0] if INTERRUPTED_BY[0] else EXIT_INTERRUPTED


def say(text: str, style: str | None = None) -> None:
    """Print ``text`` to the terminal as it is: never read as rich markup (user values and error
    messages contain square brackets: ``[plan]``, ``--set plan.source=[/x]``)."""
    console.print(text, style=style, markup=False, highlight=False)


def fail(message: str, code: int = EXIT_BAD_ARGUMENTS) -> None:
    console.print(Text.assemble(("error: ", "bold red"), message), highlight=False)
    sys.exit(code)



def progress_printer(as_json: bool):
    """A progress callback: a rich bar on a terminal, one line per trial otherwise."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    state: dict[str, Any] = {"invalid": 0, "progress": None, "task": None}

    def callback(result: Any, done: int, total: int) -> None:
        state["invalid"] += result.verdict.outcome == "invalid"
        if as_json:
            return
        if console.is_terminal:
            if state["progress"] is None:
                bar = state["progress"] = Progress(TextColumn("trials"), BarColumn(), MofNCompleteColumn(),
                                                   TextColumn("invalid trials {task.fields[invalid]}"), TextColumn("ETA"),
                                                   TimeRemainingColumn(), console=console, transient=True)
                bar.start()
                state["task"] = bar.add_task("run", total=total, invalid=0)
            state["progress"].update(state["task"], completed=done, invalid=state["invalid"])
            if done == total:
                state["progress"].stop()
        else:
            say(f"[{done}/{total}] {result.spec.trial_id} {result.spec.backend}/{result.spec.receiver_mode} "
                f"{result.spec.cut_plan().describe()} -> {result.verdict.outcome} "
                f"({len(result.verdict.findings)} findings) {result.record.error[:120]}")

    def stop() -> None:
        if state["progress"] is not None:
            state["progress"].stop()

    callback.stop = stop  # type: ignore[attr-defined]
    return callback

"""The error types cutbench raises at its boundaries.

One clear type per kind of failure, as Hypothesis does with ``InvalidArgument``:
callers catch these, and the CLI maps them to exit codes.
"""

from __future__ import annotations


class CutbenchError(Exception):
    """Base class of every error cutbench raises on purpose."""


class InvalidArgument(CutbenchError, ValueError):
    """Bad user input: a scenario field, a CLI option, a plan, a message.

    The message names the field, the bad value and what is allowed. The CLI
    turns it into exit code 254 without a traceback.
    """


class Unavailable(CutbenchError):
    """A component cutbench needs is missing or unusable (CRIU, a GPU, a backend).

    The message says what is missing and how to fix it.
    """


class StageRefused(CutbenchError):
    """A checkpoint stage declined cleanly and the workload went on (a safe outcome)."""

    def __init__(self, stage: str, reason: str):
        super().__init__(f"{stage} refused: {reason}")
        self.stage = stage
        self.reason = reason


class StageFailed(CutbenchError):
    """A stage the checkpoint tool owns failed and took the application with it.

    The process died, was left unusable, or its checkpoint could not be
    brought back: the trial's status is ``lost`` and the oracle reports
    ``process_lost`` (invalid: for a scheduler that preempted the job, this is
    lost work). Raise :class:`StageRefused` instead when the tool declined and
    the application went on, and :class:`HarnessFault` when the harness
    itself could not carry the stage out.
    """

    def __init__(self, stage: str, reason: str):
        super().__init__(f"{stage} failed: {reason}")
        self.stage = stage
        self.reason = reason


class HarnessFault(StageFailed):
    """The harness could not carry a stage out (its own bookkeeping or a precondition it owns).

    Cleaned up like :class:`StageFailed`, but no verdict is possible: the
    trial is ``unknown``, never counted for or against the tool.
    """


# How a stage that never returned is worded (a driver call, the utility or CRIU past its time limit): the
# support matrix reads a failure with these words as "hung", not as an ordinary failure.
HUNG_MARK = "did not return within"


def hung_reason(what: str, seconds: float) -> str:
    """The reason of a stage whose call ``what`` was still running after ``seconds`` (see :data:`HUNG_MARK`)."""
    return f"{what} {HUNG_MARK} {seconds:g} s (still running when the harness gave up on it)"


# CLI exit codes (DESIGN.md, Results; README, "Commands and exit codes"): the one definition.
EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_UNKNOWN_ONLY = 2
EXIT_NOT_REPRODUCED = 3  # `cutbench replay`: the rerun's verdict differs from the stored one
EXIT_BAD_ARGUMENTS = 254
EXIT_INTERNAL = 255
# A command that judges no run ended well: it did what was asked, or the check it was asked to make passed.
EXIT_OK = 0
# A check a command was asked to make failed: `analyze` (a verdict differs), `compare --fail-on-regression`,
# `matrix --fail-on-wrong`, `doctor` (a problem found). The same number as EXIT_INVALID, named for what it says.
EXIT_CHECK_FAILED = 1
# Interrupted by a signal: 128 + its number, as a shell reports it (SIGINT 130, SIGTERM 143, SIGHUP 129).
EXIT_SIGNAL_BASE = 128
EXIT_INTERRUPTED = EXIT_SIGNAL_BASE + 2  # SIGINT (Ctrl-C): a partial run, stored and marked partial

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
    """A checkpoint stage failed so that no verdict is possible (trial outcome ``unknown``)."""

    def __init__(self, stage: str, reason: str):
        super().__init__(f"{stage} failed: {reason}")
        self.stage = stage
        self.reason = reason


# CLI exit codes (DESIGN.md, Results).
EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_UNKNOWN_ONLY = 2
EXIT_BAD_ARGUMENTS = 254
EXIT_INTERNAL = 255

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


class WorkloadError(InvalidArgument):
    """A workload name, import path or parameter set is not usable (a bad argument: exit 254)."""


class ReferenceMismatch(WorkloadError):
    """A recorded reference that does not belong to the workload, parameters or machine it is asked for."""


class ArrayBackendUnavailable(Unavailable, ValueError):
    """An array backend that was asked for cannot run here (library or device missing).

    A ``ValueError`` too, so callers that probe a backend with ``except ValueError`` keep working.
    """


class ArrayTypeError(CutbenchError, TypeError):
    """A helper got an array (or namespace) of a library it does not know."""


class ProtocolError(CutbenchError):
    """A receiver message that cannot be served; the receiver answers it with an ``error`` reply with ``code``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class FramingError(ProtocolError):
    """The receiver's byte stream can no longer be split into frames: the connection must close."""


class ReceiverUnavailable(Unavailable):
    """The receiver could not be reached, or did not answer, within the timeout."""


class ReceiverError(CutbenchError):
    """The receiver answered with an ``error`` reply (``code``, ``message``); retrying will not help."""

    def __init__(self, code: str, message: str, reply: dict | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reply = reply or {}

    @classmethod
    def from_reply(cls, reply: dict) -> "ReceiverError":
        """The error an ``error`` reply stands for."""
        return cls(reply.get("code", "?"), reply.get("message", ""), reply)


class CudaCallError(CutbenchError):
    """A CUDA checkpoint call returned an error (or could not be made).

    ``str()`` is ``<call>(pid <pid>) -> <name>: <meaning>[; driver says: <text>]``. Made by
    :func:`cutbench.harness.nemesis.backends.cuda_driver.call_error`, which names the code and says what it
    means from the driver's table of results.
    """

    def __init__(self, call: str, pid: int, code: int, name: str, meaning: str, text: str = ""):
        self.call, self.pid, self.code = call, pid, code
        self.name, self.meaning, self.text = name, meaning, text
        super().__init__(str(self))

    def __str__(self) -> str:
        extra = f"; driver says: {self.text}" if self.text and self.text not in self.meaning else ""
        return f"{self.call}(pid {self.pid}) -> {self.name}: {self.meaning}{extra}"


class RemapRefused(StageRefused):
    """The driver rejected a GPU remap; the workload was restored on its own GPU instead (``resumed_pid``)."""

    def __init__(self, reason: str, resumed_pid: int):
        super().__init__("cuda_restore", reason)
        self.resumed_pid = resumed_pid


class ReceiverLost(Unavailable):
    """The run's receiver died and could not be started again on its store: the run stops (its finished trials
    are stored; ``--resume`` runs the rest)."""


class NoAnswer(CutbenchError):
    """A workload's adapters gave no usable answer to one request (the message says why)."""


class GateFailed(CutbenchError):
    """A gate did not pass; its text is the gate's message (with replay commands)."""


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

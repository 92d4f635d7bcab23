"""A Ctrl-C sent to a thread waits for its shielded cleanup, and is never lost or doubled (cutbench.interrupts)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from cutbench import interrupts


def _in_thread(body) -> tuple[threading.Thread, dict]:
    """``body(seen)`` in a thread; ``seen`` gets "raised" (the exception it ended with) and what body records.

    ``seen["ready"]`` is set by the body where the test may interrupt it; ``seen["sent"]`` is set by the test once
    the interrupt is sent, so each body waits for it where it means to be interrupted (no timing assumed)."""
    seen: dict = {"ready": threading.Event(), "sent": threading.Event()}

    def run() -> None:
        try:
            body(seen)
        except BaseException as exc:  # noqa: BLE001 - what reached the top is what the test asserts
            seen["raised"] = exc
        finally:
            seen["counted"] = interrupts._depth.get(threading.get_ident(), 0)
            seen["held"] = threading.get_ident() in interrupts._held

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, seen


def _interrupt_when_ready(thread: threading.Thread, seen: dict) -> None:
    assert seen["ready"].wait(5)
    interrupts.interrupt(thread.ident)
    seen["sent"].set()
    thread.join(10)
    assert not thread.is_alive()


def _until_sent(seen: dict) -> None:
    """Run Python code (an interrupt lands only there) until the test has sent the interrupt, and a moment more."""
    while not seen["sent"].is_set():
        time.sleep(0.001)
    end = time.monotonic() + 0.05
    while time.monotonic() < end:
        pass


def _spin(seconds: float) -> None:
    """Run Python code for ``seconds`` (a signal's handler runs only between bytecodes)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_an_interrupt_outside_a_shield_stops_the_thread_at_once():
    def body(seen):
        seen["ready"].set()
        _until_sent(seen)
        time.sleep(5)
        seen["finished"] = True

    thread, seen = _in_thread(body)
    _interrupt_when_ready(thread, seen)
    assert isinstance(seen.get("raised"), KeyboardInterrupt) and "finished" not in seen


def test_an_interrupt_inside_a_shield_is_raised_when_its_outermost_shield_ends():
    def body(seen):
        with interrupts.shielded():
            with interrupts.shielded():
                seen["ready"].set()
                _until_sent(seen)
                seen["inner done"] = True
            seen["cleanup done"] = True  # the inner shield's end is not the outermost: still held
        seen["after"] = True

    thread, seen = _in_thread(body)
    _interrupt_when_ready(thread, seen)
    assert seen.get("inner done") and seen.get("cleanup done")
    assert isinstance(seen.get("raised"), KeyboardInterrupt) and "after" not in seen
    assert seen["counted"] == 0 and not seen["held"]  # nothing left counted for the thread


def test_the_shield_before_a_try_runs_the_whole_cleanup_after_an_interrupt_in_the_body():
    def body(seen):
        with interrupts.shielded():
            try:
                with interrupts.interruptible():
                    seen["ready"].set()
                    _until_sent(seen)
                    time.sleep(5)
                    seen["body done"] = True
            finally:
                seen["cleaning"] = True
                _until_sent(seen)
                seen["cleaned"] = True

    thread, seen = _in_thread(body)
    _interrupt_when_ready(thread, seen)
    assert "body done" not in seen and seen.get("cleaned")
    assert isinstance(seen.get("raised"), KeyboardInterrupt) and seen["counted"] == 0 and not seen["held"]


def test_an_interrupt_held_before_the_window_opens_is_raised_as_it_opens():
    def body(seen):
        with interrupts.shielded():
            seen["ready"].set()
            _until_sent(seen)  # held: the window is not open yet
            seen["before the window"] = True
            try:
                with interrupts.interruptible():
                    seen["in the window"] = True
            finally:
                seen["cleaned"] = True

    thread, seen = _in_thread(body)
    _interrupt_when_ready(thread, seen)
    assert seen.get("before the window") and "in the window" not in seen and seen.get("cleaned")
    assert isinstance(seen.get("raised"), KeyboardInterrupt) and seen["counted"] == 0 and not seen["held"]


def test_a_held_interrupt_is_chained_to_what_the_block_raised():
    def body(seen):
        with interrupts.shielded():
            seen["ready"].set()
            _until_sent(seen)
            raise ValueError("the cleanup's own failure")

    thread, seen = _in_thread(body)
    _interrupt_when_ready(thread, seen)
    raised = seen.get("raised")
    assert isinstance(raised, KeyboardInterrupt) and isinstance(raised.__context__, ValueError)


def test_a_block_unwinding_the_interrupt_is_not_given_a_second_one():
    """A finally that runs under a shield while the interrupt it came from unwinds, then another is sent."""
    second = threading.Event()

    def body(seen):
        try:
            seen["ready"].set()
            _until_sent(seen)
            time.sleep(5)
        finally:
            with interrupts.shielded():
                seen["cleaning"] = True
                second.wait(5)
                seen["cleaned"] = True

    thread, seen = _in_thread(body)
    assert seen["ready"].wait(5)
    interrupts.interrupt(thread.ident)
    seen["sent"].set()
    deadline = time.monotonic() + 5
    while "cleaning" not in seen and time.monotonic() < deadline:
        time.sleep(0.005)
    interrupts.interrupt(thread.ident)  # a sender that does not keep its once: held, and dropped at the end
    second.set()
    thread.join(10)
    assert seen.get("cleaned") and isinstance(seen.get("raised"), KeyboardInterrupt)
    assert seen["raised"].__context__ is None
    assert seen["counted"] == 0 and not seen["held"]


def test_a_signal_handler_in_the_main_thread_holds_its_interrupt_inside_a_shield():
    def handler(signum, frame):
        interrupts.raise_here()

    previous = signal.signal(signal.SIGUSR1, handler)
    done = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts.shielded():
                signal.raise_signal(signal.SIGUSR1)
                done.append("cleanup")
        assert done == ["cleanup"]
        with pytest.raises(KeyboardInterrupt):  # outside a shield: at once
            signal.raise_signal(signal.SIGUSR1)
            _spin(0.5)
            done.append("never")
        assert done == ["cleanup"]
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.fixture
def sigint(request):
    """SIGINT's handler set to ``request.param`` for the test (Python's default, or ignored: a shell starts a
    background job with SIGINT ignored, and the test runner inherits that), and put back after."""
    previous = signal.signal(signal.SIGINT, request.param)
    try:
        yield request.param
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("sigint", [signal.default_int_handler], indirect=True)
def test_a_run_from_code_takes_the_first_ctrl_c_only_and_puts_the_default_handler_back(sigint, capsys):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.from_code():
            with interrupts.shielded():
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGINT)  # pressed again during the cleanup: said, and it waits for it
                _spin(0.05)
                done.append("cleanup")
            done.append("never")
    assert done == ["cleanup"] and "cleaning up" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("sigint", [signal.SIG_IGN], indirect=True)
def test_a_run_from_code_whose_caller_ignores_sigint_goes_on_through_a_ctrl_c(sigint):
    # The caller's choice stands (a job a shell started in the background): the run is not stopped, and SIGINT is
    # still ignored after it.
    done = []
    with interrupts.from_code():
        signal.raise_signal(signal.SIGINT)
        _spin(0.05)
        done.append("ran on")
    assert done == ["ran on"] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_handler_of_the_callers_own_is_left_alone():
    def own(signum, frame):
        calls.append(signum)

    calls: list[int] = []
    previous = signal.signal(signal.SIGINT, own)
    try:
        with interrupts.from_code():
            signal.raise_signal(signal.SIGINT)
            _spin(0.05)
        assert calls == [signal.SIGINT] and signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_window_inside_another_shield_lets_nothing_in_until_that_shield_ends():
    """A tool's wait (a shield with its window) inside a restore (a shield of its own) inside a trial's window:
    the interrupt waits for the restore to end, and every cleanup runs whole."""

    def body(seen):
        with interrupts.shielded():  # the trial's
            try:
                with interrupts.interruptible():
                    with interrupts.shielded():  # the restore's
                        with interrupts.shielded():  # the tool's wait
                            try:
                                with interrupts.interruptible():
                                    seen["ready"].set()
                                    _until_sent(seen)
                                    seen["tool done"] = True
                            finally:
                                seen["tool reaped"] = True
                        seen["restore done"] = True
                    seen["never"] = True
            finally:
                seen["trial cleaned"] = True

    thread, seen = _in_thread(body)
    _interrupt_when_ready(thread, seen)
    assert seen.get("tool done") and seen.get("tool reaped") and seen.get("restore done") and seen.get("trial cleaned")
    assert "never" not in seen and isinstance(seen.get("raised"), KeyboardInterrupt)
    assert seen["counted"] == 0 and not seen["held"]

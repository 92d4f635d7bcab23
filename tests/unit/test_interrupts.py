"""A Ctrl-C sent to a thread waits for its shielded cleanup, and is never lost or doubled (cutbench.interrupts)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from cutbench import interrupts


def _in_thread(body) -> tuple[threading.Thread, dict]:
    """``body(seen)`` in a thread; ``seen`` gets "raised" (the exception it ended with) and what body records."""
    seen: dict = {"started": threading.Event()}

    def run() -> None:
        try:
            body(seen)
        except BaseException as exc:  # noqa: BLE001 - what reached the top is what the test asserts
            seen["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert seen["started"].wait(5)
    return thread, seen


def _spin(seconds: float) -> None:
    """Run Python code (an interrupt lands only there) for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_an_interrupt_outside_a_shield_stops_the_thread_at_once():
    def body(seen):
        seen["started"].set()
        _spin(5)
        seen["finished"] = True

    thread, seen = _in_thread(body)
    interrupts.interrupt(thread.ident)
    thread.join(5)
    assert isinstance(seen.get("raised"), KeyboardInterrupt) and "finished" not in seen


def test_an_interrupt_inside_a_shield_is_raised_when_its_outermost_shield_ends():
    def body(seen):
        with interrupts.shielded():
            with interrupts.shielded():
                seen["started"].set()
                _spin(0.3)
                seen["inner done"] = True
            _spin(0.1)
            seen["cleanup done"] = True  # the inner shield's end is not the outermost: still held
        seen["after"] = True

    thread, seen = _in_thread(body)
    interrupts.interrupt(thread.ident)
    thread.join(5)
    assert seen.get("inner done") and seen.get("cleanup done")
    assert isinstance(seen.get("raised"), KeyboardInterrupt) and "after" not in seen
    assert not interrupts._depth and not interrupts._held  # nothing left counted for the thread


def test_a_held_interrupt_is_chained_to_what_the_block_raised():
    def body(seen):
        with interrupts.shielded():
            seen["started"].set()
            _spin(0.2)
            raise ValueError("the cleanup's own failure")

    thread, seen = _in_thread(body)
    interrupts.interrupt(thread.ident)
    thread.join(5)
    raised = seen.get("raised")
    assert isinstance(raised, KeyboardInterrupt) and isinstance(raised.__context__, ValueError)


def test_a_block_unwinding_the_interrupt_is_not_given_a_second_one():
    """A finally that runs under a shield while the interrupt it came from unwinds, then another is sent."""

    def body(seen):
        try:
            seen["started"].set()
            _spin(5)
        finally:
            with interrupts.shielded():
                seen["cleaning"] = True
                _spin(0.3)
                seen["cleaned"] = True

    thread, seen = _in_thread(body)
    interrupts.interrupt(thread.ident)
    deadline = time.monotonic() + 5
    while "cleaning" not in seen and time.monotonic() < deadline:
        time.sleep(0.005)
    interrupts.interrupt(thread.ident)  # a sender that does not keep its once: held, and dropped at the end
    thread.join(5)
    assert seen.get("cleaned") and isinstance(seen.get("raised"), KeyboardInterrupt)
    assert seen["raised"].__context__ is None
    assert not interrupts._depth and not interrupts._held


def test_a_signal_handler_in_the_main_thread_holds_its_interrupt_inside_a_shield():
    def handler(signum, frame):
        interrupts.raise_here()

    previous = signal.signal(signal.SIGUSR1, handler)
    done = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts.shielded():
                signal.raise_signal(signal.SIGUSR1)
                _spin(0.05)
                done.append("cleanup")
        assert done == ["cleanup"]
        with pytest.raises(KeyboardInterrupt):  # outside a shield: at once
            signal.raise_signal(signal.SIGUSR1)
            _spin(0.5)
            done.append("never")
        assert done == ["cleanup"]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_run_from_code_takes_the_first_ctrl_c_only_and_puts_the_default_handler_back():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.from_code():
            with interrupts.shielded():
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGINT)  # pressed again during the cleanup: waits for it
                _spin(0.05)
                done.append("cleanup")
            done.append("never")
    assert done == ["cleanup"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


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

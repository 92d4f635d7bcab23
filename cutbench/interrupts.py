"""Ctrl-C in a thread of the harness, never inside the code that cleans up after it.

A run stops on the first Ctrl-C, SIGTERM or SIGHUP by raising
``KeyboardInterrupt``: in the main thread from the signal handler
(:func:`raise_here`), in each worker thread of a parallel run from the thread
that caught it (:func:`interrupt`, an asynchronous exception: the only way to
reach a thread running a polling loop). Either lands at whatever bytecode the
thread runs next, and two places must never take it:

- a ``finally`` that removes a trial's processes, image directory or the
  tool's leftovers: cut short there, it leaves them behind;
- the instants between ``Popen`` forking a tool and the code that kills that
  tool on the way out: the exception would leave a process no one has a
  handle on.

Such code runs under :func:`shielded`: an interrupt that comes meanwhile is
held and raised when the outermost shield of that thread ends, so the cleanup
runs to its end and the interrupt still stops the trial. A block with a
cleanup enters the shield *before* its ``try`` and lets the interrupt in only
around its body (:class:`interruptible`), so no instant between the body's
end and the cleanup's start can take it::

    with shielded():
        try:
            with interruptible():
                ...  # the work
        finally:
            ...  # the cleanup, whole

Each thread is interrupted at most once (the senders see to it), so a held
interrupt is one. Only this module's interrupts are held: another
asynchronous exception (a test runner's timeout from its signal handler)
may land anywhere, and may leave a thread's count behind.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

_lock = threading.Lock()
_depth: dict[int, int] = {}  # thread ident -> how many shields it is inside
_held: set[int] = set()  # threads whose interrupt came inside a shield


def interrupt(ident: int) -> None:
    """Raise ``KeyboardInterrupt`` in the thread ``ident`` now, or when its outermost shield ends; returns None."""
    with _lock:
        if _depth.get(ident):
            _held.add(ident)
        else:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))


def raise_here() -> None:
    """For a signal handler (it runs in the main thread): raise ``KeyboardInterrupt`` now, or hold it until the
    main thread's outermost shield ends; returns None when held."""
    # No lock: the handler runs between two bytecodes of the very thread that may hold it (it would deadlock);
    # the main thread's own entries are the only writers of its depth.
    me = threading.get_ident()
    if _depth.get(me):
        _held.add(me)
        return
    raise KeyboardInterrupt


class shielded:
    """A context manager: ``with shielded():`` holds this thread's interrupt while the block runs, and raises it when the
    outermost shield ends.

    An interrupt sent before the shield is entered fires as ``__enter__``
    starts, outside the shield (the depth is not yet counted); one that comes
    inside is raised at the end, after the block, chained to whatever the
    block raised. A block that raised a ``KeyboardInterrupt``, or runs in the
    ``finally`` or ``except`` of one, keeps it: there is only one.
    """

    def __enter__(self) -> None:
        me = threading.get_ident()
        with _lock:
            # An interrupt sent before fires at a call here (``get_ident``, ``get``), before the depth is stored:
            # outside the shield. None is sent while the lock is held, and none lands after the store.
            _depth[me] = _depth.get(me, 0) + 1

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        me = threading.get_ident()
        with _lock:
            depth = _depth.get(me, 1) - 1
            if depth:
                _depth[me] = depth
                return
            _depth.pop(me, None)
            held = me in _held
            _held.discard(me)
        # The block, or the ``finally``/``except`` it runs in, may be unwinding an interrupt already: the same one.
        if held and not isinstance(value or sys.exception(), KeyboardInterrupt):
            raise KeyboardInterrupt


class interruptible:
    """A context manager: ``with interruptible():`` right inside its own shield lets this thread's interrupt in while the block runs:
    one held until then is raised as the block starts (the shield still counted, so its cleanup is shielded), one
    sent meanwhile lands in it. The shield counts again after it; an interrupt that lands as it ends is the
    thread's one, raised before the cleanup starts. Inside another shield as well (a tool's wait within a
    restore, which runs to its end) it lets nothing in: the outer shield holds the interrupt."""

    def __enter__(self) -> None:
        me = threading.get_ident()
        self._saved = 0
        with _lock:
            if _depth.get(me) != 1:
                return
            held = me in _held
            if held:
                _held.discard(me)
            else:
                self._saved = _depth.pop(me)
        if held:
            raise KeyboardInterrupt

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        me = threading.get_ident()
        with _lock:
            if self._saved:
                _depth[me] = _depth.get(me, 0) + self._saved


CLEANING_UP = "interrupted: cleaning up and saving the partial run, please wait"


def first_raises(again: Callable[[int], None], first: Callable[[int], None] | None = None) -> Callable[[int, Any], None]:
    """A signal handler whose first signal calls ``first(signum)`` and raises ``KeyboardInterrupt`` through
    :func:`raise_here`, and whose later ones only call ``again(signum)``: a second one landing inside the
    cleanup the first began would leave a workload, the receiver or an image directory behind."""
    pressed: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        pressed.append(signum)
        if len(pressed) > 1:
            again(signum)
            return
        if first is not None:
            first(signum)
        raise_here()

    return handler


@contextmanager
def from_code() -> Iterator[None]:
    """While a run started from code (``cutbench.run``, a pytest gate) goes on: the first Ctrl-C raises
    ``KeyboardInterrupt`` through :func:`raise_here`, held out of cleanups; a later one says that the cleanup
    goes on, and waits for it (as the command line's does).

    Only where SIGINT still has Python's default handler, in the main thread: the command line and the Ray
    trial worker install their own, and a program's own handler is its business. The handler is put back after.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, first_raises(again=lambda _signum: print(f"cutbench: {CLEANING_UP}", file=sys.stderr)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)

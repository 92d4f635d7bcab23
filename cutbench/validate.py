"""Argument checks at cutbench's boundaries, one place for all of them.

Each check names the argument (``where``: a scenario field such as
``pipeline.faults``, a parameter, a protocol field), says what was expected
and what was given, and returns the value so a caller can check and assign in
one line. They raise :class:`~cutbench.errors.InvalidArgument` unless the
caller passes ``error``: a function from the message to the exception its
boundary raises (a workload's ``WorkloadError``, the receiver's
``ProtocolError``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from cutbench.errors import InvalidArgument

Error = Callable[[str], Exception]


def _names(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def check_type(where: str, value: Any, types: type | tuple[type, ...], *, error: Error = InvalidArgument) -> Any:
    """Return ``value`` if it is an instance of ``types`` (a bool is not an int unless ``bool`` is listed)."""
    types_t = types if isinstance(types, tuple) else (types,)
    if (isinstance(value, bool) and bool not in types_t) or not isinstance(value, types_t):
        raise error(f"{where} = {value!r}: expected {_names(types_t)}")
    return value


def check_choice(where: str, value: Any, allowed: Iterable[Any], *, error: Error = InvalidArgument) -> Any:
    """Return ``value`` if it is one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise error(f"{where} = {value!r}: allowed {', '.join(map(str, allowed))}")
    return value


def check_choices(where: str, values: Iterable[Any], allowed: Iterable[Any], *, error: Error = InvalidArgument) -> list[Any]:
    """Return ``values`` without repeats, if non-empty and each one of ``allowed``."""
    values, allowed = list(values), tuple(allowed)
    if not values:
        raise error(f"{where} is empty: give at least one of {', '.join(map(str, allowed))}")
    for v in values:
        if v not in allowed:
            raise error(f"{where} contains {v!r}: allowed {', '.join(map(str, allowed))}")
    return list(dict.fromkeys(values))


def check_range(where: str, value: Any, low: int | float | None = None, high: int | float | None = None, *,
                error: Error = InvalidArgument) -> Any:
    """Return ``value`` if it is a number (not a bool) with ``low <= value <= high`` (a None bound is open)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{where} = {value!r}: expected a number")
    if (low is not None and value < low) or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"<= {high}" if low is None else f"in {low}..{high}"
        raise error(f"{where} = {value!r}: must be {bound}")
    return value


def check_int(where: str, value: Any, low: int | None = None, high: int | None = None, *, error: Error = InvalidArgument) -> int:
    """Return ``value`` if it is an int (not a bool) within ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{where} = {value!r:.80}: expected an integer")
    return check_range(where, value, low, high, error=error)


def check_positive(where: str, value: Any, *, error: Error = InvalidArgument) -> Any:
    """Return ``value`` if it is a number > 0."""
    check_range(where, value, error=error)
    if not value > 0:
        raise error(f"{where} = {value!r}: must be > 0")
    return value


def check_numbers(where: str, value: Any, *, error: Error = InvalidArgument) -> tuple[float, ...]:
    """A number or a non-empty list of numbers, each >= 0, as a tuple of floats."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise error(f"{where} is empty: give at least one number >= 0")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise error(f"{where} contains {v!r}: expected numbers >= 0")
    return tuple(float(v) for v in values)


def check_text(where: str, value: Any, *, max_len: int, allow_empty: bool = False, error: Error = InvalidArgument) -> str:
    """Return ``value`` if it is a string of ``(0 if allow_empty else 1)..max_len`` characters."""
    low = 0 if allow_empty else 1
    if not isinstance(value, str) or len(value) < low or len(value) > max_len:
        raise error(f"{where} must be a string of {low}..{max_len} characters, got {value!r:.80}")
    return value


def check_option_lists(where: str, value: Any, reserved: Iterable[str] = (), *,
                       error: Error = InvalidArgument) -> tuple[tuple[str, ...], ...]:
    """A tool's command-line options: one list (``["--file-locks"]``) or a non-empty list of such lists
    (``[[], ["--file-locks"]]``, one arm each), each option ``--name`` or ``--name=value`` and none of
    ``reserved`` (what the caller sets itself); returned as a tuple of tuples, repeats dropped."""
    fix = 'write each as "--name" or "--name=value", e.g. [[], ["--file-locks"]]'
    if not isinstance(value, list):
        raise error(f"{where} = {value!r:.80}: expected a list of options, or a list of such lists (one arm each); {fix}")
    lists = value if value and all(isinstance(v, list) for v in value) else [value]  # [] is one arm without any
    reserved = tuple(reserved)
    for options in lists:
        for option in options:
            name = option.split("=", 1)[0] if isinstance(option, str) else ""
            if not name.startswith("--") or len(name) < 3 or not all(c.isalnum() or c == "-" for c in name[2:]):
                raise error(f"{where} contains {option!r:.80}: {fix}")
            if name in reserved:
                raise error(f"{where} contains {option!r:.80}: cutbench sets {name} itself, as each cut needs it "
                            f"(docs/criu.md); leave it out")
    return tuple(dict.fromkeys(tuple(options) for options in lists))
